"""The store as a drive inside a sandbox sees it: its journal writes become reports on the
report channel (proposals: the worker outside checks and writes them, see
:mod:`ratchet.sandbox.host`), its journal is read from the channel, and everything else a
drive may ask of a store (parks, child runs, signals, approvals, receipts) is refused
with :class:`NotIsolatable`, since only the worker outside may write those. Its model
calls go to the worker too (:class:`RemoteModels`), which makes them.

Answers map back to what the driver expects from a store: the fence's 409 is
``LeaseLost``, a finished run ``RunFinished``, another conflict ``StoreConflict``, an
unreachable channel or database ``StorageError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import httpx

from ratchet.errors import (
    LeaseLost,
    LLMError,
    LLMRequestError,
    LLMTimeout,
    NotIsolatable,
    RunFinished,
    StorageError,
    StoreConflict,
    ValueRefused,
)
from ratchet.llm.request_parts import as_json
from ratchet.model import Event, Lease, RunRecord, RunStatus, dumps

TIMEOUT_S = 60.0
_LLM_ERRORS: dict[str, type[LLMError]] = {
    "LLMError": LLMError,
    "LLMTimeout": LLMTimeout,
    "LLMRequestError": LLMRequestError,
}


def event_body(ev: Event) -> dict[str, Any]:
    """What a report says of one of the drive's events: its place and time in the journal
    are the worker's."""
    return {
        "kind": ev.kind,
        "step_id": ev.step_id,
        "attempt": ev.attempt,
        "payload_json": ev.payload_json or dumps(ev.payload),
    }


def event_from(run_id: str, body: dict[str, Any]) -> Event:
    import json

    return Event(
        run_id,
        int(body["seq"]),
        body["kind"],
        body["step_id"],
        body["attempt"],
        json.loads(body["payload_json"]),
        float(body["at"]),
        body["prev_hash"],
        body["hash"],
        body["payload_json"],
    )


def record_from(body: dict[str, Any]) -> RunRecord:
    fields = {k: body[k] for k in RunRecord.__dataclass_fields__ if k in body}
    fields["status"] = RunStatus(body["status"])
    return RunRecord(**fields)


class Reporter:
    """The sandbox's client of the report channel."""

    def __init__(self, socket_path: str, token: str, run_id: str, sandbox_id: str) -> None:
        self.run_id = run_id
        self.sandbox_id = sandbox_id
        self.client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url="http://sandbox",
            headers={"Authorization": f"Bearer {token}"},
            timeout=TIMEOUT_S,
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def _send(
        self, method: str, path: str, body: Any = None, timeout: float | None = TIMEOUT_S
    ) -> Any:
        try:
            answer = await self.client.request(method, path, json=body, timeout=timeout)
        except httpx.HTTPError as e:
            raise StorageError(f"the report channel is unreachable: {e}") from e
        if answer.status_code == 200:
            return answer.json()
        try:
            err = answer.json()
            code, message = err.get("error"), err.get("message", "")
        except ValueError:
            err, code, message = {}, None, answer.text
        if code == "llm_error":
            details = err.get("details") or {}
            cls = _LLM_ERRORS.get(str(details.get("type")), LLMRequestError)
            raise cls(
                message,
                provider=details.get("provider"),
                status_code=details.get("status_code"),
                retry_after_s=details.get("retry_after_s"),
                request_id=details.get("request_id"),
            )
        if code == "fenced":
            raise LeaseLost(self.run_id, message)
        if code == "finished":
            raise RunFinished(message)
        if answer.status_code == 409:
            raise StoreConflict(message)
        if answer.status_code >= 500:
            raise StorageError(f"report refused ({answer.status_code}): {message}")
        raise ValueRefused(f"report refused ({answer.status_code}): {message}")

    async def journal(self) -> tuple[RunRecord, list[Event]]:
        body = await self._send("GET", "/v1/runtime/journal")
        return record_from(body["run"]), [event_from(self.run_id, e) for e in body["events"]]

    async def report(self, op: str, events: Sequence[Event]) -> None:
        await self._send(
            "POST",
            "/v1/runtime/report",
            {
                "run_id": self.run_id,
                "sandbox_id": self.sandbox_id,
                "op": op,
                "events": [event_body(e) for e in events],
            },
        )

    async def model_call(
        self, step_id: str, attempt: int, site: str, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The worker's answer to a model call of this step's attempt: (body, meta). No
        deadline of the channel's own: a model may take long, and the step's timeout
        bounds it."""
        answer = await self._send(
            "POST",
            "/v1/runtime/llm",
            {
                "run_id": self.run_id,
                "sandbox_id": self.sandbox_id,
                "step_id": step_id,
                "attempt": attempt,
                "site": site,
                # As the SDK would send it, and as the step journaled its request.
                "kwargs_json": dumps(as_json(kwargs)),
            },
            timeout=None,
        )
        return answer["body"], answer["meta"]


class RemoteModels:
    """A sandbox's model calls (``ratchet.llm.wrap``'s clients): each goes to the worker,
    which makes it with its own client and credentials (see
    :meth:`ratchet.sandbox.host.HostJournal.call_model`)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    async def __call__(
        self, site: str, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from ratchet.engine.context import current_step

        step = current_step()
        try:
            dumps(kwargs)
        except (TypeError, ValueError) as e:
            raise LLMRequestError(
                f"a model call of an isolated run goes to its worker as "
                f"JSON, and its arguments are not: {e}"
            ) from e
        return await self.reporter.model_call(step.step_id, step.attempt, site, kwargs)


def _refuse(what: str) -> NoReturn:
    raise NotIsolatable(
        f"{what} is not available in the isolated tier: a sandbox only reports its steps"
    )


class RemoteStore:
    """What :func:`ratchet.engine.driver.drive` asks of its store, over the report channel."""

    dialect = "sandbox"

    def __init__(self, reporter: Reporter, events: list[Event]) -> None:
        self.reporter = reporter
        self._events: list[Event] | None = events

    async def load_events(self, run_id: str, after: int = 0, limit: int = -1) -> list[Event]:
        events = self._events  # read with the run's record when the harness started
        self._events = None
        if events is None:
            events = (await self.reporter.journal())[1]
        return [e for e in events if e.seq > after][: None if limit < 0 else limit]

    async def load_requests(self, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        """What the store's ``requests_load`` gives, from the journal the channel reads."""
        out: list[tuple[str, str, dict[str, Any]]] = []
        for ev in await self.load_events(run_id):
            if ev.step_id is None:
                continue
            if ev.kind == "step_started" and isinstance(ev.payload.get("request"), dict):
                out.append((ev.kind, ev.step_id, ev.payload["request"]))
            elif ev.kind == "request_drifted":
                out.append((ev.kind, ev.step_id, ev.payload))
        return out

    async def now(self) -> float:
        return time.time()

    @contextlib.contextmanager
    def watching(self, channel: str, key: str = "") -> Iterator[asyncio.Event]:
        yield asyncio.Event()  # nothing outside the sandbox wakes it

    async def append(self, lease: Lease, events: Sequence[Event]) -> None:
        if events:
            await self.reporter.report("append", events)

    async def finish(
        self,
        lease: Lease,
        events: Sequence[Event],
        status: RunStatus,
        output: Any = None,
        error: str | None = None,
        dead_letter: str | None = None,
        receipt: dict[str, Any] | None = None,
    ) -> None:
        # A sandbox holds no signing key (``receipt`` is always None here): the run's
        # receipt is signed outside, the first time it is asked for.
        if not events:
            raise RunFinished(f"run {lease.run_id} has already finished")
        if status not in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            _refuse(f"ending a run as {status}")
        # The run's end is the last event; the worker sets the run's row from it.
        await self.reporter.report("finish", events)

    async def hand_back(self, lease: Lease, events: Sequence[Event]) -> None:
        _refuse("handing a run back")

    # The guards' database-wide history: a sandbox sees its own run only, so the
    # workflow-wide retry storm and the spikes against other runs are not judged inside it.
    async def recent_retries(self, workflow: str, window_s: float) -> int:
        return 0

    async def llm_history(
        self, workflow: str, limit: int
    ) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        return []

    async def park(self, *args: Any) -> Any:
        _refuse("parking a run (a long sleep, a signal, a child run, a long backoff)")

    async def start_child(self, *args: Any) -> Any:
        _refuse("a child run")

    async def consume_signal(self, *args: Any) -> Any:
        _refuse("a signal")

    async def pending_signal(self, *args: Any) -> Any:
        _refuse("a signal")

    async def get_run(self, *args: Any) -> Any:
        _refuse("reading another run")

    async def finished_among(self, *args: Any) -> Any:
        _refuse("waiting for other runs")

    async def ask_approval(self, *args: Any) -> Any:
        _refuse("an approval")

    async def get_approval(self, *args: Any) -> Any:
        _refuse("an approval")

    async def expire_approval(self, *args: Any) -> Any:
        _refuse("an approval")

    async def claim_receipt(self, *args: Any, **kwargs: Any) -> Any:
        _refuse("a delivery receipt")

    async def reclaim_receipt(self, *args: Any) -> Any:
        _refuse("a delivery receipt")

    async def settle_receipt(self, *args: Any) -> Any:
        _refuse("a delivery receipt")
