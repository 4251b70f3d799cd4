"""The database's own commit limit: one-row INSERTs, one commit each.

``python -m bench.limit --backend sqlite|postgres --db PATH_OR_URL --clients C --seconds S``
prints one JSON object: commits/s over all clients and the mean µs per commit of one
client. SQLite runs in WAL mode with ``synchronous=FULL`` (what Ratchet uses); PostgreSQL
with the server's settings (``fsync=on``, ``synchronous_commit=on``). Clients are
processes, so Python's GIL does not cap them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import psycopg


def _sqlite_client(path: str, seconds: float, start: float, out: mp.Queue[Any]) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    while time.time() < start:
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO limit_probe (x) VALUES (?)", (n,))
        conn.execute("COMMIT")
        n += 1
    out.put((n, time.perf_counter() - t0))


def _postgres_client(url: str, seconds: float, start: float, out: mp.Queue[Any]) -> None:
    conn = psycopg.connect(url, autocommit=False)
    while time.time() < start:
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        conn.execute("INSERT INTO limit_probe (x) VALUES (%s)", (n,))
        conn.commit()
        n += 1
    out.put((n, time.perf_counter() - t0))


def measure(backend: str, db: str, clients: int, seconds: float) -> dict[str, float]:
    target: Callable[[str, float, float, mp.Queue[Any]], None]
    if backend == "sqlite":
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS limit_probe (x INTEGER)")
        conn.close()
        target = _sqlite_client
    else:
        with psycopg.connect(db, autocommit=True) as pg:
            pg.execute("CREATE TABLE IF NOT EXISTS limit_probe (x integer)")
        target = _postgres_client
    out: mp.Queue[Any] = mp.Queue()
    start = time.time() + 0.3
    procs = [mp.Process(target=target, args=(db, seconds, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    commits = sum(n for n, _ in results)
    elapsed = max(t for _, t in results)
    per_client = results[0][1] / max(results[0][0], 1)
    return {"commits_per_s": commits / elapsed, "commit_us": per_client * 1e6, "clients": clients}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.backend, args.db, args.clients, args.seconds)))


if __name__ == "__main__":
    main()
