"""Lanes: faults that hold their injector while they heal, injected beside the schedule.

A server restart holds its injector until the server is back, a full disk for as long as
the disk stays full, a partition for as long as the link is down, a sandbox kill until a
sandbox shows up. Injected inline, each would hold every later fault back; in a lane of
its own the schedule walks on, so a worker is killed or paused while the server heals.
Faults of one lane conflict (two restarts of one server, a full disk during a checkpoint
kill, two partitions of one link), so a lane injects them one after another, in order, and
leaves each its scheduled gap after the one before has healed: a lane that fell behind
does not fire its faults back to back (the server would hardly be up between them).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from chaos.plan import Fault

# The lane of each fault kind that gets one; the others are injected inline.
LANES = {
    "pg_restart": "server",
    "pg_stop": "server",
    "pg_terminate": "server",
    "disk_full": "server",
    "checkpoint_kill": "server",
    "partition": "partition",
    "sandbox_kill": "sandbox",
}
# What each kind holds its lane for, about, besides its own parameters (``hold_s``,
# ``after_s``, ``ttls`` of a partition): a restart or a stop's start, in seconds.
HELD_S = {"pg_restart": 2.5, "pg_stop": 3.0}


class Lane:
    """One thread that injects the faults put to it, in order."""

    def __init__(self, name: str, apply: Callable[[Fault], None]) -> None:
        self.name = name
        self._apply = apply
        self._queue: queue.Queue[Fault | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"lane-{name}", daemon=True)
        self._thread.start()

    def put(self, fault: Fault) -> None:
        self._queue.put(fault)

    def backlog(self) -> int:
        """Faults waiting their turn."""
        return self._queue.qsize()

    def close(self) -> None:
        """Inject what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _work(self) -> None:
        healed = time.monotonic()
        while (fault := self._queue.get()) is not None:
            wait = healed + fault.gap_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._apply(fault)
            healed = time.monotonic()


def lane_seconds(schedule: list[Fault], ttl: float) -> dict[str, float]:
    """About how long each lane takes over its faults of ``schedule`` at the least (each
    fault's gap and what it holds the lane for)."""
    busy: dict[str, float] = {}
    for f in schedule:
        lane = LANES.get(f.kind)
        if lane is None:
            continue
        held = (
            f.gap_s
            + HELD_S.get(f.kind, 0.0)
            + float(f.params.get("hold_s", 0.0))
            + float(f.params.get("after_s", 0.0))
        )
        if f.kind == "pg_stop":
            held += 2 * ttl
        elif f.kind == "partition":
            held += float(f.params["ttls"]) * ttl
        busy[lane] = busy.get(lane, 0.0) + held
    return busy
