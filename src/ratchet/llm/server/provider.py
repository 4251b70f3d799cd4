"""The local provider: what it answers to a model request, what it bills, what it keeps.

One request goes: read the body (a bad one is refused, 400) → take a queued fault (a 429
or 500 answers now, unbilled) → look its ``Idempotency-Key`` up (replay, conflict 422, or
wait for the duplicate in flight) → compose the reply, render it, store it under the key
and bill it → hand the answer to the route, which sends it (or, for a ``drop`` fault,
closes the connection). Billing and storing happen before anything is sent, so a client
that dies mid-call still leaves its call billed once and stored.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratchet.llm.server.answer import Answer, Outcome, new_id
from ratchet.llm.server.chat import read_chat, render_chat
from ratchet.llm.server.embeddings import EmbeddingRequest, read_embeddings, render_embeddings
from ratchet.llm.server.faults import FaultQueue
from ratchet.llm.server.idempotency import (
    Claim,
    Conflict,
    IdempotencyStore,
    Replay,
    Wait,
    fingerprint,
)
from ratchet.llm.server.messages import read_messages, render_messages
from ratchet.llm.server.prompt import BadRequest, Prompt
from ratchet.llm.server.replies import Reply, RuleBook, compose
from ratchet.llm.server.request_log import RequestLog
from ratchet.llm.server.responses import read_responses, render_responses
from ratchet.llm.server.routes import build_app
from ratchet.llm.server.script import FaultSpec, fault_spec, load_script

_Reader = Callable[[Any], Prompt]
_Renderer = Callable[[dict[str, Any], Prompt, Reply], Answer]
_CHAT_LIKE: dict[str, tuple[_Reader, _Renderer]] = {
    "chat": (read_chat, render_chat),
    "responses": (read_responses, render_responses),
    "messages": (read_messages, render_messages),
}


class LocalProvider:
    """A stand-in for OpenAI and Anthropic, spoken to by their official SDKs.

    ``script`` (a YAML/JSON file path or a dict) holds reply rules and faults queued at
    start; without one every reply is ``"echo: <last user message>"``. ``log_path``, when
    given, receives one JSON line per request. ``app`` is the ASGI application; serve it
    with :func:`ratchet.llm.server.serve` or ``ratchet llm-server``.
    """

    def __init__(
        self, script: str | Path | dict[str, Any] | None = None, log_path: str | Path | None = None
    ) -> None:
        self.script = load_script(script)
        self._rules = RuleBook(self.script.rules)
        self._faults = FaultQueue()
        self._log = RequestLog(log_path)
        self._keys = IdempotencyStore()
        for spec in self.script.faults:
            self._faults.add(spec)
        self.app = build_app(self)

    # -- what tests and benches use ------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """``received`` (counted once a body is in), ``requests`` (answered), ``billed_calls``,
        ``billed_input_tokens``, ``billed_output_tokens``, ``replayed``, ``refused``,
        ``faults``."""
        return self._log.stats()

    def requests(self) -> list[dict[str, Any]]:
        """The request log: one dict per answered request, oldest first."""
        return self._log.entries()

    def fail(
        self,
        kind: str | int,
        times: int = 1,
        *,
        retry_after: float | None = None,
        delay_s: float | None = None,
        endpoint: str | None = None,
        after_events: int | None = None,
    ) -> None:
        """Queue a fault for the next ``times`` requests (on ``endpoint``, or any):
        ``"429"`` (with a ``retry-after`` header when given), ``"500"``, ``"slow"``
        (answers after ``delay_s``), ``"drop"`` (billed, then the connection is closed
        unanswered), ``"stall"`` (a stream pauses ``delay_s`` after its first
        ``after_events`` events), ``"cut"`` (a stream's connection is closed after its first
        ``after_events`` events). Raises :class:`ScriptError` naming a bad argument."""
        self.add_fault(
            fault_spec(
                kind=kind,
                times=times,
                retry_after=retry_after,
                delay_s=delay_s,
                after_events=after_events,
                endpoint=endpoint,
            )
        )

    def add_fault(self, spec: FaultSpec) -> None:
        """Queue an already validated fault."""
        self._faults.add(spec)

    def pending_faults(self) -> list[dict[str, Any]]:
        """The faults still queued."""
        return self._faults.pending()

    def reset(self) -> None:
        """Back to the state the provider started in: no requests, no counts, no stored
        keys, each rule's ``times`` whole again and the script's faults queued again."""
        self._log.reset()
        self._keys.clear()
        self._rules.reset()
        self._faults.clear()
        for spec in self.script.faults:
            self._faults.add(spec)

    # -- what the routes call ------------------------------------------------------------

    def arrived(self) -> None:
        """Count a model request whose body has arrived."""
        self._log.received()

    def refuse(self, path: str, status: int, message: str) -> Outcome:
        """A request to no model endpoint: logged and counted as refused."""
        outcome = Outcome(status, new_id("req_"), error=message)
        self._log.record(
            {
                "at": time.time(),
                "path": path,
                "endpoint": None,
                "status": status,
                "billed": False,
                "replayed": False,
                "input_tokens": 0,
                "output_tokens": 0,
                "request_id": outcome.request_id,
            }
        )
        return outcome

    async def answer(self, endpoint: str, path: str, key: str | None, raw: bytes) -> Outcome:
        """Answer one model request (see the module's docstring for the steps)."""
        entry: dict[str, Any] = {
            "at": time.time(),
            "path": path,
            "endpoint": endpoint,
            "model": None,
            "idempotency_key": key,
            "status": None,
            "billed": False,
            "replayed": False,
            "input_tokens": 0,
            "output_tokens": 0,
            "fault": None,
            "request_id": new_id("req_"),
        }

        def done(outcome: Outcome) -> Outcome:
            entry["status"] = None if outcome.drop else outcome.status
            self._log.record(entry)
            return outcome

        try:
            body = json.loads(raw)
        except ValueError as e:
            return done(
                Outcome(400, entry["request_id"], error=f"the request body is not valid JSON: {e}")
            )
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            entry["model"] = body["model"]
        try:
            request = _read(endpoint, body)
        except BadRequest as e:
            return done(Outcome(400, entry["request_id"], error=e.message, error_param=e.param))
        if key == "":
            return done(
                Outcome(
                    400,
                    entry["request_id"],
                    error="the Idempotency-Key header is empty",
                    error_param="Idempotency-Key",
                )
            )

        fault = self._faults.take(endpoint)
        if fault is not None:
            entry["fault"] = fault.kind
        if fault is not None and fault.kind in ("429", "500"):
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            return done(_faulted(fault, entry["request_id"]))
        drop = fault is not None and fault.kind == "drop"
        stall: tuple[int, float] | None = None
        cut: int | None = None
        after = 1 if fault is None or fault.after_events is None else fault.after_events
        if fault is not None and fault.kind == "stall" and getattr(request, "stream", False):
            stall = (after, fault.delay_s or 0.0)
        if fault is not None and fault.kind == "cut":
            cut = after
        delay = fault.delay_s if fault is not None and stall is None else None

        claim: Claim | None = None
        if key is not None:
            found = await self._claim(key, fingerprint(path, body))
            if isinstance(found, Conflict):
                return done(
                    Outcome(
                        422,
                        entry["request_id"],
                        error_param="Idempotency-Key",
                        error=f"Idempotency-Key {key!r} was already used with a "
                        "different request body; use a new key for a new request",
                    )
                )
            if isinstance(found, Replay):
                if delay:
                    await asyncio.sleep(delay)
                usage = found.answer.usage
                entry.update(
                    replayed=True,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                )
                return done(
                    Outcome(
                        200,
                        entry["request_id"],
                        answer=found.answer,
                        headers={"Idempotent-Replayed": "true"},
                        drop=drop,
                        stall=stall,
                        cut_after=cut,
                    )
                )
            claim = found
        try:
            if delay:
                await asyncio.sleep(delay)
            answer = self._compute(endpoint, body, request)
        except BaseException:
            if claim is not None:
                self._keys.release(claim)
            raise
        if claim is not None:
            self._keys.store(claim, answer)
        entry.update(
            billed=True,
            input_tokens=answer.usage.input_tokens,
            output_tokens=answer.usage.output_tokens,
        )
        return done(
            Outcome(200, entry["request_id"], answer=answer, drop=drop, stall=stall, cut_after=cut)
        )

    async def _claim(self, key: str, print_: str) -> Claim | Replay | Conflict:
        """Claim the key, or find its stored answer or a conflict; a duplicate in flight
        is waited for first."""
        while True:
            found = self._keys.begin(key, print_)
            if not isinstance(found, Wait):
                return found
            # Shielded: a waiter that goes away must not cancel the others' future.
            await asyncio.shield(found.done)

    def _compute(self, endpoint: str, body: Any, request: Prompt | EmbeddingRequest) -> Answer:
        if isinstance(request, EmbeddingRequest):
            return render_embeddings(request)
        reply = compose(request, self._rules.pick(request))
        return _CHAT_LIKE[endpoint][1](body, request, reply)


def _read(endpoint: str, body: Any) -> Prompt | EmbeddingRequest:
    if endpoint == "embeddings":
        return read_embeddings(body)
    return _CHAT_LIKE[endpoint][0](body)


def _faulted(fault: FaultSpec, request_id: str) -> Outcome:
    headers = {}
    if fault.retry_after is not None:
        seconds = fault.retry_after
        headers["retry-after"] = str(int(seconds)) if seconds == int(seconds) else str(seconds)
    if fault.kind == "429":
        return Outcome(
            429,
            request_id,
            error="Rate limit reached (a fault queued on the local provider)",
            headers=headers,
        )
    return Outcome(
        500,
        request_id,
        error="The server had an error while processing your "
        "request (a fault queued on the local provider)",
        headers=headers,
    )
