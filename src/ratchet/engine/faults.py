"""Named crash points, for fault-injection tests and campaigns.

``RATCHET_CRASH_AT=point:nth`` kills this process with SIGKILL the nth time it passes
``point`` (nth defaults to 1); ``RATCHET_PAUSE_AT=point:nth`` stops it with SIGSTOP there.
Several may be given, separated by commas. When neither variable is set, :func:`crash_point`
is one empty-dict check.

A malformed value does not stop the process from importing Ratchet (client commands do not
depend on it): it arms nothing, and :func:`check` raises :class:`ConfigError` with the
reason, which every worker calls before it starts.
"""

from __future__ import annotations

import os
import signal

from ratchet.errors import ConfigError

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
            raise ConfigError(
                f"{var}={os.environ.get(var)!r}: unknown crash point {name!r}; "
                f"expected point:nth with point one of {', '.join(POINTS)}"
            )
        if not (nth or "1").isdigit() or int(nth or 1) < 1:
            raise ConfigError(
                f"{var}={os.environ.get(var)!r}: invalid count {nth!r} for "
                f"crash point {name!r}; expected a whole number >= 1"
            )
        out[name] = (int(nth or 1), sig)
    return out


def _arm() -> tuple[dict[str, tuple[int, int]], ConfigError | None]:
    try:
        return {
            **_parse("RATCHET_PAUSE_AT", signal.SIGSTOP),
            **_parse("RATCHET_CRASH_AT", signal.SIGKILL),
        }, None
    except ConfigError as e:
        return {}, e


_armed, _error = _arm()
_passed: dict[str, int] = {}


def check() -> None:
    """Raise :class:`ConfigError` if ``RATCHET_CRASH_AT`` or ``RATCHET_PAUSE_AT`` is
    malformed: a worker must not run believing faults are armed when none are."""
    if _error is not None:
        raise ConfigError(str(_error))


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
