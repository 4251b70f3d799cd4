"""OpenTelemetry, with real worker processes on SQLite and PostgreSQL: each drive of a run
is one trace, across a SIGKILL, a reclaim and a resume after a park; each drive links to the
one before; steps replayed from the journal make no span; drive and step spans carry their
attributes, model calls the GenAI ones. Without a tracer provider or OTEL_* variables
nothing is traced, and the standard variables alone switch the SDK on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trace_app
from proc import Harness

from ratchet.llm.server import LocalProvider, serve
from ratchet.model import idempotency_key

pytestmark = pytest.mark.crash


@pytest.fixture
def th(db_url: str, tmp_path: Path) -> Iterator[tuple[Harness, str, Path]]:
    harness = Harness(db_url, tmp_path, app=trace_app)
    with serve(LocalProvider()) as base:
        try:
            yield harness, base, tmp_path / "spans.jsonl"
        finally:
            harness.close()


def spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_one_trace_per_drive_across_a_kill_a_reclaim_and_a_park_linked_in_order(
    th: tuple[Harness, str, Path],
) -> None:
    h, llm_url, span_file = th
    env = {"TRACE_FILE": str(span_file), "CRASH_LLM_URL": llm_url}
    first = h.spawn("a", worker_id="w-a", env_extra=env)
    run_id = h.app.start("traced", run_id="traced-1")
    h.wait_invoked("3:blocker")
    first.kill()  # mid-step: the first drive's root span never ends

    h.open_gate("blocker")  # the blocker runs again in drive 2, and goes through
    second = h.spawn("a-again", worker_id="w-a", env_extra=env)  # reclaims at once
    h.wait_parked(run_id, "signal:go")
    h.app.signal(run_id, "go")
    h.wait_status(run_id, "succeeded")
    second.terminate()
    second.wait_exit()

    events = h.app.events(run_id)
    drives = [e for e in events if e.kind in ("run_started", "run_resumed")]
    assert [d.payload["reason"] for d in drives] == ["claim", "reclaim", "claim"]
    contexts = [d.payload["trace"] for d in drives]
    trace_ids = [c["trace_id"] for c in contexts]
    assert len(set(trace_ids)) == 3  # one trace per drive

    found = spans(span_file)
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in found:
        by_trace.setdefault(s["trace_id"], []).append(s)
    assert set(by_trace) <= set(trace_ids), "a span outside the drives' traces"

    # The roots: drive 1 was killed before its span ended; drives 2 and 3 each link back.
    roots = {s["trace_id"]: s for s in found if s["parent"] is None}
    assert trace_ids[0] not in roots
    for n, reason in ((2, "reclaim"), (3, "resume")):
        root = roots[trace_ids[n - 1]]
        assert root["span_id"] == contexts[n - 1]["span_id"]
        assert root["name"] == "drive traced"
        attrs = root["attributes"]
        assert attrs["ratchet.run_id"] == run_id and attrs["ratchet.drive"] == n
        assert attrs["ratchet.drive.reason"] == reason and attrs["ratchet.worker_id"] == "w-a"
        assert root["links"] == [contexts[n - 2]]
    assert roots[trace_ids[1]]["attributes"]["ratchet.drive.outcome"] == "parked"
    assert roots[trace_ids[2]]["attributes"]["ratchet.drive.outcome"] == "succeeded"

    def step_spans(trace_id: str) -> dict[str, dict[str, Any]]:
        return {
            s["attributes"]["ratchet.step_id"]: s
            for s in by_trace.get(trace_id, [])
            if s["parent"] is not None
        }

    # Drive 1 ran the plain step and the model call (the blocker's span died with it).
    one = step_spans(trace_ids[0])
    assert set(one) == {"1:one", "2:openai.chat.completions.create"}
    assert all(s["parent"] == contexts[0]["span_id"] for s in one.values())
    plain = one["1:one"]["attributes"]
    assert plain["ratchet.attempt"] == 1 and plain["ratchet.step.outcome"] == "completed"
    assert plain["ratchet.idempotency_key"] == idempotency_key(run_id, "1:one", 1)
    chat = one["2:openai.chat.completions.create"]
    assert chat["name"] == "chat gpt-4.1-mini"
    attrs = chat["attributes"]
    assert attrs["gen_ai.request.model"] == "gpt-4.1-mini"
    assert attrs["gen_ai.provider.name"] == "openai" and attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    # Drive 2 replayed those (no spans) and ran the blocker again; drive 3 only the last.
    two = step_spans(trace_ids[1])
    assert set(two) == {"3:blocker"}
    assert two["3:blocker"]["attributes"]["ratchet.attempt"] == 1  # the same attempt, resumed
    assert set(step_spans(trace_ids[2])) == {"5:last"}


SCRIPT = """
import asyncio, json, sys
import ratchet

app = ratchet.Ratchet(sys.argv[1])

@app.step
async def hello() -> str:
    return "hi"

@app.workflow()
async def wf() -> str:
    return await hello()

app.launch()
run_id = app.start(wf)
app.result(run_id, timeout_s=30)
started = app.events(run_id)[1].payload
app.shutdown()
print(json.dumps({"trace": started.get("trace"),
                  "sdk": "opentelemetry.sdk" in sys.modules}), file=sys.stderr)
"""


def _run(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RATCHET_"))}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path}/t.db"],
        env={**clean, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout


def test_without_a_provider_or_otel_variables_nothing_is_traced(tmp_path: Path) -> None:
    result, stdout = _run(tmp_path, {})
    assert result == {"trace": None, "sdk": False}
    assert stdout == ""


def test_the_standard_variables_alone_switch_tracing_on(tmp_path: Path) -> None:
    result, stdout = _run(
        tmp_path, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing"}
    )
    assert result["sdk"] is True and len(result["trace"]["trace_id"]) == 32
    assert '"name": "drive wf"' in stdout and '"name": "step 1:hello"' in stdout
    assert '"service.name": "billing"' in stdout
    assert result["trace"]["trace_id"] in stdout
    off, _ = _run(tmp_path, {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert off["trace"] is None
