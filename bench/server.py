"""``ratchet server`` under load: accepted starts per second, and journal events from their
commit to the SSE client, with one subscriber and with a thousand.

``python -m bench.server [--quick] [--backend sqlite|postgres]`` (also a section of ``make
bench``) starts a real ``ratchet server`` process (uvicorn, API only: ``--workers 0``) on
a fresh database with a real token, and measures, on each backend:

- **accept**: ``POST /v1/runs`` from concurrent keep-alive clients for a few seconds: runs
  accepted per second (202s), latency p50/p99, server and client CPU;
- **single**: one subscriber following a run that a worker in another process drives at
  100 events/s: latency from each event's commit (stamped by that worker as the commit
  returns, see :mod:`bench.server_app`) to its arrival at the client, on the same clock;
- **fanout**: the same with many subscribers (a thousand in the full run) spread over a few
  client processes, plus the server's CPU and peak memory (psutil) while it fans out.

Every subscriber must receive every event of the run exactly once, in order; anything else
is an error in the result, not a figure. CPU is given in percent of one core: the server's,
and the clients' and the writer's, so that a client bottleneck shows.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from bench.peers.common import last_json, latency_summary
from bench.report import SERVER_PREFIX, server_section
from bench.server_clients import read_arrivals, runqueue_s
from ratchet.store.tenants import scoped_id

ROOT = Path(__file__).resolve().parent.parent
RATCHET = str(Path(sys.executable).parent / "ratchet")
TENANT = "bench"  # the tokens' tenant: its runs are stored as "bench~<id>"
EVENTS_PER_S = 100
STEP_S = 2 / EVENTS_PER_S  # a step writes two events (its step_completed, the next step_started)


@dataclass(frozen=True)
class Plan:
    post_processes: int
    post_connections: int  # per process
    post_seconds: float
    single_seconds: float
    fanout_subscribers: int
    fanout_processes: int
    fanout_seconds: float
    timeout: float


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(
            post_processes=1,
            post_connections=8,
            post_seconds=1.5,
            single_seconds=1.5,
            fanout_subscribers=50,
            fanout_processes=2,
            fanout_seconds=1.5,
            timeout=60,
        )
    return Plan(
        post_processes=2,
        post_connections=16,
        post_seconds=6,
        single_seconds=6,
        fanout_subscribers=1000,
        fanout_processes=4,
        fanout_seconds=6,
        timeout=180,
    )


def _python(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


class Server:
    """A ``ratchet server`` process on a free port, and its token."""

    def __init__(self, url: str) -> None:
        self.db = url
        argv = [
            RATCHET,
            "server",
            "--app",
            "bench.server_app:app",
            "--port",
            "0",
            "--workers",
            "0",
            "--log-level",
            "info",
            "--db",
            url,
        ]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.ps = psutil.Process(self.proc.pid)
        self.log: collections.deque[str] = collections.deque(maxlen=50)
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        try:
            self.base = self._address()
            self._drainer.start()
            self.token = self._token()
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self.http = httpx.Client(
            base_url=self.base, timeout=30, headers={"Authorization": f"Bearer {self.token}"}
        )

    def _address(self) -> str:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if "Uvicorn running on " in line:
                return line.split("Uvicorn running on ", 1)[1].split()[0]
        raise RuntimeError("ratchet server did not start: " + "".join(self.log)[-600:])

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def _token(self) -> str:
        done = subprocess.run(
            [
                RATCHET,
                "tokens",
                "create",
                "--tenant",
                TENANT,
                "--scopes",
                "runs:read,runs:write",
                "--db",
                self.db,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip().splitlines()[-1]

    def used(self) -> tuple[float, float]:
        """CPU seconds so far, and seconds spent waiting for a CPU."""
        times = self.ps.cpu_times()
        return float(times.user + times.system), runqueue_s(self.proc.pid)

    def rss_mb(self) -> float:
        return float(self.ps.memory_info().rss) / 2**20

    def start(self, workflow: str, body: dict[str, Any]) -> str:
        answer = self.http.post("/v1/runs", json={"workflow": workflow, "input": body})
        answer.raise_for_status()
        return str(answer.json()["run_id"])

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drainer.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def _percent(cpu_s: float, seconds: float) -> float:
    return round(100 * cpu_s / seconds, 1) if seconds > 0 else 0.0


def accept(server: Server, p: Plan) -> dict[str, Any]:
    """POST /v1/runs from ``post_processes × post_connections`` keep-alive clients."""
    start_at = time.time() + 1.5  # the client processes start meanwhile
    procs = [
        subprocess.Popen(
            _python(
                "bench.server_clients",
                "post",
                "--url",
                server.base,
                "--token",
                server.token,
                "--n",
                str(p.post_connections),
                "--start-at",
                repr(start_at),
                "--seconds",
                str(p.post_seconds),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(p.post_processes)
    ]
    time.sleep(max(0.0, start_at - time.time()))
    before = server.used()
    answers = [last_json(*proc.communicate(timeout=p.post_seconds + p.timeout)) for proc in procs]
    seconds = time.time() - start_at
    used = server.used()
    bad = [a for a in answers if "accepted" not in a]
    if bad:
        return {"error": str(bad[0])[:300]}
    latencies = [x for a in answers for x in a["latencies_ms"]]
    errors = sum(a["errors"] for a in answers)
    if errors or not latencies:
        first = next((a["first_error"] for a in answers if a["first_error"]), "no request")
        return {"error": f"{errors} requests refused: {first}"}
    return {
        "clients": p.post_processes * p.post_connections,
        "accepted": len(latencies),
        "accepted_per_s": round(len(latencies) / seconds, 1),
        **latency_summary(latencies),
        **_load(before, used, answers, seconds),
    }


def _load(
    before: tuple[float, float],
    after: tuple[float, float],
    clients: list[dict[str, Any]],
    seconds: float,
) -> dict[str, Any]:
    """CPU used and CPU waited for (runnable, not running: the machine was busy), by the
    server and by all the clients, in percent of one core over ``seconds``."""
    return {
        "server_cpu_pct": _percent(after[0] - before[0], seconds),
        "server_cpu_wait_pct": _percent(after[1] - before[1], seconds),
        "client_cpu_pct": _percent(sum(a["cpu_s"] for a in clients), seconds),
        "client_cpu_wait_pct": _percent(sum(a["runqueue_s"] for a in clients), seconds),
        "load_average": round(os.getloadavg()[0], 2),
    }


def _ready(proc: subprocess.Popen[str], timeout: float) -> None:
    """Wait for a subscriber process's ``ready`` line."""
    assert proc.stdout is not None
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(_line(proc.stdout)), daemon=True)
    reader.start()
    reader.join(timeout)
    if found != ["ready"]:
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"subscribers not ready: {(found or [''])[0]} {err[-400:]}")


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


def follow(
    server: Server, subscribers: int, processes: int, seconds: float, timeout: float
) -> dict[str, Any]:
    """A run driven at EVENTS_PER_S by a worker in another process, followed by
    ``subscribers`` SSE streams spread over ``processes`` client processes."""
    steps = max(1, round(seconds / STEP_S))
    run_id = server.start("paced", {"steps": steps, "every_s": STEP_S})
    folder = Path(tempfile.mkdtemp(prefix="server-bench-"))
    shares = [subscribers // processes + (i < subscribers % processes) for i in range(processes)]
    clients = [
        subprocess.Popen(
            _python(
                "bench.server_clients",
                "subscribe",
                "--url",
                server.base,
                "--token",
                server.token,
                "--run-id",
                run_id,
                "--n",
                str(n),
                "--out",
                str(folder / f"arrivals-{i}"),
                "--timeout",
                str(timeout),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate(shares)
        if n
    ]
    writer: subprocess.Popen[str] | None = None
    try:
        for proc in clients:
            _ready(proc, timeout)
        rss_before = server.rss_mb()
        before, began = server.used(), time.time()
        # The writer drives the run through the engine, which knows it by the engine's id
        # (the tenant's namespace); the subscribers follow it through the API.
        writer = subprocess.Popen(
            _python(
                "bench.server_app",
                "writer",
                "--db",
                server.db,
                "--run-id",
                scoped_id(TENANT, run_id),
                "--out",
                str(folder / "commits.json"),
                "--timeout",
                str(timeout),
            ),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak = rss_before
        while any(proc.poll() is None for proc in clients):
            if time.time() - began > timeout:
                raise RuntimeError(f"the subscribers did not finish within {timeout:g} s")
            peak = max(peak, server.rss_mb())
            time.sleep(0.2)
        seconds = time.time() - began
        used = server.used()
        answers = [last_json(*proc.communicate()) for proc in clients]
        _, err = writer.communicate(timeout=timeout)
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed: {err[-400:]}")
        bad = [a for a in answers if "streams" not in a]
        if bad:
            raise RuntimeError(f"a subscriber process failed: {str(bad[0])[:300]}")
        written = json.loads((folder / "commits.json").read_text())
        commits = {
            int(seq): (committed, created)
            for seq, (committed, created) in written["commits"].items()
        }
        streams = [
            s for i in range(len(clients)) for s in read_arrivals(str(folder / f"arrivals-{i}"))
        ]
        delivered = deliveries(streams, commits)
        return delivered | {
            "deliveries_per_s": round(delivered["deliveries"] / seconds, 1),
            "subscribers": subscribers,
            "client_processes": len(clients),
            "events_per_s": EVENTS_PER_S,
            "seconds": round(seconds, 2),
            "server_rss_mb": round(rss_before, 1),
            "server_peak_rss_mb": round(peak, 1),
            **_load(before, used, answers, seconds),
            "writer_cpu_pct": _percent(written["cpu_s"], written["seconds"]),
        }
    finally:
        for proc in [*clients, *([writer] if writer else [])]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        shutil.rmtree(folder, ignore_errors=True)


def deliveries(
    streams: list[tuple[Any, Any]], commits: dict[int, tuple[float, float]]
) -> dict[str, Any]:
    """Check every stream got seqs 1..last once, in order; the latencies to each arrival
    from the event's commit stamp, and from its creation (before the commit: an upper
    bound, should the stamps be late)."""
    last = max(commits)
    expected = list(range(1, last + 1))
    for i, (seqs, _) in enumerate(streams):
        got = list(seqs)
        if got != expected:
            where = next(
                (j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                min(len(got), len(expected)),
            )
            raise RuntimeError(
                f"stream {i} received {len(got)} events, not seqs 1..{last} "
                f"once each in order (from position {where}: "
                f"{got[where : where + 3]})"
            )
    arrivals = [
        (commits[seq], at)
        for seqs, times in streams
        for seq, at in zip(seqs, times, strict=True)
        if seq in commits
    ]
    latencies = [(at - committed) * 1000 for (committed, _), at in arrivals]
    upper = latency_summary([(at - created) * 1000 for (_, created), at in arrivals])
    return {
        "events": last,
        "timed_events": len(commits),
        "deliveries": len(latencies),
        "every_event_once": True,
        "min_ms": round(min(latencies), 3),
        **latency_summary(latencies),
        **{f"created_{k}": v for k, v in upper.items()},
    }


def measure(backend: str, url: str, quick: bool) -> dict[str, Any]:
    """The three measures on one fresh database behind one server process."""
    p = plan(quick)
    server = Server(url)
    result: dict[str, Any] = {"backend": backend}
    try:
        # accept goes last: the thousands of runs it starts stay queued (no worker serves
        # them) and must not be there for a stream measure's writer to claim.
        fn: Callable[[], Any]
        for name, fn in (
            ("single", lambda: follow(server, 1, 1, p.single_seconds, p.timeout)),
            (
                "fanout",
                lambda: follow(
                    server, p.fanout_subscribers, p.fanout_processes, p.fanout_seconds, p.timeout
                ),
            ),
            ("accept", lambda: accept(server, p)),
        ):
            try:
                result[name] = fn()
            except Exception as e:  # a failed measure is reported, the others still run
                result[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
    finally:
        server.close()
    return result


@contextmanager
def _database(backend: str) -> Iterator[str]:
    """A fresh database of this process's own, dropped afterwards."""
    if backend == "sqlite":
        # On disk, beside the other measures' files (/tmp may be a tmpfs).
        scratch = ROOT / "bench" / "results" / ".tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="server-bench-", dir=scratch) as folder:
            yield f"sqlite:///{folder}/ratchet.db"
        return
    import psycopg

    from bench.run import PG_ADMIN  # bench.run imports this module

    name = f"bench_server_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), action="append")
    args = parser.parse_args()
    samples = {}
    for backend in args.backend or ("sqlite", "postgres"):
        with _database(backend) as url:
            result = measure(backend, url, args.quick)
        print(json.dumps(result), flush=True)
        samples[f"{SERVER_PREFIX}{backend}"] = [result]
    print("\n".join(server_section({"samples": samples})))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
