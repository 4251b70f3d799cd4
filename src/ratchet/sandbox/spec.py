"""What an isolated workflow declares: ``ratchet.Sandbox(...)``. A leaf module (the engine
reads it), checked when the workflow is declared."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from ratchet.errors import InvalidInput

TIERS = ("process", "isolated")
NETWORKS = ("none", "report-only")


@dataclass(frozen=True, slots=True)
class Sandbox:
    """The limits of an isolated workflow's sandbox, one per attempt.

    ``memory_mb`` and ``cpus`` bound the sandbox (cgroups where the machine allows, else
    rlimits); ``max_processes`` bounds its processes and threads (a fork bomb stops
    there); ``timeout_s`` is the wall-clock life of one sandbox (past it, it is killed and
    counted as a crashed attempt). ``network="none"``: no network at all, the report
    channel is a Unix socket; ``"report-only"``: besides, the report endpoint is served
    on the sandbox's own loopback (``RATCHET_REPORT_URL``), for tools that speak HTTP.
    ``mounts``: more host paths the sandbox may read (read-only)."""

    memory_mb: int = 512
    cpus: float = 1.0
    timeout_s: float | None = None
    network: str = "none"
    mounts: tuple[str, ...] = field(default=())
    max_processes: int = 64

    def __post_init__(self) -> None:
        _positive_int("memory_mb", self.memory_mb, minimum=16)
        _positive_int("max_processes", self.max_processes, minimum=4)
        if (
            not isinstance(self.cpus, int | float)
            or isinstance(self.cpus, bool)
            or not math.isfinite(self.cpus)
            or self.cpus <= 0
        ):
            raise InvalidInput(f"Sandbox cpus must be a positive number, got {self.cpus!r}")
        if self.timeout_s is not None and (
            not isinstance(self.timeout_s, int | float)
            or isinstance(self.timeout_s, bool)
            or not math.isfinite(self.timeout_s)
            or self.timeout_s <= 0
        ):
            raise InvalidInput(
                f"Sandbox timeout_s must be a positive number of seconds or "
                f"None, got {self.timeout_s!r}"
            )
        if self.network not in NETWORKS:
            raise InvalidInput(
                f"Sandbox network must be one of {', '.join(NETWORKS)}, got {self.network!r}"
            )
        mounts: Any = self.mounts
        if isinstance(mounts, str) or not all(isinstance(m, str) for m in mounts):
            raise InvalidInput(f"Sandbox mounts must be a list of paths, got {mounts!r}")
        for m in mounts:
            if not os.path.isabs(m) or "\x00" in m:
                raise InvalidInput(f"Sandbox mount {m!r} must be an absolute path")
        object.__setattr__(self, "mounts", tuple(os.path.normpath(m) for m in mounts))


def _positive_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInput(
            f"Sandbox {name} must be an integer of at least {minimum}, got {value!r}"
        )


def check_tier(tier: Any, sandbox: Any, workflow: str) -> Sandbox | None:
    """The sandbox a workflow of ``tier`` runs in (None in-process), or InvalidInput."""
    if tier not in TIERS:
        raise InvalidInput(
            f"workflow {workflow}: tier must be one of {', '.join(TIERS)}, got {tier!r}"
        )
    if sandbox is not None and not isinstance(sandbox, Sandbox):
        raise InvalidInput(
            f"workflow {workflow}: sandbox must be a ratchet.Sandbox, got {type(sandbox).__name__}"
        )
    if tier == "process":
        if sandbox is not None:
            raise InvalidInput(f'workflow {workflow}: a sandbox needs tier="isolated"')
        return None
    return sandbox or Sandbox()
