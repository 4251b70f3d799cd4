"""What the guards cost a step on the hot path, measured on their own.

``python -m bench.guards_overhead [N]``: the guard hooks a step boundary calls
(``before_attempt`` and ``after_step``) on a run of N plain steps (default 1,000: the default
step limit), each with a small argument and result, with the default guards on, and with
every guard off; prints the microseconds per step of each (best of 20 runs), and the
difference. The journal writes a step
costs (a commit, about a millisecond on SQLite with synchronous=FULL) are not included:
this is the guards' own share.
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace
from typing import Any

from ratchet.engine.definitions import StepDef
from ratchet.engine.guards import DEFAULT, Guards
from ratchet.engine.guards.run import RunGuards
from ratchet.model import RunState, StepState

OFF = Guards(
    runaway_repeats=None,
    max_steps=None,
    retry_storm_run=None,
    retry_storm_workflow=None,
    spike_factor=None,
)


async def noop(job: str, page: int) -> dict[str, Any]:
    return {"page": page}


async def per_step(guards: Guards, n: int) -> float:
    state = RunState("bench")
    ctx: Any = SimpleNamespace(
        state=state, run_id="bench", record=SimpleNamespace(workflow="bench")
    )
    g = RunGuards(ctx, guards)
    sd = StepDef(noop, "noop")
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        step_id = f"{i}:noop"
        args, kwargs = ("job-1", i), dict[str, Any]()
        await g.before_attempt(sd, step_id, args, kwargs)
        state.steps[step_id] = StepState(step_id, i, "noop")
        await g.after_step(sd, step_id, args, kwargs, {"page": i}, None, True)
    return (time.perf_counter() - t0) / n * 1e6


def main(n: int = 1000) -> dict[str, float]:
    took = {
        name: min(asyncio.run(per_step(g, n)) for _ in range(20))
        for name, g in (("defaults", DEFAULT), ("off", OFF))
    }
    for name, us in took.items():
        print(f"guards {name}: {us:.2f} µs per step (best of 20 runs of {n} steps)")
    print(f"the default guards add {took['defaults'] - took['off']:.2f} µs per step")
    return took


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
