"""What a campaign will do, decided up front from its seed: the runs' plans and the
schedule of faults. Replaying a seed replays these decisions; only their timing jitters.
"""

from __future__ import annotations

from collections.abc import Callable
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


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run the campaign starts: which workflow, on which plan, and what the campaign
    does to it besides (cancel it while it is busy; start it from several callers at once
    under its run id)."""

    workflow: str
    plan: list[str]
    cancel_after_s: float | None = None  # cancel this long after it is first seen busy
    callers: int = 1  # concurrent starts under the same explicit run id


DUP_CALLERS = 4  # callers of a duplicate start, each on a connection of its own
BOXED_SHARE = 0.06  # runs of the isolated workflow (see chaos.app.boxed)


def run_plans(rng: Random, n: int) -> list[list[str]]:
    """``n`` plans of five steps: mostly work and sends, some with a durable sleep, some
    with a wait for a signal, and some of the structured kinds: parallel branches that
    wait beside a running step (``par_signal``, ``par_sleep:<s>``), a step with two
    deliveries (``send2``), a step that delivers and then fails its first attempts
    (``flaky_send:<k>``), and a fan-out of child runs (``children:<n>``)."""
    plans = []
    for _ in range(n):
        plan = [rng.choice(("work", "send", "send")) for _ in range(5)]
        positions = list(range(5))
        rng.shuffle(positions)
        kinds: tuple[tuple[float, Callable[[], str]], ...] = (
            (0.3, lambda: f"sleep:{rng.uniform(0.3, 1.0):.2f}"),
            (0.2, lambda: "signal"),
            (0.15, lambda: "par_signal"),
            # Longer than the engine's in-memory wait, so the branch parks the run once
            # the send beside it is done (sometimes; a slow send eats into it).
            (0.15, lambda: f"par_sleep:{rng.uniform(2.1, 3.0):.2f}"),
            (0.2, lambda: "send2"),
            (0.2, lambda: f"flaky_send:{rng.choice((1, 1, 2))}"),
            (0.12, lambda: f"children:{rng.choice((2, 3))}"),
        )
        for chance, kind in kinds:
            if rng.random() < chance and positions:
                plan[positions.pop()] = kind()
        plans.append(plan)
    return plans


def run_specs(rng: Random, n: int) -> list[RunSpec]:
    """``n`` runs: most of workflow ``flow`` on :func:`run_plans`' plans; some of
    ``audit``, which only version-2 workers serve (a rolling deploy); some cancelled while
    busy (a loop of quick steps first, or children that loop); some started by several
    callers at once."""
    plans = run_plans(rng, n)
    specs = []
    for plan in plans:
        workflow = "audit" if rng.random() < 0.1 else "flow"
        cancel_after_s = None
        if rng.random() < 0.06:
            # Busy: a loop of quick steps, or children that each run one (the cancel
            # must reach them).
            if rng.random() < 0.4:
                head = f"children:{rng.choice((2, 3))}:{rng.randint(20, 40)}"
            else:
                head = f"spin:{rng.randint(25, 45)}"
            plan = [head, *plan[:3]]
            cancel_after_s = round(rng.uniform(0.0, 1.0), 3)
        callers = DUP_CALLERS if rng.random() < 0.05 else 1
        if rng.random() < BOXED_SHARE:
            # An isolated run (a sandbox per attempt): computations only.
            workflow = "boxed"
            plan = [p if p.startswith("spin:") else "work" for p in plan]
        specs.append(RunSpec(workflow, plan, cancel_after_s, callers))
    return specs


def fault_schedule(
    rng: Random, backend: str, n: int, workers: int, gap: tuple[float, float]
) -> list[Fault]:
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
    kinds += ["sandbox_kill"] * max(3, n // 20)
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
        elif kind == "sandbox_kill":
            params["pick"] = rng.randrange(2**32)
        out.append(Fault(kind, round(rng.uniform(*gap), 3), params))
    return out
