"""OpenAI request models: validation at the edge only; responses are built as dicts/bytes."""
