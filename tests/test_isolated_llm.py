"""Model calls of isolated runs, made by the worker: a worker process
(tests/support/isolated_llm_app.py) with the provider's key drives isolated runs whose
sandboxes have no network and no key; their wrapped clients send each call to the worker,
which makes it over real HTTP to the local provider with its own client (the official
openai SDK) and the step's Idempotency-Key, checks the run's budget first, and journals the
provider's usage and cost itself. On both backends."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import isolated_llm_app as iso
import pytest

import ratchet
from ratchet.llm.prices import Usage, cost_usd
from ratchet.llm.server import LocalProvider, serve
from ratchet.model import idempotency_key, requests_of

RESULT_S = 90.0
SECRET = "sk-worker-only-" + "7" * 24
STEP = "1:openai.chat.completions.create"


# Real sandboxes: bubblewrap must be there (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("bwrap")


class _Keys:
    """ASGI middleware in front of the provider: the key each model request carried
    (OpenAI's Authorization, Anthropic's x-api-key), which the provider never logs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.seen.append(
                " ".join(
                    headers.get(h, b"").decode() for h in (b"authorization", b"x-api-key")
                ).strip()
            )
        await self.inner(scope, receive, send)


@pytest.fixture
def provider() -> Iterator[tuple[LocalProvider, _Keys, str]]:
    p = LocalProvider()
    keys = _Keys(p.app)
    p.app = keys
    with serve(p) as base:
        yield p, keys, base


@pytest.fixture
def worker(
    db_url: str, provider: tuple[LocalProvider, _Keys, str], tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "ISO_DB_URL": db_url,
        "ISO_LLM_URL": provider[2] + "/v1",
        "ISO_LLM_KEY": SECRET,
    }
    with (tmp_path / "worker.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(iso.__file__))], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    yield proc
    proc.kill()
    proc.wait()


def _app(make_app: Callable[..., ratchet.Ratchet]) -> ratchet.Ratchet:
    app = make_app()  # starts runs and reads them; the worker process drives them
    app.workflows.update(iso.app.workflows)
    return app


def test_a_sandboxed_model_call_is_made_by_the_worker_with_its_key_and_journaled_by_it(
    make_app: Callable[..., ratchet.Ratchet],
    provider: tuple[LocalProvider, _Keys, str],
    worker: subprocess.Popen[bytes],
) -> None:
    server, keys, _ = provider
    app = _app(make_app)
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    run_id = app.start(iso.ask, "hello from the sandbox", digest)
    out = app.result(run_id, timeout_s=RESULT_S)

    # The sandbox got the provider's answers, OpenAI's and Anthropic's.
    assert "hello from the sandbox" in out["answer"]
    assert "hello from the sandbox" in out["claude"]
    # The provider saw one request per call, with the worker's key and the step's key.
    request, other = server.requests()
    assert request["idempotency_key"] == idempotency_key(run_id, STEP, 1)
    assert other["idempotency_key"] == idempotency_key(run_id, "2:anthropic.messages.create", 1)
    assert keys.seen[0] == f"Bearer {SECRET}"  # not the sandbox's own Authorization
    assert SECRET in keys.seen[1] and len(keys.seen) == 2
    # The key never entered the sandbox: not in its environment, not in any of its
    # processes' first environment, not in the client it made (a placeholder).
    assert out["seen"] == {"found": [], "client_key": "ratchet-sandbox-no-key"}
    # The journal's usage and cost are the provider's, written once by the worker.
    events = app.events(run_id)
    [done] = [e for e in events if e.kind == "step_completed" and e.step_id == STEP]
    meta = done.payload["llm"]
    assert meta["usage"]["input_tokens"] == request["input_tokens"]
    assert meta["usage"]["output_tokens"] == request["output_tokens"]
    assert meta["request_id"] == request["request_id"]
    assert meta["cost_usd"] == cost_usd(
        iso.MODEL,
        Usage(input_tokens=request["input_tokens"], output_tokens=request["output_tokens"]),
    )
    assert out["usage"]["prompt_tokens"] == request["input_tokens"]
    # A forged end of the same call, and a second call for its attempt, were refused.
    forged = out["forged"]
    assert forged["report"] == 422 and "nothing follows" in forged["report_says"], forged
    assert forged["again"] == 422 and "no step_started" in forged["again_says"], forged
    assert len(server.requests()) == 2
    assert [e.step_id for e in events if e.kind == "step_completed"].count(STEP) == 1
    assert app.get(run_id).status == "succeeded"
    # The requests the sandbox's drive journaled, read back whole; never its header.
    requests = requests_of(events)
    asked = [{"role": "user", "content": "hello from the sandbox"}]
    assert requests[STEP] == {"messages": asked, "model": iso.MODEL, "max_tokens": 64}
    assert requests["2:anthropic.messages.create"]["messages"] == asked


def test_a_budget_stops_a_sandboxed_model_call_before_it_is_sent(
    make_app: Callable[..., ratchet.Ratchet],
    provider: tuple[LocalProvider, _Keys, str],
    worker: subprocess.Popen[bytes],
) -> None:
    server, _, _ = provider
    app = _app(make_app)
    run_id = app.start(iso.costly, "a question worth 500 tokens")
    with pytest.raises(ratchet.RunFailed, match="budget"):
        app.result(run_id, timeout_s=RESULT_S)
    assert server.requests() == []  # never sent
    events = app.events(run_id)
    [anomaly] = [e for e in events if e.kind == "anomaly_detected"]
    assert anomaly.payload["budget"] == "tokens" and anomaly.payload["worst_case"] > 100
    assert events[-1].kind == "run_failed"
    assert events[-1].payload["reason"] == "budget_exceeded"
    assert [d.reason for d in app.dead_letters()] == ["budget_exceeded"]
