"""``ratchet llm-server``: the local model provider (see :mod:`ratchet.llm.server`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ratchet.cli._common import Fail, errors


def llm_server(
    host: Annotated[
        str, typer.Option(metavar="HOST", help="The interface to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="The port; 0 picks a free one.")
    ] = 8089,
    script: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="A YAML or JSON script: reply rules and queued faults."),
    ] = None,
    log: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Append one JSON line per request to FILE.")
    ] = None,
) -> None:
    """Serve a local model provider speaking OpenAI's and Anthropic's APIs, until SIGTERM
    or Ctrl-C.

    Point the official SDKs at it: OpenAI with base_url http://HOST:PORT/v1, Anthropic
    with base_url http://HOST:PORT. Replies echo the last user message unless --script
    says otherwise. Prints `llm-server listening on http://HOST:PORT` once ready.
    """
    with errors():
        from ratchet.llm.server import LocalProvider, run_until_signalled

        provider = LocalProvider(script, log)
        try:
            run_until_signalled(provider, host, port)
        except OSError as e:
            raise Fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
