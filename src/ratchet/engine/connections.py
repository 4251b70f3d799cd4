"""The connections wrapped SDK clients open on Ratchet's own event loop, closed as it ends.

An app that is launched (``app.launch()``) runs its steps on an event loop of its own. An
SDK client's HTTP connections belong to the loop they were opened on: once that loop is
closed they can never be used again, and left open they are only reclaimed by the garbage
collector, as "unclosed transport" warnings. So each LLM call notes its client's HTTP
client on the loop it runs on, and the loop's owner calls :func:`release` before closing it.

Only the pooled connections are closed, not the HTTP client: the SDK client stays usable,
and a later call on another loop opens connections of its own.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

# Per event loop, the HTTP clients (``httpx.AsyncClient``) that LLM calls used on it.
_USED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[Any]] = (
    weakref.WeakKeyDictionary()
)


def http_client_of(sdk_client: Any) -> Any:
    """The HTTP client an ``openai`` / ``anthropic`` client sends with (both keep their
    ``httpx.AsyncClient`` as ``_client``), or None."""
    return getattr(sdk_client, "_client", None)


def used(http_client: Any) -> None:
    """Note that ``http_client`` sends on the running loop."""
    if http_client is not None:
        _USED.setdefault(asyncio.get_running_loop(), weakref.WeakSet()).add(http_client)


async def release() -> None:
    """Close the connections the noted HTTP clients keep open on the running loop."""
    clients = _USED.pop(asyncio.get_running_loop(), None)
    for http in list(clients or ()):
        transports = [getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()]
        for transport in transports:
            if transport is not None:
                await transport.aclose()
