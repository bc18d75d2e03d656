"""The APIs the gateway speaks (OpenAI's and Anthropic's), one module each, at the HTTP edge."""
