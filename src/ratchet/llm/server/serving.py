"""Running the local provider over real HTTP: in a background thread for tests and benches
(:func:`serve`), or in the foreground until a signal (``ratchet llm-server``)."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

import uvicorn

from ratchet.llm.server.provider import LocalProvider

_STARTUP_TIMEOUT_S = 30.0
# Requests still in flight at shutdown (a slow fault) get this long before they are cut.
_GRACEFUL_SHUTDOWN_S = 2
# Longer than the SDKs' pool keeps an idle connection (httpx: 5 s), so it is always the
# client that lets one go: a server closing it as a request goes out would fail that call.
_KEEP_ALIVE_S = 30


class _Server(uvicorn.Server):
    """uvicorn's server, telling another thread when it is ready or has failed."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: a free one, known before serving)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # The protocol is named: asyncio turns Nagle's algorithm off only on connections whose
    # socket says IPPROTO_TCP (a plain SOCK_STREAM says 0), and with it on, a response
    # written as headers then body waits for the client's delayed ACK, ~40 ms a request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def serve(provider: LocalProvider, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``provider`` with uvicorn in a background thread; yield its base URL once it
    accepts connections (an OpenAI client's ``base_url`` is that plus ``/v1``, an
    Anthropic client's is that). On exit the server stops and its thread is joined.

    Raises ``OSError`` when ``host:port`` cannot be listened on.
    """
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(provider.app, log_config=None, log_level="warning",
                            access_log=False, http="h11", ws="none", lifespan="off",
                            proxy_headers=False, server_header=False,
                            timeout_keep_alive=_KEEP_ALIVE_S,
                            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S)
    server = _Server(config)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # reported to the caller below
            failed.append(e)
        finally:
            server.ready.set()  # a server that could not start must not be waited for

    thread = threading.Thread(target=run, name=f"llm-server:{bound_port}", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(_STARTUP_TIMEOUT_S) or failed or not server.started:
            raise RuntimeError(f"the local provider did not start on {_url(host, bound_port)}"
                               + (f": {failed[0]!r}" if failed else ""))
        yield _url(host, bound_port)
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def run_until_signalled(provider: LocalProvider, host: str = "127.0.0.1", port: int = 8089,
                        out: TextIO | None = None) -> None:
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
