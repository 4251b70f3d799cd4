"""A prompt changed under a running run, for real: a worker process SIGKILLed after a model
call completed, and a worker whose code sends another system prompt re-driving the run, on
SQLite and PostgreSQL. The replay finds the journaled request differs: the run fails as
non-deterministic, or, where the workflow opted in, journals ``request_drifted`` and goes on
with the journaled answer, without calling the provider again for it."""

from __future__ import annotations

import signal

import pytest
from proc import Harness

from ratchet.llm.server import LocalProvider, serve
from ratchet.model import requests_of

CHAT = "openai.chat.completions.create"


def _kill_after_the_first_call(h: Harness, workflow: str, base: str) -> str:
    run_id = h.app.start(workflow)
    a = h.spawn("a", worker_id="w-prompt", env_extra={"CRASH_LLM_URL": base})
    h.wait_invoked("2:work")  # the first call completed and journaled, the step blocked
    a.kill()
    assert a.popen.returncode == -signal.SIGKILL
    h.open_gate("step-2")
    return run_id


@pytest.mark.crash
def test_a_worker_with_a_changed_prompt_fails_the_run_naming_the_step_and_message(
    h: Harness,
) -> None:
    server = LocalProvider()
    with serve(server) as base:
        run_id = _kill_after_the_first_call(h, "prompted", base)
        env = {"CRASH_LLM_URL": base, "CRASH_PROMPT": "You are verbose."}
        b = h.spawn("b", worker_id="w-prompt", env_extra=env)  # reclaims at once
        rec = h.wait_status(run_id, "failed", timeout=30)
        b.terminate()
    assert rec.error is not None
    assert "NonDeterminismError" in rec.error and f"'1:{CHAT}'" in rec.error
    assert "message 0 differs" in rec.error and "You are verbose." in rec.error
    assert server.stats()["billed_calls"] == 1  # the replay sent nothing
    assert h.calls() == {"2:work": 1}  # and ran nothing after the call


@pytest.mark.crash
def test_a_workflow_that_opts_in_goes_on_after_a_changed_prompt_and_journals_it(
    h: Harness,
) -> None:
    server = LocalProvider()
    with serve(server) as base:
        run_id = _kill_after_the_first_call(h, "prompted_warn", base)
        env = {"CRASH_LLM_URL": base, "CRASH_PROMPT": "You are verbose."}
        b = h.spawn("b", worker_id="w-prompt", env_extra=env)
        out = h.app.result(run_id, timeout_s=30)
        b.terminate()
    assert out == ["echo: question 1", "out-2", "echo: question 2"]
    events = h.app.events(run_id)
    drifts = [e for e in events if e.kind == "request_drifted"]
    assert [e.step_id for e in drifts] == [f"1:{CHAT}"]
    assert drifts[0].payload["difference"]["message"] == 0
    assert "You are terse." in drifts[0].payload["difference"]["journaled"]
    assert server.stats()["billed_calls"] == 2  # the first call was not sent again
    # The second call was journaled as the new code sent it, after the first's messages.
    second = requests_of(events)[f"3:{CHAT}"]["messages"]
    assert second[0]["content"] == "You are verbose." and second[-1]["content"] == "question 2"
