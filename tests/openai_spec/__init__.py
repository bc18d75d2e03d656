"""OpenAI's OpenAPI description (vendored, MIT) and our validator for it; see README.md."""
