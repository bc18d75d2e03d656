"""Text handling between OpenAI messages and model token streams: templates, tokenizers, stops."""
