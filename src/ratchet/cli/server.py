"""``ratchet server``: the HTTP API and N embedded workers in one process, served by
uvicorn until SIGTERM or Ctrl-C."""

from __future__ import annotations

import errno
import signal
import socket
from types import FrameType
from typing import Annotated

import typer

from ratchet.cli._common import DbOption, Fail, app_on_db, configure_logging, errors
from ratchet.config import parse_age, parse_duration


def server(
    ctx: typer.Context,
    app_spec: Annotated[
        str, typer.Option("--app", metavar="APP", help="The app, as module:attribute.")
    ],
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="Port (0: any free one).")
    ] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="Embedded workers driving runs in this process; 0 for an API-only node.",
        ),
    ] = 1,
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    prune_finished_before: Annotated[
        str | None,
        typer.Option(
            "--prune-finished-before",
            metavar="AGE",
            envvar="RATCHET_PRUNE_FINISHED_BEFORE",
            help="Prune, periodically, the journals of runs that finished longer ago than AGE "
            "(30d); their signed receipts stay. Off unless set.",
        ),
    ] = None,
    prune_interval: Annotated[
        str,
        typer.Option(
            "--prune-interval",
            metavar="DURATION",
            envvar="RATCHET_PRUNE_INTERVAL",
            help="How often to prune with --prune-finished-before.",
        ),
    ] = "1h",
    request_timeout: Annotated[
        str,
        typer.Option(
            "--request-timeout",
            metavar="DURATION",
            envvar="RATCHET_REQUEST_TIMEOUT",
            help="How long a client may take to send a request's head (from its connection "
            "opening), and then its body; past it the connection is closed (408).",
        ),
    ] = "10s",
    db: DbOption = None,
) -> None:
    """Serve APP's HTTP API (under /v1, bearer tokens from `ratchet tokens create`).

    SIGTERM or Ctrl-C stops taking requests, lets open ones finish, and hands the embedded
    workers' runs back to the queue."""
    configure_logging(log_level)
    with errors():
        from ratchet.extras import require

        require("ratchet server", "server")
        import uvicorn

        from ratchet.api.slow_clients import bounded_protocol
        from ratchet.llm.server.asgi import Server
        from ratchet.server import create_app, drain

        prune_age = parse_age(prune_finished_before) if prune_finished_before is not None else None
        prune_every = parse_duration(prune_interval)
        request_timeout_s = parse_duration(request_timeout)
        with app_on_db(ctx, app_spec, db) as app:
            # The port is taken before anything starts: uvicorn binds it only after the
            # app's startup, by when the embedded workers would have claimed and driven runs.
            sock = _listen(host, port)
            try:
                api = create_app(
                    app,
                    workers=workers,
                    prune_finished_before=prune_age,
                    prune_interval=prune_every,
                )
                # Access logs are off: they would print query strings, and tokens never
                # belong in a log (they travel in headers, but a client may misplace one).
                # The h11 protocol, bounded: a client that sends its request slowly, or
                # never finishes it, cannot hold a connection (see ratchet.api.slow_clients).
                config = uvicorn.Config(
                    api,
                    host=host,
                    port=sock.getsockname()[1],
                    log_level=log_level.lower(),
                    access_log=False,
                    lifespan="on",
                    timeout_graceful_shutdown=30,
                    http=bounded_protocol(request_timeout_s),
                )
                # uvicorn shuts down gracefully on SIGTERM, then raises the signal again
                # under the handler it found: with this one, a graceful stop ends the
                # command with status 0.
                signal.signal(signal.SIGTERM, _stopped)
                Server(config, on_shutdown=lambda: drain(api), announce=True).run(sockets=[sock])
            finally:
                sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, or a one-line failure (exit 1) saying why not."""
    from ratchet.llm.server.asgi import listen  # the server extra, checked by the caller

    try:
        return listen(host, port)
    except OSError as e:
        reason = (
            "the port is taken; choose another with --port"
            if e.errno == errno.EADDRINUSE
            else e.strerror or str(e)
        )
        raise Fail(f"cannot listen on {host}:{port}: {reason}", code=1) from e


def _stopped(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)
