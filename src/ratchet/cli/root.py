"""The ``ratchet`` command assembled: the root options (``--db``, ``--version``) and every
verb group's commands, registered here in the order ``ratchet --help`` lists them.

The verb modules define plain functions and sub-apps, and share only ``_common`` and
``_format``; none of them imports this module, so the package has no import cycle."""

from __future__ import annotations

from typing import Annotated

import typer

from ratchet.cli._common import DbOption, ReadableGroup
from ratchet.cli.acting import cancel, retry, signal_
from ratchet.cli.approvals import approvals, approve, reject
from ratchet.cli.delivery_receipts import receipts_cli
from ratchet.cli.demo import demo
from ratchet.cli.forking import diff, fork, resume
from ratchet.cli.graphs import graph_cli
from ratchet.cli.llm_server import llm_server
from ratchet.cli.queues import queues_cli
from ratchet.cli.retention import prune_cmd
from ratchet.cli.run_receipts import export, keys_cli, receipt, verify_cmd
from ratchet.cli.runs import dlq, events, runs, show
from ratchet.cli.sandboxes import sandboxes
from ratchet.cli.schedules import schedules_cli
from ratchet.cli.server import server
from ratchet.cli.start import start_cmd
from ratchet.cli.tokens import tokens_cli
from ratchet.cli.worker import worker

cli = typer.Typer(
    cls=ReadableGroup,
    name="ratchet",
    help="Ratchet: a durable execution engine for AI-agent workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if value:
        from ratchet import __version__

        typer.echo(f"ratchet {__version__}")
        raise typer.Exit()


@cli.callback()
def _root(
    ctx: typer.Context,
    db: DbOption = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Ratchet: a durable execution engine for AI-agent workflows."""
    ctx.obj = db


# A command's name is its function's, underscores as dashes, unless given.
cli.command()(worker)
cli.command()(runs)
cli.command()(show)
cli.command()(events)
cli.command()(dlq)
cli.command("signal")(signal_)
cli.command()(cancel)
cli.command()(retry)
cli.command()(fork)
cli.command()(resume)
cli.command()(diff)
cli.add_typer(receipts_cli, name="receipts")
cli.command()(demo)
cli.command("llm-server")(llm_server)
cli.command()(approvals)
cli.command()(approve)
cli.command()(reject)
cli.add_typer(graph_cli, name="graph")
cli.command("start")(start_cmd)
cli.add_typer(keys_cli, name="keys")
cli.command()(receipt)
cli.command()(export)
cli.command("verify")(verify_cmd)
cli.command("prune")(prune_cmd)
cli.command()(sandboxes)
cli.command()(server)
cli.add_typer(tokens_cli, name="tokens")
cli.add_typer(schedules_cli, name="schedules")
cli.add_typer(queues_cli, name="queues")


def main() -> None:
    """Entry point of the ``ratchet`` console script."""
    cli()
