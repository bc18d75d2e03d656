"""HTTP layer: routers, pure-ASGI middleware, request parsing and the error handlers."""
