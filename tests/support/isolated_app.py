"""Isolated workflows for the sandbox tests, and a worker process that drives them.

Imported by the tests (to start runs and read journals) and, inside each sandbox, by the
harness (``python -m ratchet.sandbox.harness isolated_app:<workflow>``). Run as
``python tests/support/isolated_app.py``: one worker configured from the environment (ISO_DB_URL,
ISO_WORKER_ID, ISO_LEASE_TTL, ISO_RECOVERY_INTERVAL), stopped by SIGTERM or killed.

Nothing here can write outside its sandbox, so what the tests check comes from the
journal: each ``step_started`` is one invocation, with its idempotency key.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request

import ratchet

app = ratchet.Ratchet(os.environ.get("ISO_DB_URL"))


@app.step
def first(n: int) -> int:
    return n + 1


@app.step
def slow(n: int) -> int:
    """Hangs in the first sandbox (the test kills it there); the resumed one goes on."""
    if os.environ.get("RATCHET_RESUME") != "1":
        time.sleep(600)
    return n * 10


@app.step
def last(n: int) -> dict[str, object]:
    info = ratchet.current_step()
    return {"n": n, "key": info.idempotency_key}


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=120))
async def pipeline(n: int) -> dict[str, object]:
    a = await first(n)
    b = await slow(a)
    return await last(b)


@app.step
def quick(n: int) -> int:
    return n * 2


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=120))
async def simple(n: int) -> int:
    return await quick(await quick(n))


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=120))
async def patched_in_sandbox(n: int) -> int:
    """``ratchet.patched`` inside a sandbox: its marker is reported to the host."""
    n = await quick(n)
    if ratchet.patched("double-twice"):
        n = await quick(n)
    return n


@app.step
def hang() -> int:
    time.sleep(600)
    return 0


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=120), timeout_s=8.0)
async def past_its_deadline() -> int:
    """Its step outlives the run's deadline (8 s, room for a sandbox to start on a loaded
    machine), well inside its sandbox's own 120 s."""
    return await quick(1) + await hang()


@app.step
def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, timeout_s=120))
async def always_crashes() -> None:
    await crash()


@app.step
def read_host(path: str) -> str:
    try:
        with open(path) as f:
            return "READ " + f.read(100)
    except OSError as e:
        return f"denied {type(e).__name__}"


@app.step
def write_code() -> str:
    try:
        with open(__file__, "a") as f:
            f.write("# tampered\n")
        return "WROTE"
    except OSError as e:
        return f"denied {type(e).__name__}"


@app.step
def connect(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "CONNECTED"
    except OSError as e:
        return f"denied {type(e).__name__}"


@app.step
def fork_bomb() -> str:
    children = 0
    try:
        for _ in range(10_000):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children += 1
        return f"UNBOUNDED {children}"
    except OSError as e:
        return f"denied {type(e).__name__} after {children}"


@app.workflow(
    tier="isolated", sandbox=ratchet.Sandbox(memory_mb=256, max_processes=48, timeout_s=120)
)
async def escape(secret_path: str, ports: list[int]) -> dict[str, object]:
    return {
        "read": await read_host(secret_path),
        "etc": await read_host("/etc/hostname"),
        "write": await write_code(),
        "tcp": [await connect(p) for p in ports],
        "fork": await fork_bomb(),
    }


@app.step
def call_report_url() -> str:
    """What the report endpoint on the sandbox's loopback answers without a token."""
    url = os.environ["RATCHET_REPORT_URL"]
    try:
        urllib.request.urlopen(url + "/v1/runtime/journal", timeout=5)
        return "200"
    except urllib.error.HTTPError as e:
        return str(e.code)


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(network="report-only", timeout_s=120))
async def reporting(port: int) -> list[str]:
    return [await call_report_url(), await connect(port)]


FLAKY = ratchet.Retry(max_attempts=2, backoff_ms=50, retry_on=["connector"])


@app.step(retry=FLAKY)
def flaky() -> int:
    """Fails its first attempt; the retry (a short backoff, in the sandbox) succeeds."""
    if ratchet.current_step().attempt == 1:
        raise ratchet.ConnectorError("first attempt fails")
    return 2


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(timeout_s=120))
async def napping(long_sleep: bool) -> int:
    await ratchet.sleep(0.2)  # short: waited in the sandbox
    value = await flaky()
    if long_sleep:
        await ratchet.sleep(5)  # long enough to park the run: not in a sandbox
    return value


@app.step
def hog() -> int:
    blocks = [bytearray(16 * 1024 * 1024) for _ in range(64)]  # 1 GiB, touched
    return len(blocks)


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(memory_mb=128, timeout_s=120))
async def hungry() -> int:
    return await hog()


# A folder a sandbox is shown (Sandbox(mounts=...)): the tests put a file that is its
# owner's only (mode 0600) and Ratchet's data directory in it.
SHOWN = os.path.join(tempfile.gettempdir(), "ratchet-sandbox-shown")


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(mounts=(SHOWN,), timeout_s=120))
async def peek(paths: list[str]) -> list[str]:
    return [await read_host(p) for p in paths]


@app.workflow(
    tier="isolated", sandbox=ratchet.Sandbox(timeout_s=120), guards=ratchet.Guards(max_steps=2)
)
async def too_many(n: int) -> int:
    for _ in range(3):
        n = await quick(n)
    await ratchet.sleep(1.5)  # never reached: the worker ends the run at the third step
    return n


if os.environ.get("RATCHET_SANDBOX_ID"):
    # Inside its sandbox the workload switches its own guards off; the worker's own import
    # of this module keeps them, and the worker is the one that judges them.
    too_many.guards = ratchet.Guards(max_steps=None)


@app.tool
def where(n: int) -> dict[str, object]:
    """Says where it ran: a sandbox's hostname and user are bubblewrap's."""
    return {"n": n * 2, "host": socket.gethostname(), "uid": os.getuid()}


# A graph run in a sandbox: its tool node runs inside, the condition and the output are
# the interpreter's, inside too.
GRAPH = {
    "name": "iso-graph",
    "tier": "isolated",
    "sandbox": {"memory_mb": 256, "timeout_s": 120},
    "inputs": {"type": "object", "properties": {"n": {"type": "integer"}}},
    "nodes": [
        {"id": "start", "type": "trigger"},
        {"id": "first", "type": "tool", "data": {"tool": "where", "args": {"n": "{{ input.n }}"}}},
        {"id": "big", "type": "condition", "data": {"expression": "nodes.first.output.n > 5"}},
        {
            "id": "again",
            "type": "tool",
            "data": {"tool": "where", "args": {"n": "{{ nodes.first.output.n }}"}},
        },
    ],
    "edges": [
        {"from": "start", "to": "first"},
        {"from": "first", "to": "big"},
        {"from": "big", "to": "again", "when": "output"},
    ],
    "output": {"first": "{{ nodes.first.output }}", "again": "{{ nodes.again.output }}"},
}


if __name__ == "__main__":
    import asyncio

    import isolated_app  # the module name the harness imports, not __main__

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await isolated_app.app.run_worker(
            stop,
            worker_id=os.environ.get("ISO_WORKER_ID"),
            lease_ttl=float(os.environ.get("ISO_LEASE_TTL", "3")),
            recovery_interval=float(os.environ.get("ISO_RECOVERY_INTERVAL", "0.5")),
        )

    asyncio.run(main())
