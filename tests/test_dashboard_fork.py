"""Forking, diffing and resuming from the dashboard, in a real browser on both backends (the
harness of tests/test_dashboard.py): a step's "fork from here" with its output (or a model's
answer) edited lands on the new run, which shows where it came from; the diff page puts
two runs side by side; a cancelled run resumes from its page. A read-only token is offered
none of it, another tenant reaches none of it, and a cross-site POST changes nothing."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import test_dashboard
from proc import Harness
from test_dashboard import IMAGES, Dash, dashboard, eid, expect, row, screenshot

from ratchet.ui.pages import fork_form_input

browser = test_dashboard.browser  # the module's browser fixture, shared
ASK = "1:openai.chat.completions.create"
ASK_2 = "2:openai.chat.completions.create"


@pytest.fixture
def dash(h: Harness, browser: Any) -> Iterator[Dash]:
    with dashboard(h, browser, heartbeat_s=0.5, live_poll_s=0.2) as d:
        yield d


def open_step(page: Any, step_id: str) -> Any:
    row(page, step_id).get_by_role("button", name=step_id, exact=True).click()
    detail = page.get_by_role("region", name=f"Step {step_id}")
    expect(detail).to_be_visible()
    return detail


def element_shot(dash: Dash, element: Any, name: str) -> None:
    """A picture of one part of a page for the docs (one backend writes it)."""
    shot = element.screenshot()
    if dash.h.db_url.startswith("sqlite"):
        (IMAGES / name).write_bytes(shot)


def new_run_id(page: Any, source: str) -> str:
    """The run page the browser landed on after forking ``source``."""
    expect(page).not_to_have_url(re.compile(rf"/runs/{re.escape(source)}$"))
    run_id = str(page.locator("h1 .runid").text_content())
    assert run_id != source
    return run_id


def test_a_models_answer_edited_forks_the_run_shows_its_lineage_and_the_diff(
    dash: Dash,
) -> None:
    from ratchet.llm.server import LocalProvider, serve

    h = dash.h
    with serve(LocalProvider()) as base:
        source = dash.start("asker", {"n": 2})
        h.spawn("w", env_extra={"CRASH_LLM_URL": base})
        h.wait_status(eid(source), "succeeded")
        page = dash.signed_in()
        page.goto(f"/runs/{source}")
        detail = open_step(page, ASK)
        detail.get_by_role("button", name="Fork from here").click()
        form = page.get_by_role("form", name=f"Fork from step {ASK}")
        # A model call is edited as its answer's text, not as the provider's body.
        answer = form.get_by_label("The model's answer")
        expect(answer).to_have_value("echo: question 1")
        expect(form.get_by_label("Replace this step's output")).to_be_checked()
        edited = "The answer is <b>42</b> & <script>nothing</script> else"
        answer.fill(edited)
        # The whole response is one click away, as JSON, with the answer as edited.
        form.get_by_label("Edit the whole response as JSON").check()
        whole = form.get_by_label("The step's output (JSON)")
        expect(whole).to_be_visible()
        expect(answer).to_be_hidden()
        body = json.loads(whole.input_value())
        assert body["choices"][0]["message"]["content"] == edited
        form.get_by_label("Edit the whole response as JSON").uncheck()
        expect(answer).to_have_value(edited)
        element_shot(dash, detail, "dashboard-fork.png")
        form.get_by_role("button", name="Fork", exact=True).click()

        fork = new_run_id(page, source)
        lineage = page.locator("#lineage")
        expect(lineage).to_have_text(
            re.compile(rf"^Forked from\s*{re.escape(source)} at step {re.escape(ASK)}")
        )
        expect(lineage.get_by_role("link", name=source)).to_have_attribute(
            "href", f"/runs/{source}"
        )
        rec = h.wait_status(eid(fork), "succeeded")
        # The workflow read the edited answer as the model's; the next call ran anew.
        assert rec.output == [edited, "echo: question 2"]
        assert (rec.forked_from, rec.forked_at) == (eid(source), ASK)
        expect(page.locator("#run-status")).to_have_text("succeeded")
    # The source is as it was, and says nothing of forks.
    assert h.app.get(eid(source)).output == ["echo: question 1", "echo: question 2"]
    page.goto(f"/runs/{source}")
    expect(page.locator("#run-status")).to_have_text("succeeded")
    expect(page.locator("#lineage")).to_have_count(0)

    page.goto(f"/runs/{fork}")
    page.locator("#lineage").get_by_role("link", name="diff against source").click()
    expect(page.get_by_role("heading", name="Diff")).to_be_visible()
    expect(page.locator("#diff-a")).to_have_text(source)
    expect(page.locator("#diff-b")).to_have_text(fork)
    steps = page.get_by_role("table", name="Steps compared")
    first = steps.locator(f'tr[data-step="{ASK}"]')
    expect(first).to_have_attribute("data-diff", "changed")
    expect(first.locator(".verdict")).to_have_text("changed")
    expect(first.locator(".step")).to_have_text(f"{ASK} fork point")
    expect(steps.locator(".fork-point")).to_have_count(1)
    expect(first.locator("pre.answer").nth(0)).to_have_text("echo: question 1")
    # What a journal holds is text on the page, never markup.
    expect(first.locator("pre.answer").nth(1)).to_have_text(edited)
    expect(page.locator("main b, main script")).to_have_count(0)
    expect(first.locator(".tokens").nth(0)).to_have_text(
        re.compile(r"^[1-9][\d,]* tokens \(\d+ in, \d+ out\)$")
    )
    expect(first.locator(".tokens").nth(1)).to_have_text("no tokens")  # the edit called no model
    expect(first.locator(".cost").nth(0)).to_have_text(re.compile(r"^\$0\.\d{6}$"))
    # The next call ran again: another response (its id, its time), the same answer.
    expect(steps.locator(f'tr[data-step="{ASK_2}"] .verdict')).to_have_text("changed, same answer")
    expect(page.locator("#diff-counts")).to_have_text(
        "0 same · 2 changed · 0 only in A · 0 only in B"
    )
    screenshot(dash, page, "dashboard-diff.png")


def test_a_steps_output_edited_as_json_is_checked_before_the_fork(dash: Dash) -> None:
    h = dash.h
    source = dash.start("chain", {"n": 3})
    other = dash.start("chain", {"n": 2})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(source), "succeeded")
    h.wait_status(eid(other), "succeeded")
    page = dash.signed_in()
    page.goto(f"/runs/{source}")
    detail = open_step(page, "2:work")
    detail.get_by_role("button", name="Fork from here").click()
    form = page.get_by_role("form", name="Fork from step 2:work")
    output = form.get_by_label("The step's output (JSON)")
    expect(output).to_have_value('"out-2"')
    # Not JSON: said so, and nothing forked.
    output.fill("{not json")
    form.get_by_role("button", name="Fork", exact=True).click()
    expect(form.get_by_role("status")).to_contain_text("the step's output is not valid JSON")
    assert len(h.app.runs()) == 2

    output.fill('"edited <2>"')
    form.get_by_role("button", name="Fork", exact=True).click()
    fork = new_run_id(page, source)
    rec = h.wait_status(eid(fork), "succeeded")
    assert rec.output == ["out-1", "edited <2>", "out-3"]
    expect(page.locator("#lineage")).to_contain_text("at step 2:work")

    # Any run page diffs with a run named there.
    page.goto(f"/runs/{source}")
    page.get_by_label("Diff with run").fill(other)
    page.get_by_role("button", name="Diff", exact=True).click()
    steps = page.get_by_role("table", name="Steps compared")
    expect(steps.locator('tr[data-step="3:work"]')).to_have_attribute("data-diff", "only_a")
    expect(steps.locator('tr[data-step="3:work"] td.none')).to_have_text("not run")
    expect(steps.locator('tr[data-step="1:work"]')).to_have_attribute("data-diff", "same")


def test_a_failed_step_runs_again_in_a_fork_given_other_input(dash: Dash) -> None:
    h = dash.h
    doomed = dash.start("retrier", {"succeed_on": 9, "block_on": 0})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(doomed), "failed")
    page = dash.signed_in()
    page.goto(f"/runs/{doomed}")
    open_step(page, "1:flaky").get_by_role("button", name="Fork from here").click()
    form = page.get_by_role("form", name="Fork from step 1:flaky")
    # A failed step has no output to keep: by default it runs again.
    expect(form.get_by_label("Replace this step's output")).not_to_be_checked()
    expect(form.get_by_label("The step's output (JSON)")).to_be_disabled()
    given = form.get_by_label("The run's input (JSON)")
    expect(given).to_be_disabled()
    form.get_by_label("Change the run's input").check()
    expect(given).to_have_value(re.compile(r'"succeed_on": 9'))
    given.fill("{succeed_on: 1}")
    form.get_by_role("button", name="Fork", exact=True).click()
    expect(form.get_by_role("status")).to_contain_text("the run's input is not valid JSON")
    given.fill('{"succeed_on": 1, "block_on": 0}')
    form.get_by_role("button", name="Fork", exact=True).click()
    fork = new_run_id(page, doomed)
    assert h.wait_status(eid(fork), "succeeded").output == "ok on attempt 1"
    expect(page.locator("#lineage")).to_contain_text(f"{doomed} at step 1:flaky")
    page.locator("#lineage").get_by_role("link", name="diff against source").click()
    flaky = page.get_by_role("table", name="Steps compared").locator('tr[data-step="1:flaky"]')
    expect(flaky).to_have_attribute("data-diff", "changed")
    expect(flaky.locator("pre.error")).to_contain_text("attempt 3 failed")


def test_a_cancelled_run_resumes_from_its_page(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(eid(run_id), "signal:go")
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("waiting")
    expect(page.get_by_role("button", name="Resume run")).to_have_count(0)
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_text("cancelled")
    page.reload()
    page.get_by_role("button", name="Resume run").click()
    # Resumed from its last completed step: waiting for its signal again.
    h.wait_parked(eid(run_id), "signal:go")
    expect(page.locator("#run-status")).to_have_text("waiting")
    page.get_by_label("Signal name").fill("go")
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#run-status")).to_have_text("succeeded")
    assert h.app.get(eid(run_id)).output == ["out-1", None, "out-3"]


def test_readers_other_tenants_and_other_sites_cannot_fork_or_resume(dash: Dash) -> None:
    h = dash.h
    done = dash.start("chain", {"n": 2})
    parked = dash.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(done), "succeeded")
    h.wait_parked(eid(parked), "signal:go")
    with dash.api() as client:
        assert client.post(f"/v1/runs/{parked}/cancel").status_code == 202
    h.wait_status(eid(parked), "cancelled")

    # A read-only token: the step's detail and the diff, no fork and no resume.
    reader = dash.signed_in(dash.token(scopes=("runs:read",)))
    reader.goto(f"/runs/{done}")
    open_step(reader, "1:work")
    expect(reader.get_by_role("button", name="Fork from here")).to_have_count(0)
    reader.goto(f"/runs/{parked}")
    expect(reader.locator("#run-status")).to_have_text("cancelled")
    expect(reader.get_by_role("button", name="Resume run")).to_have_count(0)
    reader.goto(f"/runs/{done}/diff/{parked}")
    expect(reader.get_by_role("table", name="Steps compared")).to_be_visible()

    # Another tenant: neither run's page nor their diff, nor a fork of either.
    other = dash.signed_in(dash.token("globex"))
    for path in (f"/runs/{done}/diff/{parked}", f"/runs/{done}/diff/no-such-run"):
        assert other.request.get(path).status == 404
    csrf = other.locator('meta[name="csrf-token"]').get_attribute("content")
    forked = other.request.post(
        f"/v1/runs/{done}/fork", headers={"X-CSRF-Token": csrf}, data={"at": "1:work"}
    )
    resumed = other.request.post(f"/v1/runs/{parked}/resume", headers={"X-CSRF-Token": csrf})
    assert (forked.status, resumed.status) == (404, 404)
    # A diff of the tenant's own run with another's is as missing as a run that is not.
    mine = dash.signed_in()
    globex_run = h.app.portal.call(h.app.start_run_async("chain", [], {"n": 1}, tenant="globex"))
    gid = globex_run[0].run_id.removeprefix("globex~")
    assert mine.request.get(f"/runs/{done}/diff/{gid}").status == 404

    # A POST forged on another site, with the session's cookie: refused, nothing made.
    for headers in ({"Origin": "http://evil.example"}, {"X-CSRF-Token": "0" * 64}):
        refused = mine.request.post(f"/v1/runs/{done}/fork", headers=headers, data={"at": "1:work"})
        assert refused.status == 403 and "CSRF" in refused.json()["message"]
        refused = mine.request.post(f"/v1/runs/{parked}/resume", headers=headers)
        assert refused.status == 403
    assert [r.run_id for r in h.app.runs() if r.forked_from] == []
    assert h.app.get(eid(parked)).status == "cancelled"


def test_the_fork_form_starts_from_the_arguments_by_name(h: Harness) -> None:
    # A run started with positional arguments shows them as given (a list) on its page;
    # the fork form offers them by name, as a fork takes them, and the fork accepts them.
    run_id = h.app.start("retrier", 1, 0)
    h.spawn("w")
    rec = h.wait_status(run_id, "succeeded")
    assert fork_form_input(h.app, rec) == {"succeed_on": 1, "block_on": 0}
    fork = h.app.fork(run_id, "1:flaky", input=fork_form_input(h.app, rec))
    assert h.app.get(fork).input == {"args": [], "kwargs": {"succeed_on": 1, "block_on": 0}}
    # A graph's (or an unknown workflow's) input stays as it was given.
    other = dataclasses.replace(rec, workflow="not-here")
    assert fork_form_input(h.app, other) == [1, 0]
