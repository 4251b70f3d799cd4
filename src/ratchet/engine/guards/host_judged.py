"""The guards of a drive whose host judges them: an isolated run's sandbox.

The worker outside the sandbox checks each step the sandbox reports against the run's
guards and journals what trips (:mod:`ratchet.sandbox.host`); the drive inside runs
unguarded, journals no anomaly, and tells the host what each step was called with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ratchet.engine.guards.policy import Guards
from ratchet.engine.guards.run import RunGuards
from ratchet.model import dumps

# No guard at all: what a host-judged drive runs with (see HostJudgedGuards).
UNGUARDED = Guards(
    runaway_repeats=None,
    max_steps=None,
    retry_storm_run=None,
    retry_storm_workflow=None,
    spike_factor=None,
)


class HostJudgedGuards(RunGuards):
    """The guards of a drive whose host judges them (an isolated run's sandbox: the
    worker outside checks each reported step against the run's guards and journals what
    trips, see ratchet.sandbox.host): none here, and nothing tripped is journaled."""

    def configure(self, guards: Guards, overrides: Mapping[str, Any] | None) -> None:
        self.g = UNGUARDED

    async def trip(
        self,
        kind: str,
        key: str,
        step_id: str | None,
        evidence: dict[str, Any],
        action: str | None = None,
    ) -> None:
        return None


def call_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What a host-judged drive tells its host of a step's call, for the runaway-loop
    guard (the same arguments give the same digest); None for arguments that are not
    data."""
    try:
        return hashlib.sha256(dumps([list(args), kwargs]).encode()).hexdigest()[:16]
    except (TypeError, ValueError):
        return None
