"""The graph interpreter's cost per step, beside the same loop written as code.

``python -m bench.graph_vs_code [N]``: a loop of N tool steps, run as a code workflow and as
a graph (a ``loop`` node over a ``tool`` node), each in a fresh SQLite file (WAL,
synchronous=FULL) with an embedded worker, three times, alternating; prints the median
microseconds per step of each and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ratchet


def build(path: Path, n: int) -> tuple[ratchet.Ratchet, Any]:
    app = ratchet.Ratchet(f"sqlite:///{path}")

    @app.tool
    async def score(account: str) -> int:
        return len(account)

    @app.workflow()
    async def code(accounts: list[str]) -> list[int]:
        return [await score(a) for a in accounts]

    app.graph(
        {
            "name": "scoring",
            "nodes": [
                {"id": "start", "type": "trigger"},
                {
                    "id": "each",
                    "type": "loop",
                    "data": {
                        "over": "{{ input.accounts }}",
                        "item": "a",
                        "body": ["rate"],
                        "max_iterations": n,
                    },
                },
                {
                    "id": "rate",
                    "type": "tool",
                    "data": {"tool": "score", "args": {"account": "{{ a }}"}},
                },
            ],
            "edges": [{"from": "start", "to": "each"}, {"from": "each", "to": "rate"}],
        }
    )
    return app, code


def main(n: int = 500, repeats: int = 3) -> dict[str, list[float]]:
    accounts = [f"acct-{i}" for i in range(n)]
    took: dict[str, list[float]] = {"code": [], "graph": []}
    with tempfile.TemporaryDirectory() as folder:
        for rep in range(repeats):
            for kind in took:
                app, code = build(Path(folder) / f"{kind}-{rep}.db", n)
                with app:
                    app.launch()
                    t0 = time.perf_counter()
                    run_id = (
                        app.start(code, accounts)
                        if kind == "code"
                        else app.start("scoring", {"accounts": accounts})
                    )
                    app.result(run_id, timeout_s=300)
                    took[kind].append((time.perf_counter() - t0) / n * 1e6)
    for kind, samples in took.items():
        print(
            f"{kind}: {statistics.median(samples):,.0f} µs per step, median "
            f"({min(samples):,.0f}–{max(samples):,.0f}) over {repeats} runs of {n} steps"
        )
    ratio = statistics.median(took["graph"]) / statistics.median(took["code"])
    print(f"graph / code: {ratio:.2f}×")
    return took


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
