"""The app of the sandbox attack tests (tests/test_sandbox_attack.py): copied into a
folder of its own, served from there with ``ratchet server --app attack_app:app`` as
docs/how-to/isolated.md says, and attacked from inside its sandbox.

Each step tries one thing a workload must not be able to do and says what happened; the
workflow returns the whole record. Nothing here writes outside the sandbox.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any

import ratchet

app = ratchet.Ratchet()


@app.step
def read(path: str) -> str:
    """The first bytes of ``path``, or why they could not be read."""
    try:
        with open(path, "rb") as f:
            return "READ " + f.read(64).hex()
    except OSError as e:
        return f"denied {type(e).__name__}"


@app.step
def output_target(fd: int) -> str:
    """Where the sandbox's output goes: a pipe to its worker, never the worker's log."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        return f"denied {type(e).__name__}"


@app.step
def listing(path: str) -> list[str] | str:
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return f"denied {type(e).__name__}"


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandbox", timeout=30)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.unix_path)


def report_token() -> str:
    """The sandbox's own report token: the harness takes it out of its environment, but
    the process's first environment (/proc/self/environ) still holds it."""
    with open("/proc/self/environ", "rb") as f:
        first = f.read()
    for entry in first.split(b"\0"):
        if entry.startswith(b"RATCHET_REPORT_TOKEN="):
            return entry.split(b"=", 1)[1].decode()
    return ""


def channel_call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A request on the report channel with the sandbox's own token, as a workload that
    found it would send it: the status and the answer."""
    conn = _UnixHTTP(os.environ.get("RATCHET_REPORT_SOCKET", "/run/ratchet/report.sock"))
    headers = {"Authorization": f"Bearer {report_token()}", "Content-Type": "application/json"}
    conn.request(method, path, None if body is None else json.dumps(body), headers)
    answer = conn.getresponse()
    data = answer.read()
    conn.close()
    try:
        return answer.status, json.loads(data)
    except ValueError:
        return answer.status, data.decode(errors="replace")


@app.step
def forge() -> dict[str, Any]:
    """Report, with the sandbox's own token, a correctly chained ``step_completed`` for a
    step that never started, claiming a billion tokens and $123,456."""
    from ratchet.model import Event

    status, journal = channel_call("GET", "/v1/runtime/journal")
    if status != 200:
        return {"journal": status}
    head = journal["events"][-1]
    payload = {
        "output": "ghost",
        "llm": {
            "provider": "openai",
            "model": "gpt-4.1-mini",
            "request_id": "forged",
            "usage": {"input_tokens": 1_000_000_000, "output_tokens": 0},
            "cost_usd": 123456.0,
            "latency_ms": 1.0,
        },
    }
    ev = Event.chain(
        os.environ["RATCHET_RUN_ID"],
        head["seq"] + 1,
        "step_completed",
        "99:ghost",
        1,
        payload,
        head["at"] + 0.001,
        head["hash"],
    )
    status, answer = channel_call(
        "POST",
        "/v1/runtime/report",
        {
            "run_id": ev.run_id,
            "sandbox_id": os.environ["RATCHET_SANDBOX_ID"],
            "op": "append",
            "events": [
                {
                    "seq": ev.seq,
                    "kind": ev.kind,
                    "step_id": ev.step_id,
                    "attempt": ev.attempt,
                    "payload_json": ev.payload_json,
                    "at": ev.at,
                    "prev_hash": ev.prev_hash,
                    "hash": ev.hash,
                }
            ],
        },
    )
    return {"status": status, "answer": answer}


@app.workflow(tier="isolated", sandbox=ratchet.Sandbox(timeout_s=120))
async def attack(files: list[str], folders: list[str]) -> dict[str, Any]:
    return {
        "files": {p: await read(p) for p in files},
        "folders": {p: await listing(p) for p in folders},
        "output": [await output_target(1), await output_target(2)],
        "forged": await forge(),
    }
