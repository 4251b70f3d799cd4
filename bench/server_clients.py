"""The server bench's clients, each role a process of its own (``python -m
bench.server_clients subscribe|post ...``), lean enough that they are not what is measured.

They speak HTTP/1.1 over asyncio directly rather than through an HTTP library: with a
thousand streams on a two-core machine, a client library's per-event cost would compete
with the server for the same cores. Each reports the CPU time it used, so the report can
show whether the clients kept up.

- ``subscribe``: N Server-Sent Events streams of one run from seq 0; prints ``ready`` once
  every stream has its first event, then writes each stream's (seq, arrival time) pairs
  to ``--out`` once every stream has seen the terminal event.
- ``post``: C keep-alive connections each sending ``POST /v1/runs`` back to back from
  ``--start-at`` for ``--seconds``; prints the count and each request's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TERMINAL = (b"run_succeeded", b"run_failed", b"run_cancelled")


def _cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def runqueue_s(pid: int | str = "self") -> float:
    """Seconds the process's live threads have spent runnable but waiting for a CPU
    (Linux's schedstat): how much a busy machine held it back. 0 where unknown."""
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(path.read_text().split()[1])
    return total / 1e9


class Stream(asyncio.Protocol):
    """One SSE subscriber: decodes the chunked body and stamps each frame on arrival."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buf = bytearray()  # received, not yet decoded
        self.text = bytearray()  # decoded SSE text, not yet a whole frame
        self.chunk: int | None = None  # bytes left of the chunk being read
        self.started = False  # the response headers have been read
        self.seqs = array("q")
        self.times = array("d")
        loop = asyncio.get_running_loop()
        self.first: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        for fut in (self.first, self.ended):
            if not fut.done():
                fut.set_exception(ConnectionError(f"stream closed early: {exc}"))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        self.buf += data
        if not self.started:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self.buf[: self.buf.find(b"\r\n")])
            if b" 200 " not in status:
                self.connection_lost(ValueError(status.decode(errors="replace")))
                return
            del self.buf[: end + 4]
            self.started = True
        while True:
            if self.chunk is None:
                line = self.buf.find(b"\r\n")
                if line < 0:
                    break
                self.chunk = int(bytes(self.buf[:line]).split(b";")[0], 16)
                del self.buf[: line + 2]
            if len(self.buf) < self.chunk + 2:
                break
            self.text += self.buf[: self.chunk]
            del self.buf[: self.chunk + 2]
            self.chunk = None
        while (end := self.text.find(b"\n\n")) >= 0:
            frame = bytes(self.text[:end])
            del self.text[: end + 2]
            if not frame.startswith(b"id: "):
                continue  # a heartbeat comment
            line = frame.index(b"\n")
            self.seqs.append(int(frame[4:line]))
            self.times.append(now)
            if not self.first.done():
                self.first.set_result(None)
            if frame[line + 8 :].startswith(TERMINAL) and not self.ended.done():
                self.ended.set_result(None)


async def subscribe(
    url: str, token: str, run_id: str, n: int, out: str, timeout: float
) -> dict[str, Any]:
    where = urlsplit(url)
    request = (
        f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    streams: list[Stream] = []
    for _ in range(n):  # one by one: a burst of connects would overflow the listen backlog
        assert where.hostname is not None and where.port is not None
        _, stream = await loop.create_connection(
            lambda: Stream(request), where.hostname, where.port
        )
        streams.append(stream)
    await asyncio.wait_for(asyncio.gather(*(s.first for s in streams)), timeout)
    cpu, waited = _cpu_s(), runqueue_s()
    print("ready", flush=True)
    await asyncio.wait_for(asyncio.gather(*(s.ended for s in streams)), timeout)
    cpu, waited = _cpu_s() - cpu, runqueue_s() - waited
    with open(out, "wb") as f:
        for s in streams:
            f.write(struct.pack("q", len(s.seqs)))
            s.seqs.tofile(f)
            s.times.tofile(f)
    return {"streams": n, "cpu_s": round(cpu, 3), "runqueue_s": round(waited, 3)}


def read_arrivals(path: str) -> list[tuple[array[int], array[float]]]:
    """What :func:`subscribe` wrote: each stream's seqs and their arrival times."""
    streams = []
    with open(path, "rb") as f:
        while header := f.read(8):
            (count,) = struct.unpack("q", header)
            seqs, times = array("q"), array("d")
            seqs.fromfile(f, count)
            times.fromfile(f, count)
            streams.append((seqs, times))
    return streams


async def _poster(
    host: str, port: int, request: bytes, until: float, latencies: list[float], errors: list[str]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.time() < until:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 202"):
                errors.append((head.split(b"\r\n")[0] + b" " + body[:200]).decode())
                continue
            latencies.append((time.perf_counter() - t0) * 1000)
    finally:
        writer.close()


async def post(
    url: str, token: str, connections: int, start_at: float, seconds: float
) -> dict[str, Any]:
    where = urlsplit(url)
    body = json.dumps({"workflow": "noop", "input": {}}).encode()
    request = (
        f"POST /v1/runs HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    errors: list[str] = []
    await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu, waited = _cpu_s(), runqueue_s()
    assert where.hostname is not None and where.port is not None
    await asyncio.gather(
        *(
            _poster(where.hostname, where.port, request, start_at + seconds, latencies, errors)
            for _ in range(connections)
        )
    )
    return {
        "accepted": len(latencies),
        "latencies_ms": [round(x, 3) for x in latencies],
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "cpu_s": round(_cpu_s() - cpu, 3),
        "runqueue_s": round(runqueue_s() - waited, 3),
        "seconds": round(time.time() - start_at, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("subscribe", "post"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--run-id")
    parser.add_argument("--n", type=int, default=1, help="streams or connections")
    parser.add_argument("--out")
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.role == "subscribe":
        answer = asyncio.run(
            subscribe(args.url, args.token, args.run_id, args.n, args.out, args.timeout)
        )
    else:
        answer = asyncio.run(post(args.url, args.token, args.n, args.start_at, args.seconds))
    json.dump(answer, sys.stdout)
    print(flush=True)


if __name__ == "__main__":
    main()
