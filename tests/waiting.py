"""Waiting on observable state in tests: poll until it holds, never sleep hoping it does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.01


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "state") -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g}s")
        time.sleep(POLL_S)
