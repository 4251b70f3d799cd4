"""Adapters for libraries Ratchet runs under, each behind its own optional extra and
imported only when used (``ratchet.integrations.pydantic_ai`` needs
``ratchet-engine[pydantic-ai]``)."""
