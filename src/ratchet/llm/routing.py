"""How the model calls of an isolated run reach the worker that makes them.

Inside a sandbox there is no network and no provider key: :data:`route` is set there (by
the harness) and each durable ``create`` of a wrapped client goes to it instead of to the
provider. Outside, the worker makes the call with its own client.

Which client: each wrapped client is known by where it was made, its *site*: the file
and line of the code that called :func:`ratchet.llm.wrap`, and the how-manieth client
that line made (``/app/agents.py:12#1``). A sandbox imports the same code, so its clients
are made at the same sites; the one it names is the worker's own client made there, with
the worker's base URL and credentials. A sandbox can name a site, never a URL or a key.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from ratchet.errors import ValueRefused

Route = Callable[[str, dict[str, Any]], Awaitable[tuple[dict[str, Any], dict[str, Any]]]]

route: Route | None = None
"""Inside a sandbox: ``route(site, kwargs) -> (body, meta)``, the worker's answer to a
model call of the current step; None elsewhere (calls go to the provider)."""

_made: dict[str, int] = {}
_clients: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def site_of(frame: FrameType | None) -> str:
    """The site of a client being made by the code running in ``frame``."""
    where = (
        "<unknown>:0"
        if frame is None
        else (f"{os.path.realpath(frame.f_code.co_filename)}:{frame.f_lineno}")
    )
    _made[where] = n = _made.get(where, 0) + 1
    return f"{where}#{n}"


def register(site: str, client: Any) -> None:
    """Know ``client`` (a :class:`ratchet.llm.wrap.DurableClient`) by its site."""
    _clients[site] = client


def call_at(site: str, name: str) -> Any:
    """The durable call ``name`` (``openai.chat.completions.create``) of this process's
    client made at ``site``; :class:`ValueRefused` saying why there is none."""
    client = _clients.get(site)
    if client is None:
        raise ValueRefused(
            f"this worker has no wrapped client made at {site}: an isolated run's model "
            "calls are made by its worker, with the client the worker's own import of the "
            "app made there (make wrapped clients at module level, not inside a workflow "
            "or a step)"
        )
    call = client.calls.get(name)
    if call is None:
        raise ValueRefused(
            f"the wrapped client made at {site} ({client.provider}) has no model call {name}"
        )
    return call
