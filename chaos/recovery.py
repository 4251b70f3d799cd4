"""Recovery after a worker outage, run by run, and what each one waited on.

An outage (a kill, a crash point, a pause, a partition of at least a lease TTL) at time
``t`` costs each run its worker held then: the run makes progress again at its next drive,
when another worker's sweep steals it once the lease has expired, or the same worker id,
restarted, reclaims it. Each such wait is one :class:`Recovery`, and its *cause* says
what bounded it:

``partition``    the outage was a partition (reported apart: the worker may hold its lease
                 through a short one, and its drive cannot end until the link is back);
``db_outage``    the server was restarting or stopped, or the disk full, early in the wait;
``v2_only``      a run only version-2 workers may drive (a rolling deploy): it waits for
                 one of those;
``isolated``     a run whose every attempt runs in a sandbox of its own;
``reclaim``      taken back by the same worker id, restarted;
``lease_expiry`` stolen by another worker's sweep once the lease ran out.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ratchet.model import TERMINAL_EVENTS, Event, EventKind

DRIVE_MARKERS = (EventKind.RUN_STARTED, EventKind.RUN_RESUMED)
CAUSES = (
    "death_seen",
    "lease_expiry",
    "reclaim",
    "v2_only",
    "isolated",
    "db_outage",
    "partition",
)


@dataclass(frozen=True, slots=True)
class Recovery:
    """One run's wait after one outage."""

    at: float  # the outage
    seconds: float  # until the run's next drive
    fault: str  # the outage's kind
    run_id: str
    reason: str  # of the next drive: "sweep", "takeover" or "reclaim"
    by: str  # the worker id of the next drive


@dataclass(frozen=True, slots=True)
class Window:
    """A span of time the database could not be written (a server restart or stop, a
    full disk)."""

    start: float
    end: float
    kind: str


def _drives(evs: Sequence[Event]) -> list[tuple[Event, list[Event]]]:
    out: list[tuple[Event, list[Event]]] = []
    for e in evs:
        if e.kind in DRIVE_MARKERS:
            out.append((e, []))
        elif out:
            out[-1][1].append(e)
    return out


def recoveries(
    events: Mapping[str, Sequence[Event]], outages: Iterable[tuple[float, str, str]]
) -> list[Recovery]:
    """Each ``(time, worker_id, fault)`` outage's :class:`Recovery` of each run that worker
    held at that time.

    A run was held at ``t`` when its last drive begun before ``t`` was that worker's and had
    not yet parked or finished by ``t``. Only a next drive that took the run back (a sweep
    of an expired lease, or the same worker id reclaiming it) counts: a run claimed
    afresh had been handed back or parked, not lost."""
    by_worker: dict[str, list[tuple[Event, list[Event], Event]]] = defaultdict(list)
    for evs in events.values():
        drives = _drives(evs)
        for (marker, body), (following, _) in itertools.pairwise(drives):
            by_worker[str(marker.payload.get("worker_id"))].append((marker, body, following))
    out: list[Recovery] = []
    for t, worker_id, fault in outages:
        for marker, body, following in by_worker.get(worker_id, ()):
            if not marker.at < t <= following.at:
                continue  # not this run's drive at the time of the outage
            ended = any(
                e.at <= t and (e.kind in TERMINAL_EVENTS or e.kind == EventKind.STEP_WAITING)
                for e in body
            )
            reason = str(following.payload.get("reason"))
            if not ended and reason in ("sweep", "takeover", "reclaim"):
                out.append(
                    Recovery(
                        t,
                        following.at - t,
                        fault,
                        marker.run_id,
                        reason,
                        str(following.payload.get("worker_id")),
                    )
                )
    return out


def cause(
    r: Recovery,
    workflow: str | None,
    windows: Sequence[Window],
    v2_only: Iterable[str] = (),
    isolated: Iterable[str] = (),
    within: float = math.inf,
) -> str:
    """What bounded recovery ``r`` (see the module docstring), the first that applies; a
    database outage counts when it overlapped the first ``within`` seconds of the wait."""
    if r.fault.startswith("partition"):
        return "partition"
    if any(w.start < r.at + min(r.seconds, within) and w.end > r.at for w in windows):
        return "db_outage"
    if workflow in set(v2_only):
        return "v2_only"
    if workflow in set(isolated):
        return "isolated"
    if r.reason == "takeover":
        return "death_seen"
    return "reclaim" if r.reason == "reclaim" else "lease_expiry"


def by_cause(
    recs: Sequence[Recovery],
    workflows: Mapping[str, str | None],
    windows: Sequence[Window],
    v2_only: Iterable[str] = (),
    isolated: Iterable[str] = (),
    within: float = math.inf,
) -> dict[str, list[float]]:
    """The recovery seconds of ``recs`` grouped by :func:`cause`."""
    v2, iso = tuple(v2_only), tuple(isolated)
    out: dict[str, list[float]] = {}
    for r in recs:
        out.setdefault(cause(r, workflows.get(r.run_id), windows, v2, iso, within), []).append(
            r.seconds
        )
    return out
