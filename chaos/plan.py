"""What a campaign will do, decided up front from its seed: the runs' plans and the
schedule of faults. Replaying a seed replays these decisions; only their timing jitters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random
from typing import Any

PARTITION_FACTORS = (0.5, 1.5, 5.0)  # the link stays down this many lease TTLs


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: its kind, the wait before it, and its seeded parameters."""

    kind: str
    gap_s: float  # wait before injecting it
    params: dict[str, Any] = field(default_factory=dict)


def run_plans(rng: Random, n: int) -> list[list[str]]:
    """``n`` plans of five steps: mostly work and sends, some with a durable sleep, some
    with a wait for a signal."""
    plans = []
    for _ in range(n):
        plan = [rng.choice(("work", "send", "send")) for _ in range(5)]
        positions = list(range(5))
        rng.shuffle(positions)
        if rng.random() < 0.35:
            plan[positions.pop()] = f"sleep:{rng.uniform(0.3, 1.0):.2f}"
        if rng.random() < 0.25:
            plan[positions.pop()] = "signal"
        plans.append(plan)
    return plans


def fault_schedule(rng: Random, backend: str, n: int, workers: int,
                   gap: tuple[float, float]) -> list[Fault]:
    """``n`` faults for ``backend`` in a seeded order. The heavy ones come in fixed numbers
    so every kind is exercised; worker kills and pauses fill the rest."""
    kinds: list[str] = []
    if backend == "postgres":
        kinds += ["pg_restart"] * max(3, n // 50)
        kinds += ["pg_stop"] * max(2, n // 80)
        kinds += ["partition"] * (3 * max(2, n // 60))
        rest = n - len(kinds)
        kinds += ["pg_terminate"] * (rest * 3 // 10)
    else:
        kinds += ["checkpoint_kill"] * max(8, n // 8)
        kinds += ["disk_full"] * max(4, n // 25)
        rest = n - len(kinds)
    rest = n - len(kinds)
    kinds += ["worker_pause"] * (rest * 35 // 100)
    kinds += ["worker_kill"] * (n - len(kinds))
    rng.shuffle(kinds)
    partitions = 0
    out = []
    for kind in kinds:
        params: dict[str, Any] = {}
        if kind in ("worker_kill", "worker_pause"):
            params["slot"] = rng.randrange(workers)
        if kind == "worker_kill":
            params["reclaim"] = rng.random() < 0.5  # restart under the same worker id
            params["restart_delay_s"] = round(rng.uniform(0.05, 1.0), 3)
        elif kind == "worker_pause":
            params["ttls"] = round(rng.uniform(1.5, 3.0), 2)
        elif kind == "pg_terminate":
            params["how_many"] = rng.choice((1, 1, 2, 3, 5))
            params["listen_only"] = rng.random() < 0.3
            params["rng_seed"] = rng.randrange(2**32)
        elif kind == "partition":
            params["ttls"] = PARTITION_FACTORS[partitions % len(PARTITION_FACTORS)]
            partitions += 1
        elif kind == "checkpoint_kill":
            params["after_s"] = round(rng.uniform(0.02, 0.4), 3)
            params["with_worker"] = rng.randrange(workers) if rng.random() < 0.5 else None
        elif kind == "disk_full":
            params["hold_s"] = round(rng.uniform(0.5, 2.0), 2)
        out.append(Fault(kind, round(rng.uniform(*gap), 3), params))
    return out
