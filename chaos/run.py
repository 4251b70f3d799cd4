"""``python -m chaos.run``: chaos campaigns against SQLite and PostgreSQL.

A campaign starts a receiver, 3 worker processes and a stream of runs, then injects a
seeded schedule of faults (worker kills and restarts, crash points, SIGSTOP zombies, and
per backend: backend terminations, server restarts and stops, a network partition; WAL
checkpoints killed, a full disk). Once the faults have healed it waits for the runs to
finish, checks the invariants (chaos.check) and prints a report, also written as JSON to
chaos/results/latest-<backend>.json. The exit status is 1 when any invariant broke, 2 when
none did but a crash point was hit fewer times than required.

A failing campaign prints its seed; ``--seed`` replays the same decisions.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaos.campaign import PG_ADMIN_URL, Campaign, Config
from chaos.report import render

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    """Run the campaigns; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m chaos.run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--seed", type=int, default=None, help="the campaign's seed (default: a fresh one, printed)"
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per backend (default 600; 2500 with --long)"
    )
    parser.add_argument(
        "--faults",
        type=int,
        default=None,
        help="scheduled faults per backend, crash points not counted "
        "(default 170; 2500 with --long)",
    )
    parser.add_argument("--long", action="store_true", help="a long campaign")
    parser.add_argument(
        "--skip",
        default="",
        metavar="KIND[,KIND]",
        help="fault kinds not to inject, reported as not run (e.g. "
        "pg_restart,pg_stop with --postgres on a shared server)",
    )
    parser.add_argument(
        "--postgres",
        default=None,
        metavar="URL",
        help="fault this PostgreSQL server instead of a cluster of the campaign's "
        "own, as its maintenance database's URL; the local cluster on its port is "
        "the one restarted and stopped (default: CHAOS_PG_ADMIN_URL, "
        "RATCHET_CHAOS_POSTGRES, else a cluster of its own on a free port, "
        "removed after)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="NAME",
        help="write the report to chaos/results/NAME-<backend>.json "
        "(default: latest; long-, for --long)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="runs each worker drives at a time (default 8)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work folder and database even when the campaign passes",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    runs = args.runs or (2500 if args.long else 600)
    faults = args.faults or (2500 if args.long else 170)
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if os.geteuid() != 0:
        print(
            "note: not root; network partitions and tmpfs will be reported as not run"
            + (", server restarts too" if args.postgres or PG_ADMIN_URL else ""),
            file=sys.stderr,
        )
    # Stopped by a signal (a CI timeout), still tear down: workers, the namespace, the
    # campaign's own PostgreSQL cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    RESULTS.mkdir(exist_ok=True)
    began = time.monotonic()
    status = 0
    for backend in backends:
        options: dict[str, Any] = {
            "backend": backend,
            "seed": seed,
            "runs": runs,
            "faults": faults,
            "keep": args.keep,
            "skip": tuple(filter(None, args.skip.split(","))),
        }
        if args.postgres:
            options["pg_admin_url"] = args.postgres
        if args.concurrency:
            options["concurrency"] = args.concurrency
        config = Config.long_campaign(**options) if args.long else Config(**options)
        report = Campaign(config).run()
        print(render(report), flush=True)
        out = args.out or ("long" if args.long else "latest")
        (RESULTS / f"{out}-{backend}.json").write_text(json.dumps(report, indent=2) + "\n")
        if report["violations"]["count"]:
            status = 1
        elif not report["crash_points"]["covered"] and status == 0:
            status = 2
    total = time.monotonic() - began
    verdict = {
        0: "PASSED",
        1: "FAILED: invariants broken",
        2: "INCOMPLETE: crash-point coverage short",
    }[status]
    print(f"chaos: {verdict} — {', '.join(backends)}, seed {seed}, {total:.0f}s in all")
    if status:
        print(
            f"replay: python -m chaos.run --backend {args.backend} --seed {seed} "
            f"--runs {runs} --faults {faults}{' --long' if args.long else ''}"
            f"{' --skip ' + args.skip if args.skip else ''}"
            f"{' --postgres ' + args.postgres if args.postgres else ''}"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
