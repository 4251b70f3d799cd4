"""``ratchet demo --serve``, what ``make run`` runs: the crash-resume demo of
:mod:`ratchet.demo.terminal` played through ``ratchet server``, which then keeps serving.

This process serves the HTTP API (uvicorn in a thread, with one embedded worker taking the
``default`` queue) and the local model provider. The demo's run is started through the API
on the ``demo`` queue, which only the demo's worker processes take: worker 1 is killed with
SIGKILL in the middle of the model call, and worker 2, under the same worker id, reclaims
the run at once and finishes it. The server is up throughout, so an event stream opened
before the kill (the demo's own, or a user's ``curl -N``) carries the whole journal,
``run_resumed`` included, once and in order. The claims are checked through the API (the
run, its journal, its result, that stream) and the independent records (the steps' own
invocation log, the provider's request log); if any does not hold the command fails. Then
the server keeps serving, its embedded worker driving the runs users start, until SIGINT
or SIGTERM stop it cleanly, with exit status 0.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from types import FrameType
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

from ratchet.config import DatabaseURL
from ratchet.demo.stage import (
    HOLD_S,
    WAIT_S,
    WORKER_ID,
    Demo,
    DemoFailed,
    Setup,
    demo_provider,
    prepare,
    report,
    verdict,
)
from ratchet.errors import ConfigError
from ratchet.llm.server import LocalProvider, serve
from ratchet.llm.server.asgi import listen, serve_in_thread
from ratchet.server import create_app, drain
from ratchet.store import make_store, tenants, tokens

#: The queue of the demo's run: only the demo's worker processes take it, never the
#: server's embedded worker, so the process killed is a worker process, not the server.
QUEUE = "demo"
TENANT = "demo"
#: Requests still open when the server stops get this long (event streams end at once).
GRACEFUL_S = 5


class _Stop(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException: nothing on the way may swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class _Seen:
    """A journal event as the API returns it."""

    seq: int
    kind: str
    step_id: str | None
    payload: dict[str, Any]


class _Follower:
    """One Server-Sent Events connection to a run's events, read in a thread from before
    the kill to the stream's end: what a user's ``curl -N`` receives."""

    def __init__(self, base: str, headers: dict[str, str], run_id: str) -> None:
        self.frames: list[tuple[int, str]] = []
        self.error: str | None = None
        self._thread = threading.Thread(
            target=self._read,
            args=(f"{base}/v1/runs/{run_id}/events", headers),
            name="demo-sse",
            daemon=True,
        )
        self._thread.start()

    def _read(self, url: str, headers: dict[str, str]) -> None:
        try:
            with httpx.stream(
                "GET",
                url,
                headers={**headers, "Accept": "text/event-stream"},
                timeout=httpx.Timeout(10.0, read=WAIT_S),
            ) as r:
                if r.status_code != 200:
                    self.error = f"HTTP {r.status_code}"
                    return
                seq: int | None = None
                kind = ""
                for line in r.iter_lines():
                    if line.startswith("id:"):
                        seq = int(line[3:])
                    elif line.startswith("event:"):
                        kind = line[6:].strip()
                    elif not line and seq is not None:
                        self.frames.append((seq, kind))
                        seq = None
        except (httpx.HTTPError, ValueError) as e:
            self.error = f"{type(e).__name__}: {e}"

    def wait(self, timeout: float) -> bool:
        """Wait for the stream to end (it ends after the terminal event)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def serve_demo(db: str | None, host: str, port: int, console: Console) -> int:
    """Run the demo through the server, then serve until SIGINT or SIGTERM. 0 when every
    claim held and the server stopped on a signal; 1 when a claim did not hold; 128 plus
    the signal's number when one arrived before the demo was done."""
    if db is not None:
        DatabaseURL.parse(db)  # refused before anything is touched
    try:
        sock = listen(host, port)
    except OSError as e:
        reason = (
            "the port is taken; choose another with --port N or RATCHET_PORT=N (make run PORT=N)"
            if e.errno == errno.EADDRINUSE
            else e.strerror or str(e)
        )
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from e
    try:
        # Only once the port is ours: a second `make run` on the same port stops above,
        # before it could wipe the first one's database.
        return _serve_on(sock, prepare(db, "server"), console)
    finally:
        sock.close()  # serving closes it too; this is for a failure before


def _serve_on(sock: socket.socket, setup: Setup, console: Console) -> int:
    """:func:`serve_demo` once the port is bound and the demo's files are fresh."""
    from ratchet.demo import workflow

    app = workflow.app
    app.database_url = setup.url
    # The embedded worker's steps log where the worker processes' do.
    os.environ["RATCHET_DEMO_LOG"] = setup.log_path
    demo = Demo(console, setup.folder, prefix="server", worker_args=("--queue", QUEUE))
    done, stopping = threading.Event(), threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():  # a second signal while stopping changes nothing
            stopping.set()
            raise _Stop(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        token = asyncio.run(_new_token(setup.url))
        provider = demo_provider(setup)
        api = create_app(app, workers=1)
        with (
            serve(provider) as llm,
            serve_in_thread(
                api,
                sock,
                "ratchet server",
                on_shutdown=lambda: drain(api),
                log_config=None,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=GRACEFUL_S,
            ) as base,
        ):
            setup.env["RATCHET_DEMO_LLM_URL"] = os.environ["RATCHET_DEMO_LLM_URL"] = llm
            try:
                _header(console, base, token, setup)
                code = _play(demo, base, token, setup, provider)
                if code:
                    return code
                done.set()
                _serving(console, base, token)
                while True:
                    signal.pause()
            finally:
                demo.stop_all()
    except _Stop as e:
        name = signal.Signals(e.signum).name
        if not done.is_set():
            console.print(Text(f"stopped by {name} before the demo was done", style="bold"))
            return 128 + e.signum
        console.print(
            Text(
                f"{name}: the server stopped; its embedded worker handed its runs "
                "back to the queue",
                style="bold",
            )
        )
        return 0
    except DemoFailed as e:
        return demo.failed(e)
    finally:
        app.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _new_token(url: str) -> str:
    """A token for the demo's tenant, with every scope. Opening the store first creates
    and migrates the fresh database."""
    store = make_store(url)
    await store.open()
    try:
        _, secret = await tokens.create_token(store, TENANT, tokens.SCOPES, "ratchet demo --serve")
        return secret
    finally:
        await store.close()


def _line(console: Console, text: str, style: str = "") -> None:
    """A line to copy: never wrapped."""
    console.print(Text(text, style=style), soft_wrap=True)


def _curl_events(base: str, run_id: str) -> str:
    return (
        f'curl -N {base}/v1/runs/{run_id}/events -H "Accept: text/event-stream" '
        '-H "Authorization: Bearer $RATCHET_TOKEN"'
    )


def _header(console: Console, base: str, token: str, setup: Setup) -> None:
    console.print(
        Text("Ratchet server", style="bold"),
        Text(f"— the HTTP API with one embedded worker, on {setup.shown}", style="dim"),
    )
    _line(console, f"URL: {base}  (OpenAPI: {base}/docs)")
    _line(console, f"export RATCHET_TOKEN={token}")
    console.print(
        Text(
            f"(a fresh token of tenant {TENANT} with every scope; only its hash is stored)",
            style="dim",
        )
    )


def _play(demo: Demo, base: str, token: str, setup: Setup, provider: LocalProvider) -> int:
    from ratchet.demo.workflow import invocations

    say = demo.say
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=WAIT_S + 10) as http:
        # The first answer to the model call is held: worker 1 is killed while it waits.
        provider.fail("slow", times=1, delay_s=HOLD_S, endpoint="chat")
        w1 = demo.start_worker(setup.env)
        say(
            f"worker 1 launched: ratchet worker ratchet.demo.workflow:app --worker-id {WORKER_ID} "
            f"--queue {QUEUE} (pid {w1.pid})"
        )
        run_id = f"ticket-4711-{uuid.uuid4().hex[:6]}"
        started = http.post(
            "/v1/runs",
            json={
                "workflow": "answer_ticket",
                "input": {"ticket_id": "T-4711"},
                "run_id": run_id,
                "queue": QUEUE,
            },
        )
        if started.status_code != 202:
            raise DemoFailed(f"POST /v1/runs answered {started.status_code}: {started.text}")
        say(
            f"POST /v1/runs → 202: run {run_id} of answer_ticket('T-4711') queued on queue "
            f"{QUEUE}, which only the demo's worker processes take"
        )
        stream = _Follower(base, headers, run_id)
        demo.console.print(
            Text(
                "follow its journal live (a late start replays it from the first event):",
                style="dim",
            )
        )
        _line(demo.console, "  " + _curl_events(base, run_id))

        t_kill = demo.kill_mid_call(w1, provider, lambda: _journal(http, run_id))
        health = http.get("/healthz").status_code
        status = _run(http, run_id)["status"]
        say(
            f"the server kept serving: GET /healthz {health}; GET /v1/runs/{run_id}: "
            f"still {status}, under the dead worker's lease"
        )
        if health != 200 or status != "running":
            raise DemoFailed(
                f"expected the server up and the run running after the kill, "
                f"found /healthz {health} and status {status}"
            )

        w2 = demo.start_worker(setup.env)
        say(
            f"worker 2 launched with the same worker id {WORKER_ID} (pid {w2.pid}): it "
            "reclaims the run at once instead of waiting for the lease to expire"
        )
        result = _result(http, run_id)
        say(
            Text(
                f"GET /v1/runs/{run_id}/result: succeeded, "
                f"{time.monotonic() - t_kill:.2f}s after the kill",
                style="bold green",
            )
        )
        demo.stop(w2)

        ended = stream.wait(WAIT_S)
        journal = _journal(http, run_id)
        # The steps log the engine's run id: the tenant's, in its namespace.
        checks = report(
            demo.console,
            tenants.scoped_id(TENANT, run_id),
            journal,
            _run(http, run_id)["status"],
            {w1.pid: 1, w2.pid: 2},
            invocations(setup.log_path),
            provider.requests(),
        )
        checks.append(_stream_check(stream, ended, journal))
    return verdict(demo, checks, result, "the journal again: " + _curl_events(base, run_id))


def _run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    r = http.get(f"/v1/runs/{run_id}")
    if r.status_code != 200:
        raise DemoFailed(f"GET /v1/runs/{run_id} answered {r.status_code}: {r.text}")
    found: dict[str, Any] = r.json()
    return found


def _result(http: httpx.Client, run_id: str) -> Any:
    """The run's output, once it succeeded (long polls on /result)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = http.get(f"/v1/runs/{run_id}/result", params={"wait": 5})
        body = r.json()
        if r.status_code == 200 and body.get("status") == "succeeded":
            return body["output"]
        if r.status_code != 202 or time.monotonic() > deadline:
            raise DemoFailed(f"the run did not succeed after the restart: {r.status_code} {r.text}")


def _journal(http: httpx.Client, run_id: str) -> list[_Seen]:
    """The run's whole journal, page by page (GET /v1/runs/{id}/events)."""
    seen: list[_Seen] = []
    while True:
        r = http.get(
            f"/v1/runs/{run_id}/events",
            params={"after_seq": seen[-1].seq if seen else 0, "limit": 500},
        )
        if r.status_code != 200:
            raise DemoFailed(f"GET /v1/runs/{run_id}/events answered {r.status_code}: {r.text}")
        page = r.json()["events"]
        if not page:
            return seen
        seen += [_Seen(e["seq"], e["kind"], e["step_id"], e["payload"]) for e in page]


def _stream_check(stream: _Follower, ended: bool, journal: list[_Seen]) -> tuple[bool, str]:
    want = [(e.seq, e.kind) for e in journal]
    got = stream.frames
    resumed = sum(1 for _, kind in got if kind == "run_resumed")
    held = ended and stream.error is None and got == want and resumed == 1
    if held:
        return True, (
            f"one event stream (SSE), opened before the kill, received all "
            f"{len(want)} journal events once, in order, run_resumed included, "
            "and ended after run_succeeded"
        )
    trouble = (
        stream.error
        or ("it had not ended" if not ended else "")
        or f"seqs {[seq for seq, _ in got]}, run_resumed {resumed} times"
    )
    return False, (
        f"the event stream opened before the kill received {len(got)} events "
        f"for a journal of {len(want)}: {trouble}"
    )


def _serving(console: Console, base: str, token: str) -> None:
    console.print()
    console.print(
        Text(
            f"ratchet server keeps serving on {base}, its embedded worker driving "
            "the runs you start; Ctrl-C stops it. In another terminal:",
            style="bold",
        ),
        soft_wrap=True,
    )
    _line(console, f"  export RATCHET_TOKEN={token}")
    _line(
        console,
        f'  curl -X POST {base}/v1/runs -H "Authorization: Bearer $RATCHET_TOKEN" '
        '-H "Content-Type: application/json" '
        '-d \'{"workflow": "answer_ticket", "input": {"ticket_id": "T-1001"}}\'',
    )
    console.print(Text("then follow the run it answers with, RUN_ID:", style="dim"))
    _line(console, "  " + _curl_events(base, "RUN_ID"))
