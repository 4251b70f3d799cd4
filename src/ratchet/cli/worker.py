"""``ratchet worker APP``: drive APP's workflows until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer

from ratchet.app import Ratchet
from ratchet.cli._common import DbOption, Fail, configure_logging, errors, given_db, load_app
from ratchet.config import DatabaseURL, parse_duration
from ratchet.engine import faults
from ratchet.errors import ConfigError

log = logging.getLogger("ratchet.cli")


def _redact(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


async def _work(app: Ratchet, options: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(sig: signal.Signals) -> None:
        log.info("action=shutdown_requested signal=%s", sig.name)
        stop.set()
        # A second signal takes the default path: stop now, without handing runs back.
        for s in signals:
            loop.remove_signal_handler(s)

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        # app.run_worker, with the store also closed on this loop: what the store started
        # here (PostgreSQL's LISTEN task) cannot be stopped once asyncio.run has closed it.
        store = await asyncio.to_thread(lambda: app.store)
        try:
            await app.worker(**options).run(stop)
        finally:
            await store.close()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def worker(
    ctx: typer.Context,
    app_spec: Annotated[str, typer.Argument(metavar="APP", help="The app, as module:attribute.")],
    concurrency: Annotated[int, typer.Option(min=1, metavar="N", help="Runs driven at once.")] = 16,
    worker_id: Annotated[
        str | None,
        typer.Option(
            "--worker-id",
            metavar="ID",
            help="Keep it stable across restarts (e.g. a pod name) so a restarted "
            "worker reclaims its runs at once; default $RATCHET_WORKER_ID, "
            "else unique.",
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="QUEUE",
            help="A queue to take runs from (repeatable); default: default.",
        ),
    ] = None,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            metavar="DURATION",
            help="On SIGTERM, how long steps in flight may run on before they are interrupted "
            "(e.g. 10s, 500ms, 2m).",
        ),
    ] = "10s",
    log_level: Annotated[
        str, typer.Option(metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    db: DbOption = None,
) -> None:
    """Run a worker for APP's workflows until SIGTERM or Ctrl-C.

    On the first signal the worker stops taking runs and starts no new step; steps in
    flight get --grace to finish (then async steps are interrupted), and each run is handed
    back to the queue once its step has stopped. A second signal stops it at once.
    """
    configure_logging(log_level)
    with errors():
        faults.check()
        app = load_app(app_spec)
        url = given_db(ctx, db)
        if url is not None:
            DatabaseURL.parse(url)
            app.database_url = url
        if not app.workflows:
            log.warning("action=no_workflows app=%s", app_spec)
        try:
            grace_s = parse_duration(grace)
        except ConfigError as e:
            raise Fail(f"invalid --grace: {e}") from e
        options: dict[str, Any] = {
            "concurrency": concurrency,
            "grace": grace_s,
            "queues": tuple(queue or ("default",)),
        }
        if worker_id:
            options["worker_id"] = worker_id
        log.info(
            "action=worker_boot app=%s db=%s workflows=%s queues=%s pid=%s",
            app_spec,
            _redact(app.database_url),
            ",".join(sorted(app.workflows)) or "-",
            ",".join(options["queues"]),
            os.getpid(),
        )
        try:
            asyncio.run(_work(app, options))
        finally:
            app.shutdown()
