"""Model requests in the journal, on SQLite and PostgreSQL: each LLM step's request is in its
``step_started``, each distinct message once per run, referenced by the requests after it;
read back whole by ``ratchet.model.requests``; covered by the hash chain and the receipt;
and checked on replay, where a prompt changed under a parked run fails it or, opted in, is
journaled as ``request_drifted``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from crash_app import LLM_SECRET
from waiting import wait_for

import ratchet
from ratchet.errors import InvalidInput
from ratchet.llm.request_parts import as_json
from ratchet.llm.server import LocalProvider
from ratchet.model import Event, dumps, request_of, requests_of
from ratchet.model.requests import digest
from ratchet.receipts import verify
from ratchet.receipts.verify import VerificationFailed
from ratchet.store.base import Store

MODEL = "gpt-4.1-mini"
CHAT = "openai.chat.completions.create"
pytestmark = pytest.mark.usefixtures("collect_clients")


def clients(base: str) -> tuple[Any, Any]:
    return (
        ratchet.llm.wrap(openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET)),
        ratchet.llm.wrap(anthropic.AsyncAnthropic(base_url=base, api_key=LLM_SECRET)),
    )


def wait_parked(app: ratchet.Ratchet, run_id: str) -> None:
    wait_for(lambda: app.get(run_id).status == ratchet.RunStatus.WAITING, what="the park")


def started(app: ratchet.Ratchet, run_id: str) -> list[Event]:
    return [e for e in app.events(run_id) if e.kind == "step_started" and "request" in e.payload]


def test_a_conversation_journals_each_message_once_and_reads_back_whole(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    oai, claude = clients(base)
    app = make_app()
    sent: list[dict[str, Any]] = []  # each request as the workflow made it, as JSON

    @app.workflow()
    async def talk(turns: int) -> int:
        messages: list[Any] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "q0 é"},
        ]
        for i in range(turns):
            sent.append({"messages": as_json(messages), "temperature": 0.2})
            r = await oai.chat.completions.create(
                model=MODEL,
                messages=messages,
                temperature=0.2,
                extra_headers={"X-Trace": "t-1"},
            )
            messages.append(r.choices[0].message)  # the SDK's own object, as the SDK allows
            messages.append({"role": "user", "content": f"q{i + 1}"})
        thread: list[Any] = [{"role": "user", "content": "hello"}]
        m = await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=32, system="Be kind.", messages=thread
        )
        thread += [{"role": "assistant", "content": m.content}, {"role": "user", "content": "more"}]
        await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=32, system="Be kind.", messages=thread
        )
        sent.append({"messages": as_json(thread)})
        return len(messages)

    app.launch()
    run_id = app.start(talk, 4)
    assert app.result(run_id, timeout_s=30) == 10
    events = app.events(run_id)
    starts = started(app, run_id)
    assert [e.step_id for e in starts] == [
        *(f"{i}:{CHAT}" for i in range(1, 5)),
        "5:anthropic.messages.create",
        "6:anthropic.messages.create",
    ]
    # Each turn references the one before and adds the answer and the next question.
    first, second = starts[0].payload["request"], starts[1].payload["request"]
    assert first["messages"]["from"] is None and first["messages"]["keep"] == 0
    assert second["messages"]["from"] == f"1:{CHAT}" and second["messages"]["keep"] == 2
    assert len(second["messages"]["add"]) == 2 and len(second["bodies"]) == 2
    assert second["params"] == {"model": MODEL, "temperature": 0.2}  # never a header
    # Every distinct message is stored once in the run.
    stored = [d for e in starts for d in e.payload["request"]["bodies"]]
    assert len(stored) == len(set(stored))
    for e in starts:
        for key, body in e.payload["request"]["bodies"].items():
            assert digest(body) == key
    # Read back whole: exactly what each call sent.
    resolved = requests_of(events)
    chats = [resolved[f"{i}:{CHAT}"] for i in range(1, 5)]
    assert [{"messages": r["messages"], "temperature": r["temperature"]} for r in chats] == sent[:4]
    assert chats[3]["messages"][2]["role"] == "assistant"
    assert chats[3]["messages"][2]["content"].startswith("echo: q0")
    last = request_of(events, "6:anthropic.messages.create")
    assert last is not None
    assert last["messages"] == sent[4]["messages"] and last["system"] == "Be kind."
    assert last["messages"][1]["content"][0]["type"] == "text"
    assert request_of(events, "nope") is None
    # The request replaces the step's args: the messages are not journaled twice.
    assert all("args" not in e.payload for e in starts)


def test_streams_and_gated_calls_journal_their_requests(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    oai, _ = clients(base)
    app = make_app()
    ask = [{"role": "user", "content": "stream me"}]

    @app.workflow()
    async def both() -> str:
        stream = await oai.chat.completions.create(model=MODEL, messages=ask, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        gated = await oai.chat.completions.create(
            model=MODEL,
            messages=[
                *ask,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "ok"},
            ],
            ratchet_gate=ratchet.Gate(threshold=0.0, source="judge", on_below="fail"),
        )
        return str(gated.choices[0].message.content)

    app.launch()
    run_id = app.start(both)
    app.result(run_id, timeout_s=30)
    resolved = requests_of(app.events(run_id))
    stream_req, gated_req = resolved[f"1:{CHAT}"], resolved[f"2:{CHAT}"]
    assert stream_req["messages"] == ask and stream_req["stream"] is True
    assert gated_req["messages"][0] == ask[0] and gated_req["messages"][2]["content"] == "ok"
    assert "ratchet_gate" not in gated_req
    gated = started(app, run_id)[1].payload["request"]["messages"]
    assert (gated["from"], gated["keep"]) == (f"1:{CHAT}", 1)
    judges = [s for s in resolved if s.startswith("3:")]  # the gate's judge, a call too
    assert judges and resolved[judges[0]]["messages"][0]["role"] == "user"


def test_a_redrive_reads_the_requests_back_once_and_goes_on_referencing_them(
    make_app: Callable[..., ratchet.Ratchet],
    provider: tuple[LocalProvider, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, base = provider
    oai, _ = clients(base)
    reads: list[str] = []
    load = Store.load_requests

    async def counted(self: Store, run_id: str) -> Any:
        reads.append(run_id)
        return await load(self, run_id)

    monkeypatch.setattr(Store, "load_requests", counted)
    app = make_app()

    @app.step
    async def plain(n: int) -> int:
        return n

    @app.workflow()
    async def parked() -> list[str]:
        messages: list[Any] = [{"role": "user", "content": "one"}]
        first = await oai.chat.completions.create(model=MODEL, messages=messages)
        await ratchet.wait_for_signal("go")  # the next drive replays the first call
        messages += [first.choices[0].message, {"role": "user", "content": "two"}]
        second = await oai.chat.completions.create(model=MODEL, messages=messages)
        return [str(first.choices[0].message.content), str(second.choices[0].message.content)]

    @app.workflow()
    async def no_model() -> int:
        await ratchet.wait_for_signal("go")
        return await plain(1) + await plain(2)

    app.launch()
    run_id = app.start(parked)
    quiet = app.start(no_model)
    wait_parked(app, run_id)
    wait_parked(app, quiet)
    assert reads == []  # a first drive has nothing to read back
    app.signal(run_id, "go")
    app.signal(quiet, "go")
    assert app.result(run_id, timeout_s=30) == ["echo: one", "echo: two"]
    assert app.result(quiet, timeout_s=30) == 3
    assert reads == [run_id]  # one read, by the drive with a model call; none for the other
    second = started(app, run_id)[1].payload["request"]
    assert second["messages"]["from"] == f"1:{CHAT}" and second["messages"]["keep"] == 1
    assert len(second["bodies"]) == 2  # the answer and the new question, nothing else


def _drifting(app: ratchet.Ratchet, oai: Any, prompt: dict[str, Any], drift: str) -> None:
    @app.workflow(name="drifting", request_drift=drift)
    async def drifting() -> str:
        messages = [
            {"role": "system", "content": prompt["system"]},
            {"role": "user", "content": "hi"},
        ]
        first = await oai.chat.completions.create(
            model=MODEL, messages=messages, temperature=prompt["temperature"]
        )
        await ratchet.wait_for_signal("go")
        return str(first.choices[0].message.content)


def test_a_prompt_changed_under_a_parked_run_fails_it_naming_the_step_and_message(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    oai, _ = clients(base)
    prompt: dict[str, Any] = {"system": "You are terse.", "temperature": 0.2}
    app = make_app()
    _drifting(app, oai, prompt, "error")
    app.launch()
    run_id = app.start("drifting")
    wait_parked(app, run_id)
    prompt["system"] = "You are verbose."  # the code changed under the run
    app.signal(run_id, "go")
    with pytest.raises(ratchet.RunFailed) as failed:
        app.result(run_id, timeout_s=30)
    error = str(failed.value)
    assert "NonDeterminismError" in error and f"'1:{CHAT}'" in error
    assert "message 0 differs" in error
    assert "You are terse." in error and "You are verbose." in error
    ended = app.events(run_id)[-1]
    assert ended.kind == "run_failed" and ended.payload["reason"] == "non_determinism"


def test_a_workflow_that_opts_in_journals_the_drift_and_goes_on(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai, _ = clients(base)
    prompt: dict[str, Any] = {"system": "You are terse.", "temperature": 0.2}
    app = make_app()
    _drifting(app, oai, prompt, "warn")
    app.launch()
    run_id = app.start("drifting")
    wait_parked(app, run_id)
    prompt["temperature"] = 0.9  # the same messages, another param
    app.signal(run_id, "go")
    assert app.result(run_id, timeout_s=30) == "echo: hi"  # the journaled answer
    assert server.stats()["billed_calls"] == 1  # never sent again
    drifts = [e for e in app.events(run_id) if e.kind == "request_drifted"]
    assert len(drifts) == 1 and drifts[0].step_id == f"1:{CHAT}"
    difference = drifts[0].payload["difference"]
    assert difference == {"param": "temperature", "journaled": "0.2", "now": "0.9"}
    assert "param 'temperature' differs" in drifts[0].payload["message"]


def test_request_drift_takes_error_or_warn_only(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()
    with pytest.raises(InvalidInput, match="request_drift must be one of 'error', 'warn'"):

        @app.workflow(request_drift="ignore")
        async def wf() -> None:
            return None

    assert "wf" not in app.workflows


def test_the_receipt_covers_the_requests_and_a_changed_message_breaks_it(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    oai, _ = clients(base)
    app = make_app()

    @app.workflow()
    async def two() -> str:
        messages: list[Any] = [{"role": "user", "content": "pay 10 EUR"}]
        r = await oai.chat.completions.create(model=MODEL, messages=messages)
        messages += [r.choices[0].message, {"role": "user", "content": "confirm"}]
        r = await oai.chat.completions.create(model=MODEL, messages=messages)
        return str(r.choices[0].message.content)

    app.launch()
    run_id = app.start(two)
    app.result(run_id, timeout_s=30)
    envelope = app.run_receipt(run_id)
    events = app.events(run_id)
    lines = [dumps(e.export_dict()) for e in events]
    assert verify(envelope, lines, app.signer.public).run_id == run_id
    # A journaled message body changed: the event's hash no longer matches its content.
    i = next(i for i, e in enumerate(events) if e.kind == "step_started" and "request" in e.payload)
    d = json.loads(lines[i])
    body = next(iter(d["payload"]["request"]["bodies"].values()))
    body["content"] = "pay 1000 EUR"
    tampered = [*lines[:i], dumps(d), *lines[i + 1 :]]
    with pytest.raises(VerificationFailed, match=f"seq {i + 1}: its hash does not match"):
        verify(envelope, tampered, app.signer.public)


def test_journals_without_requests_read_as_no_request() -> None:
    old = Event.chain(
        "r", 1, "step_started", f"1:{CHAT}", 1, {"kind": "llm", "model": MODEL}, 1.0, "0" * 64
    )
    odd = Event.chain(
        "r", 2, "step_started", f"2:{CHAT}", 1, {"request": {"messages": 3}}, 2.0, old.hash
    )
    assert requests_of([old, odd]) == {}
    assert request_of([old], f"1:{CHAT}") is None


def test_a_retry_and_parallel_calls_store_no_message_twice(
    make_app: Callable[..., ratchet.Ratchet], provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    oai = ratchet.llm.wrap(
        openai.AsyncOpenAI(base_url=base + "/v1", api_key=LLM_SECRET),
        retry=ratchet.Retry(max_attempts=2, backoff_ms=10, retry_on=("llm",)),
    )
    app = make_app()
    system: Any = {"role": "system", "content": "You answer questions about orders."}

    @app.workflow()
    async def fan() -> list[str]:
        first = await oai.chat.completions.create(
            model=MODEL, messages=[system, {"role": "user", "content": "a"}]
        )
        both = await asyncio.gather(
            *(
                oai.chat.completions.create(
                    model=MODEL, messages=[system, {"role": "user", "content": q}]
                )
                for q in ("b", "c")
            )
        )
        return [str(r.choices[0].message.content) for r in (first, *both)]

    server.fail("429", times=1)  # the first call is retried
    app.launch()
    run_id = app.start(fan)
    assert app.result(run_id, timeout_s=30) == ["echo: a", "echo: b", "echo: c"]
    starts = started(app, run_id)
    assert [(e.step_id, e.attempt) for e in starts] == [
        (f"1:{CHAT}", 1),
        (f"1:{CHAT}", 2),
        (f"2:{CHAT}", 1),
        (f"3:{CHAT}", 1),
    ]
    retry = starts[1].payload["request"]
    # The retry sends what the first attempt sent, every message journaled already; it
    # never names its own step.
    assert retry["bodies"] == {} and retry["messages"]["from"] is None
    assert len(retry["messages"]["add"]) == 2
    # The parallel calls share the system prompt with the first call: stored once.
    for e in starts[2:]:
        request = e.payload["request"]
        assert request["messages"]["keep"] == 1 and len(request["bodies"]) == 1
    stored = [d for e in starts for d in e.payload["request"]["bodies"]]
    assert len(stored) == len(set(stored)) == 4
    resolved = requests_of(app.events(run_id))
    assert [resolved[f"{i}:{CHAT}"]["messages"][1]["content"] for i in (1, 2, 3)] == [
        "a",
        "b",
        "c",
    ]
