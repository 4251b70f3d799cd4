"""An ASGI app served by uvicorn in a background thread of this process, on a socket
bound beforehand (so a taken port is an error before anything else starts, and port 0's
choice is known). The local model provider and ``ratchet demo --serve`` run this way, and
``ratchet server`` runs :class:`Server` in the foreground.

It lives here, with the local model provider, the lowest layer among its users: the demo
and the CLI import it downward. It imports nothing else of Ratchet's."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 30.0


class Server(uvicorn.Server):
    """uvicorn's server, telling another thread when it is ready or has failed, and
    calling ``on_shutdown`` on its loop as it starts to stop, before it waits for the
    requests still open (so that streams can end instead of being cut at the timeout).
    With ``announce``, it logs where it listens as uvicorn does (``Uvicorn running on
    URL``) on a socket bound beforehand too."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_shutdown: Callable[[], None] | None = None,
        announce: bool = False,
    ) -> None:
        super().__init__(config)
        self.ready = threading.Event()
        self.on_shutdown = on_shutdown
        self.announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.announce and sockets and self.started:
            # uvicorn says where it listens only on a socket it bound itself.
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on %s (Press CTRL+C to quit)", url_of(sockets[0])
            )
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: a free one, known before serving).
    Raises ``OSError`` when it cannot be had (``errno.EADDRINUSE``: the port is taken)."""
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


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    sock: socket.socket,
    what: str,
    on_shutdown: Callable[[], None] | None = None,
    **config: Any,
) -> Iterator[str]:
    """Serve ``app`` on ``sock`` (``uvicorn.Config`` options in ``config``) in a daemon
    thread; yield the base URL once it accepts connections; stop it (gracefully, within
    its ``timeout_graceful_shutdown``; see :class:`Server` for ``on_shutdown``) and close
    the socket on exit. ``what`` names the server in the error raised when it does not
    start."""
    server = Server(uvicorn.Config(app, **config), on_shutdown)
    failed: list[BaseException] = []
    url = url_of(sock)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # reported to the caller below
            failed.append(e)
        finally:
            server.ready.set()  # a server that could not start must not be waited for

    thread = threading.Thread(target=run, name=f"uvicorn:{url}", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(STARTUP_TIMEOUT_S) or failed or not server.started:
            raise RuntimeError(
                f"{what} did not start on {url}" + (f": {failed[0]!r}" if failed else "")
            )
        yield url
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
