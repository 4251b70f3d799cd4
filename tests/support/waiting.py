"""Waiting on observable state in tests: poll until it holds, never sleep hoping it does.

One helper for blocking code and one for coroutines; both fail at their deadline naming what
they waited for (and, when given, ``detail()``: a worker's log, say).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar, overload

POLL_S = 0.01
T = TypeVar("T")


def _timed_out(what: str, timeout: float, detail: Callable[[], str] | None) -> AssertionError:
    extra = f"\n{detail()}" if detail is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")


def wait_for(
    probe: Callable[[], T | Literal[False] | None],
    timeout: float = 15.0,
    what: str = "state",
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy, and return that (a probe written
    ``cond and value`` gives the value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, detail)
        time.sleep(POLL_S)


@overload
async def wait_for_async(
    probe: Callable[[], Awaitable[T | Literal[False] | None]],
    timeout: float = ...,
    what: str = ...,
    detail: Callable[[], str] | None = ...,
) -> T: ...
@overload
async def wait_for_async(
    probe: Callable[[], T | Literal[False] | None],
    timeout: float = ...,
    what: str = ...,
    detail: Callable[[], str] | None = ...,
) -> T: ...
async def wait_for_async(
    probe: Callable[[], Any],
    timeout: float = 15.0,
    what: str = "state",
    detail: Callable[[], str] | None = None,
) -> Any:
    """:func:`wait_for` on the event loop: ``probe`` may be a plain function or a coroutine
    function; the loop runs between polls."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        value = await got if inspect.isawaitable(got) else got
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, detail)
        await asyncio.sleep(POLL_S)
