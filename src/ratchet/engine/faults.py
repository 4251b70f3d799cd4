"""Named crash points, for fault-injection tests and campaigns.

``RATCHET_CRASH_AT=point:nth`` kills this process with SIGKILL the nth time it passes
``point`` (nth defaults to 1); ``RATCHET_PAUSE_AT=point:nth`` stops it with SIGSTOP there.
Several may be given, separated by commas. When neither variable is set, :func:`crash_point`
is one empty-dict check.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_claim",
    "after_renew",
    "after_step_started",
    "after_receipt_claim",
    "after_dispatch",
    "after_step_completed",
    "before_terminal",
    "after_terminal",
)


def _parse(var: str, sig: int) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for part in filter(None, (os.environ.get(var) or "").split(",")):
        name, _, nth = part.strip().partition(":")
        if name not in POINTS:
            raise ValueError(f"{var}: unknown crash point {name!r}; expected one of {POINTS}")
        out[name] = (int(nth or 1), sig)
    return out


_armed: dict[str, tuple[int, int]] = {
    **_parse("RATCHET_PAUSE_AT", signal.SIGSTOP),
    **_parse("RATCHET_CRASH_AT", signal.SIGKILL),
}
_passed: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Kill or pause this process here if the environment armed ``name``."""
    if not _armed:
        return
    target = _armed.get(name)
    if target is None:
        return
    count = _passed.get(name, 0) + 1
    _passed[name] = count
    if count == target[0]:
        os.kill(os.getpid(), target[1])
