"""``ratchet server``: the HTTP API (FastAPI) over a Ratchet app. Needs the server extra."""

from __future__ import annotations

from ratchet.extras import require

require("ratchet server", "server")

from ratchet.api.server import create_app, drain  # noqa: E402

__all__ = ["create_app", "drain"]
