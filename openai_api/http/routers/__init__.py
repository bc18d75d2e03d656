"""One small router per endpoint; routers never touch Triton, only services."""
