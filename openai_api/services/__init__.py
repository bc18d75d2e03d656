"""Services: OpenAI request types in, OpenAI response types (dicts or SSE bytes) out. No HTTP here."""
