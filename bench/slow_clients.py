"""Slow clients against ``ratchet server``: how long a connection that never finishes its
request is held, and how the server answers everyone else meanwhile.

``python -m bench.slow_clients [--connections 300] [--timeout 10] [--db URL]`` starts a
real ``ratchet server`` process (API only, ``--workers 0``, ``--request-timeout`` as
given) on a free loopback port, on a fresh SQLite database unless ``--db`` names one, with
a real token. A process of its own opens ``--connections`` connections at once: half send
a request head that never ends, half a whole head and then a body a byte every 100 ms that
never completes. Once they are all open, this process sends ordinary requests one after
another, 10 ms apart (``GET /v1/runs``, every tenth a ``POST /v1/runs``), timing each,
until every slow connection is closed. It prints one JSON object:

- ``closed``: how many slow connections the server closed, how (a ``408`` answer read
  before the close, or a reset, which a close with trickled bytes unread becomes), and how
  many were still open when the measure ended;
- ``held_s``: seconds from just before each connection's connect to its close, min, p50
  and max. The server's clock starts at its accept, after that, so this can read long on
  a busy machine (``connect_s``, the connects as the slow clients' loop saw them, says by
  how much at most) but never short;
- ``ordinary``: the requests answered meanwhile, their p50, p99 and max latency in ms, and
  any answer other than 200/202;
- the machine's load average and cores, to read the rest by.

It ends within about ``2 × timeout + 60`` seconds whatever happens, and uses only the
loopback interface and a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TRICKLE_S = 0.1  # a trickling body's pace: one byte this often


def _ratchet(*args: str) -> list[str]:
    return [sys.executable, "-m", "ratchet.cli", *args]


def _drain(stream: IO[str]) -> None:
    for _ in stream:
        pass


@contextmanager
def server(db: str, timeout_s: float, start_s: float) -> Iterator[tuple[str, str]]:
    """A ``ratchet server`` on a free loopback port: its base URL and a token."""
    made = subprocess.run(
        _ratchet(
            "tokens", "create", "--tenant", "bench", "--scopes", "runs:read,runs:write", "--db", db
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    token = made.stdout.strip().splitlines()[-1]
    env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
    proc = subprocess.Popen(
        _ratchet(
            "server",
            "--app",
            "bench.server_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            "0",
            "--request-timeout",
            f"{timeout_s:g}s",
            "--db",
            db,
        ),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        seen, deadline = "", time.monotonic() + start_s
        while not (found := re.search(r"running on (http://\S+)", seen)):
            line = proc.stderr.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"ratchet server did not start: {seen[-600:]}")
            seen += line
        # The log goes on while it serves: drain it, so a full pipe never blocks the server.
        threading.Thread(target=_drain, args=(proc.stderr,), daemon=True).start()
        yield found.group(1), token
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def hold(
    host: str,
    port: int,
    token: str,
    kind: str,
    until: float,
    sent: list[int],
    opened: asyncio.Event,
    connections: int,
) -> dict[str, Any]:
    """One slow client: seconds from just before its connect until the server closed it
    (``held_s``), how long the connect took as this loop saw it (``connect_s``), and how
    it was closed."""
    # The clock starts before the connect: the server's starts at its accept, after it,
    # so on a busy machine this can only read long, never short.
    began = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    connect_s = time.monotonic() - began
    if kind == "head":  # a head that never ends
        writer.write(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    else:  # a whole head, then a body that never completes
        writer.write(
            b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\n"
            b"Content-Length: 100000\r\n\r\n{"
        )
    await writer.drain()
    sent.append(1)
    if len(sent) == connections:
        opened.set()

    async def trickle() -> None:
        while True:
            await asyncio.sleep(TRICKLE_S)
            writer.write(b" ")
            await writer.drain()

    dripping = asyncio.create_task(trickle()) if kind == "body" else None
    how = "open"
    try:
        got = await asyncio.wait_for(reader.read(), max(0.0, until - time.monotonic()))
        how = "408" if got.startswith(b"HTTP/1.1 408 ") else f"other: {got[:40]!r}"
    except (ConnectionResetError, BrokenPipeError):
        how = "reset"  # closed with trickled bytes unread: the 408 may be lost with it
    except TimeoutError:
        how = "open"
    finally:
        if dripping is not None:
            dripping.cancel()
            await asyncio.gather(dripping, return_exceptions=True)
        writer.close()
    return {"how": how, "held_s": time.monotonic() - began, "connect_s": connect_s}


async def holders(host: str, port: int, token: str, connections: int, within_s: float) -> None:
    """The slow clients, in a process of their own (so their work never delays the timed
    requests' loop): prints ``opened`` once every connection has sent its first bytes,
    then, once all are closed or ``within_s`` has passed, what became of each, as JSON."""
    until = time.monotonic() + within_s
    sent: list[int] = []
    opened = asyncio.Event()
    tasks = [
        asyncio.create_task(
            hold(host, port, token, "head" if i % 2 else "body", until, sent, opened, connections)
        )
        for i in range(connections)
    ]
    await asyncio.wait_for(opened.wait(), within_s)
    print("opened", flush=True)
    print(json.dumps(await asyncio.gather(*tasks)), flush=True)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(min(values), 3),
        "p50": round(_quantile(values, 0.5), 3),
        "max": round(max(values), 3),
    }


def measure(base: str, token: str, connections: int, timeout_s: float) -> dict[str, Any]:
    """Open the slow connections (a child process), time ordinary requests meanwhile."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    within_s = 2 * timeout_s + 30
    began = time.monotonic()
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.slow_clients",
            "--hold",
            f"{host}:{port}",
            "--token",
            token,
            "--connections",
            str(connections),
            "--within",
            str(within_s),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    latencies: list[float] = []
    refused: dict[int, int] = {}
    try:
        if child.stdout.readline().strip() != "opened":
            raise RuntimeError("the slow clients did not open their connections")
        with httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}
        ) as client:
            n = 0
            while child.poll() is None and time.monotonic() - began < within_s:
                n += 1
                t0 = time.monotonic()
                if n % 10 == 0:
                    r = client.post("/v1/runs", json={"workflow": "noop", "input": {"n": n}})
                else:
                    r = client.get("/v1/runs", params={"limit": 10})
                latencies.append(time.monotonic() - t0)
                if r.status_code not in (200, 202):
                    refused[r.status_code] = refused.get(r.status_code, 0) + 1
                time.sleep(0.01)  # a steady trickle of ordinary traffic, not a flood
        out, _ = child.communicate(timeout=within_s + 30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    held: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    closed = [h for h in held if h["how"] != "open"]
    ms = [x * 1000 for x in latencies]
    return {
        "connections": connections,
        "request_timeout_s": timeout_s,
        "seconds": round(time.monotonic() - began, 2),
        "closed": {
            "total": len(closed),
            "answered_408": sum(h["how"] == "408" for h in held),
            "reset": sum(h["how"] == "reset" for h in held),
            "other": sum(h["how"].startswith("other") for h in held),
            "still_open": connections - len(closed),
        },
        "held_s": _spread([h["held_s"] for h in closed]),
        "connect_s": _spread([h["connect_s"] for h in held]),
        "ordinary": {
            "requests": len(ms),
            "p50_ms": round(_quantile(ms, 0.5), 2),
            "p99_ms": round(_quantile(ms, 0.99), 2),
            "max_ms": round(max(ms), 2),
            "not_ok": refused,
        }
        if ms
        else None,
        "load_average": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=300, help="slow connections")
    parser.add_argument("--timeout", type=float, default=10.0, help="--request-timeout, seconds")
    parser.add_argument("--db", help="the server's database (default: a fresh SQLite file)")
    # The slow clients' own process (see holders).
    parser.add_argument("--hold", metavar="HOST:PORT", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--within", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        host, port = args.hold.rsplit(":", 1)
        asyncio.run(holders(host, int(port), args.token, args.connections, args.within))
        return
    with tempfile.TemporaryDirectory(prefix="ratchet-slow-") as tmp:
        db = args.db or f"sqlite:///{tmp}/slow.db"
        with server(db, args.timeout, start_s=60) as (base, token):
            result = measure(base, token, args.connections, args.timeout)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
