"""The graph nodes that talk to the outside world, run for real on SQLite and PostgreSQL:
ai-steps through the official SDKs to the local provider (text, structured output, an
agent with tools), and connectors to a local HTTP server (a request, a webhook delivery)
and a local SMTP server (an email). Each is a journaled step; a re-drive (the run parks on
an approval after them, and the decision drives it again) reuses their outputs and sends
nothing a second time."""

from __future__ import annotations

import gc
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from typing import Any

import anthropic
import openai
import psycopg
import pytest
from receivers import HttpReceiver, SmtpReceiver
from waiting import wait_for

import ratchet
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import EventKind, idempotency_key

pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

SCHEMA = {
    "type": "object",
    "required": ["category"],
    "properties": {"category": {"type": "string"}},
}
SCRIPT = {
    "rules": [
        {"match": {"contains": "classify"}, "reply": {"json": {"category": "billing"}}},
        {
            "match": {"contains": "use the tool", "last_role": "user"},
            "reply": {"tool_calls": [{"name": "score", "arguments": {"account": "acme"}}]},
        },
        {"match": {"last_role": "tool"}, "reply": {"text": "acme scores 4"}},
    ]
}


@pytest.fixture(autouse=True)
def _collect_clients() -> Iterator[None]:
    yield
    gc.collect()  # the SDK clients' pools belong to loops that are gone


@pytest.fixture
def provider() -> Iterator[tuple[LocalProvider, str]]:
    p = LocalProvider(SCRIPT)
    with serve(p) as base:
        yield p, base


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with HttpReceiver() as r:
        yield r


CALLS: list[str] = []


@pytest.fixture
def app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()
    CALLS.clear()

    @app.tool
    async def score(account: str) -> dict[str, Any]:
        """How good an account is."""
        CALLS.append(account)
        return {"account": account, "score": len(account)}

    return app


def chain(name: str, nodes: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """A graph running ``nodes`` one after the other from a trigger, then an approval
    ("hold"): deciding it drives the run again, replaying every node before it."""
    ids = ["start", *(n["id"] for n in nodes), "hold"]
    return {
        "name": name,
        "nodes": [{"id": "start", "type": "trigger"}, *nodes, {"id": "hold", "type": "approval"}],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
        **more,
    }


def hold_then_release(app: ratchet.Ratchet, run_id: str) -> None:
    def asked() -> list[ratchet.Approval]:
        rec = app.get(run_id)
        if rec.status.terminal:  # fail now, with the reason, rather than at the deadline
            raise AssertionError(f"run {run_id} ended {rec.status}: {rec.error}")
        # Parked, not only asked: the decision must start a drive of its own.
        return app.approvals(run_id) if rec.status == ratchet.RunStatus.WAITING else []

    pending = wait_for(asked, what="the hold approval")
    app.approve(run_id, pending[0].step_id, by="ana")


def events(app: ratchet.Ratchet, run_id: str, kind: str) -> list[ratchet.Event]:
    return [e for e in app.events(run_id) if e.kind == kind]


def test_ai_steps_are_llm_steps_replayed_without_calling_the_provider(
    app: ratchet.Ratchet, provider: tuple[LocalProvider, str]
) -> None:
    server, base = provider
    app.llm_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"))
    app.llm_client(anthropic.AsyncAnthropic(base_url=base, api_key="local"))
    app.graph(
        chain(
            "ai",
            [
                {
                    "id": "plain",
                    "type": "ai-step",
                    "data": {
                        "model": "gpt-4.1-mini",
                        "prompt": "hello {{ input.who }}",
                        "system": "Be brief.",
                    },
                },
                {
                    "id": "classify",
                    "type": "ai-step",
                    "data": {
                        "model": "gpt-4.1-mini",
                        "prompt": "classify {{ nodes.plain.output }}",
                        "output_schema": SCHEMA,
                    },
                },
                {
                    "id": "claude",
                    "type": "ai-step",
                    "data": {
                        "model": "claude-sonnet-4-6",
                        "prompt": "sort {{ input.who }}",
                        "output_schema": SCHEMA,
                        "max_tokens": 64,
                    },
                },
                {
                    "id": "agent",
                    "type": "ai-step",
                    "data": {"model": "gpt-4.1-mini", "prompt": "use the tool", "tools": ["score"]},
                },
            ],
            output={
                "plain": "{{ nodes.plain.output }}",
                "classify": "{{ nodes.classify.output }}",
                "claude": "{{ nodes.claude.output }}",
                "agent": "{{ nodes.agent.output }}",
            },
        )
    )
    with app:
        app.launch()
        run_id = app.start("ai", {"who": "ana"})
        hold_then_release(app, run_id)
        out = app.result(run_id, timeout_s=30)
    assert out["plain"] == "echo: hello ana"
    assert out["classify"] == {"category": "billing"}
    # Anthropic's structured output: the schema is sent as output_config, and the local
    # provider answers with a value of that shape.
    assert isinstance(out["claude"], dict) and isinstance(out["claude"]["category"], str)
    assert out["agent"] == "acme scores 4"
    assert CALLS == ["acme"]

    started = events(app, run_id, EventKind.STEP_STARTED)
    llm = [e for e in started if e.payload.get("kind") == "llm"]
    assert [e.step_id for e in llm] == [
        "1:plain",
        "2:classify",
        "3:claude",
        "4:openai.chat.completions.create",
        "6:openai.chat.completions.create",
    ]
    assert [e.payload["provider"] for e in llm] == ["openai"] * 2 + ["anthropic"] + ["openai"] * 2
    # Each call went out once, under its step's key, and was billed once: the second
    # drive (after the approval) replayed all five from the journal.
    keys = [idempotency_key(run_id, e.step_id or "", 1) for e in llm]
    assert [r["idempotency_key"] for r in server.requests()] == keys
    assert server.stats()["billed_calls"] == 5
    drives = [e for e in app.events(run_id) if e.kind in ("run_started", "run_resumed")]
    assert len(drives) == 2
    completed = {e.step_id: e for e in events(app, run_id, EventKind.STEP_COMPLETED)}
    assert completed["1:plain"].payload["llm"]["usage"]["output_tokens"] > 0


def test_a_structured_answer_that_is_not_json_fails_the_node_naming_it(
    app: ratchet.Ratchet, provider: tuple[LocalProvider, str]
) -> None:
    _, base = provider
    app.llm_client(openai.AsyncOpenAI(base_url=base + "/v1", api_key="local"))
    app.graph(
        chain(
            "bad-json",
            [
                {
                    "id": "agent",
                    "type": "ai-step",
                    "data": {
                        "model": "gpt-4.1-mini",
                        "prompt": "use the tool",
                        "tools": ["score"],
                        "output_schema": SCHEMA,
                    },
                }
            ],
        )
    )
    with app:
        app.launch()
        run_id = app.start("bad-json", {})
        with pytest.raises(
            ratchet.RunFailed,
            match=r"node agent: the model's answer is not "
            r"the JSON its output_schema asks for",
        ):
            app.result(run_id, timeout_s=30)


def test_an_http_connector_is_a_step_retried_on_5xx_and_refused_on_4xx(
    app: ratchet.Ratchet, receiver: HttpReceiver
) -> None:
    app.graph(
        chain(
            "http",
            [
                {
                    "id": "get",
                    "type": "connector",
                    "data": {"url": receiver.url + "/items/{{ input.item }}", "method": "GET"},
                },
                {
                    "id": "post",
                    "type": "connector",
                    "data": {
                        "url": receiver.url + "/notes",
                        "headers": {"X-Who": "{{ input.who }}"},
                        "body": {"item": "{{ input.item }}", "got": "{{ nodes.get.output.body }}"},
                        "retry": {
                            "maxAttempts": 2,
                            "backoffMs": 10,
                            "retryableClasses": ["connector"],
                        },
                    },
                },
            ],
            output={"get": "{{ nodes.get.output }}", "post": "{{ nodes.post.output }}"},
        )
    )
    with app:
        app.launch()
        receiver.fail_next(200)  # the GET
        receiver.fail_next(503)  # the POST's first attempt
        run_id = app.start("http", {"item": 7, "who": "ana"})
        hold_then_release(app, run_id)
        out = app.result(run_id, timeout_s=30)
        assert out["get"] == {"status": 200, "body": {"received": 1, "path": "/items/7"}}
        assert out["post"] == {"status": 200, "body": {"received": 3, "path": "/notes"}}
        assert [(r["method"], r["path"]) for r in receiver.requests] == [
            ("GET", "/items/7"),
            ("POST", "/notes"),
            ("POST", "/notes"),
        ]
        post = receiver.requests[2]
        assert post["headers"]["x-who"] == "ana"
        assert post["body"] == {"item": 7, "got": {"received": 1, "path": "/items/7"}}
        assert "idempotency-key" not in post["headers"]  # a plain request, not a delivery
        retrying = events(app, run_id, EventKind.STEP_RETRYING)
        assert [e.step_id for e in retrying] == ["2:post"]
        assert "answered 503" in retrying[0].payload["error"]
        # A graph node's step journals what it was called with: the rendered request.
        started = events(app, run_id, EventKind.STEP_STARTED)
        sent = [e.payload["args"]["request"] for e in started if e.step_id == "2:post"]
        assert [r["headers"] for r in sent] == [{"X-Who": "ana"}] * 2
        assert sent[0]["body"] == {"item": 7, "got": {"received": 1, "path": "/items/7"}}

        receiver.fail_next(404)
        app.graph(
            chain(
                "http-404",
                [
                    {
                        "id": "get",
                        "type": "connector",
                        "data": {
                            "url": receiver.url + "/nope",
                            "retry": {"maxAttempts": 3, "backoffMs": 10},
                        },
                    }
                ],
            )
        )
        bad = app.start("http-404", {})
        with pytest.raises(
            ratchet.RunFailed,
            match=r"POST http://127\.0\.0\.1:\d+/nope "
            r"answered 404",
        ):
            app.result(bad, timeout_s=30)
        assert events(app, bad, EventKind.STEP_RETRYING) == []  # 4xx: never retried
    assert len(receiver.requests) == 4


def test_a_key_named_like_a_dict_method_is_the_key() -> None:
    from ratchet.graphs import templates

    data = {"input": {"items": [1, 2], "keys": "k"}, "nodes": {"get": {"output": 3}}}
    assert templates.render("{{ input.items }}", data) == [1, 2]
    assert templates.render("{{ input.keys }}/{{ nodes.get.output }}", data) == "k/3"
    with pytest.raises(templates.TemplateError, match="unsafe|has no attribute"):
        templates.render("{{ input.__class__.__mro__ }}", data)


def test_a_template_cannot_change_the_data_it_reads() -> None:
    # A replay takes finished nodes' outputs from the journal without rendering their
    # templates: that is the same walk only if templates read and never write.
    from ratchet.graphs import templates

    data = {"nodes": {"a": {"output": [1]}}, "input": {"k": 1}}
    with pytest.raises(templates.TemplateError, match="unsafe"):
        templates.render("{{ nodes.a.output.append(2) }}", data)
    with pytest.raises(templates.TemplateError, match="unsafe"):
        templates.evaluate("input.update({'k': 2})", data)
    assert data == {"nodes": {"a": {"output": [1]}}, "input": {"k": 1}}


def test_a_loop_iteration_gets_a_copy_of_the_results_only_if_a_template_may_read_them() -> None:
    from ratchet.graphs.interpreter import _reads_results

    def graph(**data: Any) -> dict[str, Any]:
        return {"nodes": [{"id": "loop", "type": "loop", "data": data}]}

    assert not _reads_results(graph(over="{{ input.xs }}", until="loop.index > 2"))
    assert not _reads_results(graph(body=["results"], args={"a": "{{ loop.item }}"}))
    assert _reads_results(graph(until="loop.results | length > 2"))
    assert _reads_results(graph(args={"a": "{{ loop }}"}))
    assert _reads_results(graph(args={"a": "{{ loop['index'] }}"}))
    assert _reads_results({"edges": [{"from": "a", "to": "b", "when": "loop.results"}]})


def receipt_status(db_url: str, run_id: str) -> list[str]:
    """The run's receipts' statuses, read on a connection of its own (from the receiver's
    thread, while the worker waits for the answer)."""
    sql = "SELECT status FROM side_effect_receipts WHERE run_id = {}"
    if db_url.startswith("sqlite:///"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30) as conn:
            rows = conn.execute(sql.format("?"), (run_id,)).fetchall()
        conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            rows = pg.execute(sql.format("%s"), (run_id,)).fetchall()
    return [r[0] for r in rows]


def test_a_webhook_claims_its_receipt_first_sends_its_key_and_is_delivered_once(
    app: ratchet.Ratchet, receiver: HttpReceiver, db_url: str
) -> None:
    app.graph(
        chain(
            "hook",
            [
                {
                    "id": "notify",
                    "type": "connector",
                    "data": {
                        "kind": "webhook",
                        "url": receiver.url + "/hook",
                        "body": {"text": "hello {{ input.who }}"},
                        "retry": {
                            "maxAttempts": 2,
                            "backoffMs": 10,
                            "retryableClasses": ["connector"],
                        },
                    },
                }
            ],
            output="{{ nodes.notify.output }}",
        )
    )
    seen: list[list[str]] = []
    with app:
        app.launch()
        receiver.fail_next(503)  # the first send fails: the receipt stays claimed
        run_id = app.start("hook", {"who": "ana"})
        receiver.on_request = lambda _: seen.append(receipt_status(db_url, run_id))
        hold_then_release(app, run_id)
        out = app.result(run_id, timeout_s=30)
        assert out == {"status": 200, "body": {"received": 2, "path": "/hook"}}
        # Claimed before each send; resent (policy resend) under the first attempt's key.
        assert seen == [["claimed"], ["claimed"]]
        key = idempotency_key(run_id, "1:notify", 1)
        assert [r["headers"]["idempotency-key"] for r in receiver.requests] == [key, key]
        assert receiver.requests[0]["body"] == {"text": "hello ana"}
        (receipt,) = app.receipts(run_id)
        assert (receipt.status, receipt.idempotency_key, receipt.response) == ("settled", key, out)
        # Two drives (the approval parked the run between them), one successful send.
        assert len(receiver.requests) == 2


def test_an_email_goes_over_smtp_once_with_its_key(
    app: ratchet.Ratchet, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.graph(
        chain(
            "mail",
            [
                {
                    "id": "mail",
                    "type": "connector",
                    "data": {
                        "kind": "email",
                        "to": "{{ input.to }}",
                        "subject": "Summary",
                        "from": "bot@example.com",
                        "body": "All {{ input.n }} accounts done.",
                    },
                }
            ],
            output="{{ nodes.mail.output }}",
        )
    )
    with SmtpReceiver() as smtp, app:
        monkeypatch.setenv("RATCHET_SMTP_URL", smtp.url)
        app.launch()
        run_id = app.start("mail", {"to": "ana@example.com", "n": 3})
        hold_then_release(app, run_id)
        out = app.result(run_id, timeout_s=30)
        key = idempotency_key(run_id, "1:mail", 1)
        assert out == {"to": "ana@example.com", "message_id": f"<{key}@ratchet>"}
        (message,) = smtp.messages
        assert (message["To"], message["From"], message["Subject"]) == (
            "ana@example.com",
            "bot@example.com",
            "Summary",
        )
        assert message["Idempotency-Key"] == key
        assert isinstance(message, EmailMessage)
        assert message.get_content().strip() == "All 3 accounts done."
        assert [r.status for r in app.receipts(run_id)] == ["settled"]


def test_an_email_to_no_smtp_server_fails_the_run_naming_it(
    app: ratchet.Ratchet, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SmtpReceiver() as smtp:
        closed = smtp.url  # a port that was open a moment ago and is closed now
    monkeypatch.setenv("RATCHET_SMTP_URL", closed)
    app.graph(
        chain(
            "no-mail",
            [
                {
                    "id": "mail",
                    "type": "connector",
                    "data": {"kind": "email", "to": "ana@example.com"},
                }
            ],
        )
    )
    with app:
        app.launch()
        run_id = app.start("no-mail", {})
        with pytest.raises(
            ratchet.RunFailed,
            match=r"email to ana@example\.com: "
            r"ConnectionRefusedError",
        ):
            app.result(run_id, timeout_s=30)
        # The receipt was claimed before the attempt and is left claimed: nobody knows
        # whether a refused connection delivered anything, and the policy says resend.
        assert [r.status for r in app.receipts(run_id)] == ["claimed"]
