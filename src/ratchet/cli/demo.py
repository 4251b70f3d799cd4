"""``ratchet demo``: a worker killed in the middle of a run, and a new one finishing it
(see :mod:`ratchet.demo`)."""

from __future__ import annotations

from typing import Annotated

import typer

from ratchet.cli._common import errors, given_db, make_console
from ratchet.extras import require


def demo(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Database URL; default sqlite:///.ratchet/demo.db, or "
            ".ratchet/server.db with --serve (wiped first).",
        ),
    ] = None,
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Play it through ratchet server (the HTTP API, one embedded worker), "
            "then keep serving until Ctrl-C: what make run does.",
        ),
    ] = False,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="With --serve: the interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            metavar="PORT",
            envvar="RATCHET_PORT",
            help="With --serve: the port (0: any free one).",
        ),
    ] = 8000,
) -> None:
    """Kill a worker in the middle of a run and watch a new one finish it.

    A 6-step workflow runs in a worker process, which is killed with SIGKILL in the middle
    of step 4, a model call to a local provider; a new worker process finishes the run
    without running steps 1-3 again or being billed twice for the model call. With
    --serve the run is started and followed through the HTTP API, which stays up across
    the kill, and prints a token and curl lines to watch it and start more.
    """
    with errors():
        # The workers' model call goes through the openai SDK to the local provider.
        require("ratchet demo", "openai", "server")
        if serve:
            from ratchet.demo.served import serve_demo

            code = serve_demo(given_db(ctx, db), host, port, make_console())
        else:
            from ratchet.demo.terminal import run_demo

            code = run_demo(given_db(ctx, db), make_console())
    raise typer.Exit(code)
