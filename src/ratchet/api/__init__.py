"""The HTTP API's routes (FastAPI), one module per resource; :mod:`ratchet.server` puts them
and the dashboard on one app. Needs the server extra."""

from __future__ import annotations

from ratchet.extras import require

require("ratchet server", "server")
