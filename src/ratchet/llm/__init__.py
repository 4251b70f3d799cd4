"""LLM calls on Ratchet: the official SDKs' clients, and a local provider to test them against."""
