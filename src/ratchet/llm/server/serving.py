"""Running the local provider over real HTTP: in a background thread for tests and benches
(:func:`serve`), or in the foreground until a signal (``ratchet llm-server``)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import TextIO

from ratchet.llm.server.asgi import listen, serve_in_thread
from ratchet.llm.server.provider import LocalProvider

# Requests still in flight at shutdown (a slow fault) get this long before they are cut.
_GRACEFUL_SHUTDOWN_S = 2
# Longer than the SDKs' pool keeps an idle connection (httpx: 5 s), so it is always the
# client that lets one go: a server closing it as a request goes out would fail that call.
_KEEP_ALIVE_S = 30


@contextlib.contextmanager
def serve(provider: LocalProvider, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``provider`` with uvicorn in a background thread; yield its base URL once it
    accepts connections (an OpenAI client's ``base_url`` is that plus ``/v1``, an
    Anthropic client's is that). On exit the server stops and its thread is joined.

    Raises ``OSError`` when ``host:port`` cannot be listened on.
    """
    sock = listen(host, port)
    with serve_in_thread(
        provider.app,
        sock,
        "the local provider",
        log_config=None,
        log_level="warning",
        access_log=False,
        http="h11",
        ws="none",
        lifespan="off",
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=_KEEP_ALIVE_S,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S,
    ) as url:
        yield url


def run_until_signalled(
    provider: LocalProvider, host: str = "127.0.0.1", port: int = 8089, out: TextIO | None = None
) -> None:
    """Serve ``provider`` until SIGTERM or SIGINT, then stop cleanly.

    Prints ``llm-server listening on http://HOST:PORT`` (one line, flushed) once it
    accepts connections. Raises ``OSError`` when ``host:port`` cannot be listened on.
    """
    out = out or sys.stdout
    signals = {signal.SIGTERM, signal.SIGINT}
    # Blocked before the server thread starts (it inherits the mask), then waited for
    # here: a signal arriving at any point is taken by sigwait, none is lost.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        with serve(provider, host, port) as url:
            print(f"llm-server listening on {url}", file=out, flush=True)
            signal.sigwait(signals)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
