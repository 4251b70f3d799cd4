"""A real uvicorn serving ``ratchet server``'s app on a free port, in a thread of the test
process, for as long as a ``with`` block lasts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from waiting import wait_for

import ratchet
from ratchet.server import create_app


@contextmanager
def serving(app: ratchet.Ratchet, **options: Any) -> Iterator[str]:
    """Serve ``app``'s API (``create_app(app, **options)``) on 127.0.0.1, any free port;
    yield its base URL; shut it down gracefully at the end."""
    config = uvicorn.Config(
        create_app(app, **options),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), what="the server to start")
        assert thread.is_alive(), "the server thread died while starting"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"
