"""The dashboard in a real browser: Playwright driving the system's Chromium against a real
``ratchet server`` (uvicorn on a free port), on both backends. Runs are driven by worker
processes (tests/support/proc.py), so what the pages show crosses processes as in production.

Every page a test opens is watched for console errors and uncaught exceptions; a test fails
if any appeared. The README's screenshots are taken here, so they show today's pages."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crash_app
import httpx
import pytest
from proc import Harness
from serving import serving
from waiting import wait_for

from ratchet.model import fold, idempotency_key
from ratchet.store import tokens

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("RATCHET_TEST_CHROMIUM", "/usr/bin/chromium")

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
ALL = ("runs:read", "runs:write", "admin")
expect = sync_api.expect


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        missing = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing}; CI=true requires it")
        pytest.skip(missing)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Dash:
    base: str
    h: Harness
    browser: Any
    problems: list[str] = field(default_factory=list)
    contexts: list[Any] = field(default_factory=list)

    def token(
        self, tenant: str = "acme", scopes: tuple[str, ...] = ALL, name: str | None = "ana"
    ) -> str:
        app = self.h.app
        _, secret = app.portal.call(tokens.create_token(app.store, tenant, scopes, name))
        return secret

    def page(self, **options: Any) -> Any:
        """A page in a fresh browser context, its console watched."""
        context = self.browser.new_context(base_url=self.base, **options)
        self.contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on(
            "console",
            lambda m: (
                m.type == "error" and self.problems.append(f"{page.url}: console error: {m.text}")
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"{page.url}: {e}"))
        return page

    def signed_in(self, token: str | None = None, **options: Any) -> Any:
        page = self.page(**options)
        page.goto("/signin")
        page.get_by_label("API token").fill(token or self.token())
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        return page

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.base,
            timeout=30,
            headers={"Authorization": f"Bearer {token or self.token()}"},
        )

    def start(self, workflow: str, data: dict[str, Any]) -> str:
        with self.api() as client:
            r = client.post("/v1/runs", json={"workflow": workflow, "input": data})
            assert r.status_code == 202, r.text
            return str(r.json()["run_id"])


@contextmanager
def dashboard(h: Harness, browser: Any, **options: Any) -> Iterator[Dash]:
    """A real server (``create_app(**options)``) and the browser to drive it; no page of
    it may have logged an error by the end."""
    app = crash_app.build(h.db_url)
    try:
        with serving(app, workers=0, **options) as base:
            d = Dash(base, h, browser)
            try:
                yield d
            finally:
                for context in d.contexts:
                    context.close()
            assert d.problems == [], "\n".join(d.problems)
    finally:
        app.shutdown()


@pytest.fixture
def dash(h: Harness, browser: Any) -> Iterator[Dash]:
    with dashboard(h, browser, heartbeat_s=0.5, live_poll_s=0.2) as d:
        yield d


def eid(run_id: str, tenant: str = "acme") -> str:
    """The engine's id of a run the pages and the API name ``run_id`` for ``tenant``."""
    return f"{tenant}~{run_id}"


def rows(page: Any) -> Any:
    return page.get_by_role("list", name="Waterfall").get_by_role("listitem")


def row(page: Any, step_id: str) -> Any:
    return page.locator(f'li.wf-row[data-step="{step_id}"]')


def screenshot(dash: Dash, page: Any, name: str) -> None:
    # One backend writes the README's pictures; both take them, so both render the page.
    shot = page.screenshot(full_page=True)
    if dash.h.db_url.startswith("sqlite"):
        IMAGES.mkdir(parents=True, exist_ok=True)
        (IMAGES / name).write_bytes(shot)


# -- signing in ------------------------------------------------------------------------------


def test_sign_in_sets_a_strict_httponly_session_and_sign_out_ends_it(dash: Dash) -> None:
    page = dash.page()
    page.goto("/runs")
    assert page.url.endswith("/signin?next=%2Fruns")
    page.get_by_label("API token").fill("rt_not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("invalid, revoked or expired token")

    secret = dash.token()
    page.get_by_label("API token").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert secret not in cookie["value"] and cookie["expires"] > time.time()
    assert page.evaluate("document.cookie") == ""  # out of scripts' reach

    # The session reads the API (the cookie alone) until signed out.
    jar = {cookie["name"]: cookie["value"]}
    with httpx.Client(base_url=dash.base, cookies=jar) as client:
        assert client.get("/v1/runs").status_code == 200
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        assert page.context.cookies() == []
        refused = client.get("/v1/runs")
        assert refused.status_code == 401 and "sign in again" in refused.json()["message"]
        assert client.get("/runs", follow_redirects=False).status_code == 303


# -- the runs list ---------------------------------------------------------------------------


def test_the_list_shows_runs_and_follows_them_live(dash: Dash) -> None:
    h = dash.h
    done = dash.start("chain", {"n": 2})
    w = h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(done), "succeeded")
    w.terminate()
    w.wait_exit()
    page = dash.signed_in()
    listed = page.get_by_role("table", name="Runs")
    expect(listed.get_by_role("link", name=done)).to_be_visible()
    first = listed.locator(f'tr[data-run-id="{done}"]')
    expect(first.get_by_role("cell").nth(1)).to_have_text("succeeded")
    expect(first.get_by_role("cell").nth(5)).to_have_text("2")  # steps
    expect(page.locator("#live")).to_have_text("live")

    # A run started now appears without a reload, queued; a worker drives it to its end.
    later = dash.start("chain", {"n": 3, "block_at": [2]})
    fresh = listed.locator(f'tr[data-run-id="{later}"]')
    expect(fresh.get_by_role("cell").nth(1)).to_have_text("queued")
    expect(page.locator('[data-count="queued"]')).to_have_text("1")
    h.spawn("w2", lease_ttl=3.0)
    h.wait_invoked("2:work")
    expect(fresh.get_by_role("cell").nth(1)).to_have_text("running")
    h.open_gate("step-2")
    expect(fresh.get_by_role("cell").nth(1)).to_have_text("succeeded")
    expect(page.locator('[data-count="succeeded"]')).to_have_text("2")

    # Filters: status, workflow, text in the run id.
    page.get_by_label("Run id contains").fill(later[:12])
    page.get_by_role("button", name="Filter").click()
    expect(listed.locator("tbody tr")).to_have_count(1)
    page.get_by_label("Status", exact=True).select_option("failed")
    page.get_by_role("button", name="Filter").click()
    expect(listed).to_contain_text("No runs match these filters")
    page.goto("/")  # the list is the dashboard's home
    expect(listed.locator("tbody tr")).to_have_count(2)
    screenshot(dash, page, "dashboard-runs.png")


def test_the_list_is_woken_by_starts_and_finishes_not_only_by_its_poll(
    h: Harness, browser: Any
) -> None:
    # A one-minute poll: within the few seconds waited here, only a wake-up shows a change.
    with dashboard(h, browser, live_poll_s=60.0) as d:
        page = d.signed_in()
        listed = page.get_by_role("table", name="Runs")
        expect(page.locator("#live")).to_have_text("live")
        # Started through this server: announced in its process on both backends.
        here = d.start("chain", {"n": 1})
        expect(listed.locator(f'tr[data-run-id="{here}"]').get_by_role("cell").nth(1)).to_have_text(
            "queued", timeout=5_000
        )
        if h.db_url.startswith("postgresql"):
            # Started and finished by other processes: LISTEN/NOTIFY wakes the list.
            rec, _ = h.app.portal.call(h.app.start_run_async("chain", [], {"n": 1}, tenant="acme"))
            fresh = listed.locator(f'tr[data-run-id="{rec.run_id.removeprefix("acme~")}"]')
            expect(fresh).to_be_visible(timeout=5_000)
            h.spawn("w", lease_ttl=3.0)
            h.wait_status(rec.run_id, "succeeded")
            expect(fresh.get_by_role("cell").nth(1)).to_have_text("succeeded", timeout=5_000)


def test_the_list_pages_through_runs(dash: Dash) -> None:
    ids = {dash.start("chain", {"n": 1}) for _ in range(53)}
    page = dash.signed_in()
    listed = page.get_by_role("table", name="Runs")
    expect(listed.locator("tbody tr")).to_have_count(50)
    seen = set(listed.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.runId)"))
    page.get_by_role("link", name="Older").click()
    expect(listed.locator("tbody tr")).to_have_count(3)
    seen |= set(listed.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.runId)"))
    assert seen == ids
    expect(page.get_by_role("link", name="Older")).to_have_count(0)


# -- a run's waterfall -----------------------------------------------------------------------


@pytest.mark.crash
def test_a_six_step_run_killed_mid_step_has_six_rows_and_a_drive_marker(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("chain", {"n": 6, "block_at": [4]})
    a = h.spawn("a", lease_ttl=1.5, recovery_interval=60.0)
    h.wait_invoked("4:work")
    a.kill()  # SIGKILL mid-step: step 4 started, never completed
    h.open_gate("step-4")
    h.spawn("b", lease_ttl=1.5, recovery_interval=0.2)
    h.wait_status(eid(run_id), "succeeded")

    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("succeeded")
    expect(rows(page)).to_have_count(6)
    for i in range(1, 7):
        expect(row(page, f"{i}:work")).to_have_attribute("data-status", "completed")
    # The takeover is a vertical drive marker saying why the drive before it ended; step
    # 4's first try was cut short by it.
    took_over = (
        r"worker (killed, taken over"
        r"|lost \(killed or hung\), lease expired, taken over"
        r"|restarted, run reclaimed)"
    )
    drive = page.get_by_role("img", name=re.compile(rf"^drive 1 by a: {took_over} by b after"))
    expect(drive).to_have_count(1)
    # The story at the top tells the same: who drove each drive, and why each ended.
    drives = page.locator("#story-drives li")
    expect(drives).to_have_count(2)
    expect(drives.nth(0)).to_have_text(re.compile(rf"^a: {took_over} by b after [0-9.]+ (s|ms)$"))
    expect(drives.nth(1)).to_have_text(re.compile(r"^b \((takeover|sweep|reclaim)\): succeeded$"))
    expect(page.locator("#story-input")).to_contain_text('"block_at"')
    step4 = row(page, "4:work")
    expect(step4.get_by_role("img", name=re.compile(r"^attempt 1 interrupted"))).to_have_count(1)
    expect(step4.get_by_role("img", name=re.compile(r"^attempt 1 completed"))).to_have_count(1)

    # A step's detail: its key, the epoch of the drive that ran it, its output and events.
    step4.get_by_role("button", name="4:work").click()
    detail = page.get_by_role("region", name="Step 4:work")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text(idempotency_key(eid(run_id), "4:work", 1))
    epoch = h.lease(eid(run_id))[1]
    expect(detail.locator("dt", has_text="Lease epoch").locator("+ dd")).to_have_text(str(epoch))
    expect(page.locator("#detail-output")).to_have_text('"out-4"')
    expect(page.locator("#detail-events")).to_contain_text('"kind":"step_completed"')
    screenshot(dash, page, "dashboard-run.png")


def test_a_retried_step_shows_each_attempt(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("retrier", {"succeed_on": 3, "block_on": 0})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(run_id), "succeeded")
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    flaky = row(page, "1:flaky")
    expect(flaky).to_contain_text("3 attempts")
    attempts = flaky.get_by_role("img", name=re.compile(r"^attempt \d"))
    expect(attempts).to_have_count(3)
    assert [
        a.split(",")[0]
        for a in attempts.evaluate_all("xs => xs.map(x => x.getAttribute('aria-label'))")
    ] == ["attempt 1 retrying", "attempt 2 retrying", "attempt 3 completed"]
    expect(flaky.get_by_role("img", name=re.compile(r"^backoff"))).to_have_count(2)
    expect(flaky.locator(".tick")).to_have_count(2)  # the step_retrying markers


def test_a_run_page_on_a_dark_phone_by_keyboard(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("chain", {"n": 2})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(run_id), "succeeded")
    phone = dash.signed_in(
        viewport={"width": 390, "height": 844}, color_scheme="dark", has_touch=True
    )
    phone.goto(f"/runs/{run_id}")
    expect(rows(phone)).to_have_count(2)
    # Nothing wider than the screen; the system's dark scheme is followed.
    assert phone.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert phone.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(21, 22, 24)"
    # A step's detail opens from the keyboard and closes with Escape.
    phone.get_by_role("button", name="2:work").focus()
    phone.keyboard.press("Enter")
    detail = phone.get_by_role("region", name="Step 2:work")
    expect(detail).to_be_focused()
    phone.keyboard.press("Escape")
    expect(detail).to_be_hidden()
    # No page of the dashboard may be framed by another site.
    response = phone.request.get(f"/runs/{run_id}")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_a_running_runs_page_gains_a_bar_within_a_second_of_the_commit(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("chain", {"n": 3, "block_at": [2]})
    h.spawn("w", lease_ttl=3.0)
    h.wait_invoked("2:work")
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    expect(row(page, "2:work")).to_have_attribute("data-status", "running")
    expect(rows(page)).to_have_count(2)
    h.open_gate("step-2")
    expect(row(page, "2:work")).to_have_attribute("data-status", "completed")
    expect(row(page, "3:work")).to_have_count(1)
    expect(page.locator("#run-status")).to_have_text("succeeded")
    # When the page first drew each, against when the journal says it committed (the
    # same machine's clock): within a second.
    events = {(e.step_id, e.kind): e.at for e in h.app.events(eid(run_id))}
    seen_done = int(row(page, "2:work").get_attribute("data-since") or 0) / 1000
    assert seen_done - events[("2:work", "step_completed")] < 1.0
    seen_next = int(row(page, "3:work").get_attribute("data-since") or 0) / 1000
    assert seen_next - events[("3:work", "step_started")] < 1.0


# -- the replay scrubber ---------------------------------------------------------------------


def test_the_scrubber_shows_the_engines_fold_at_each_seq(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("retrier", {"succeed_on": 2, "block_on": 0})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(run_id), "succeeded")
    journal = h.app.events(eid(run_id))
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    page.get_by_text("State at this seq").click()
    slider = page.get_by_label("Journal position (seq)")
    with dash.api() as client:
        for k in [1, 3, len(journal) - 1, len(journal)]:
            slider.fill(str(k))
            shown = page.get_by_label("State at this seq")
            expect(shown).to_have_attribute("data-seq", str(k))
            state = json.loads(shown.text_content() or "")
            served = client.get(f"/v1/runs/{run_id}/state", params={"at_seq": k}).json()
            assert state == served
            # ... which is the engine's own fold over the first k events.
            folded = fold(eid(run_id), journal[:k])
            assert (served["status"], served["last_seq"]) == (str(folded.status), k)
            assert [s["status"] for s in served["steps"]] == [
                s.status for s in folded.steps.values()
            ]
            steps_by_k = {e.step_id for e in journal[:k] if e.kind.startswith("step_")}
            expect(rows(page)).to_have_count(len(steps_by_k))
        # The step buttons move one event at a time.
        page.get_by_role("button", name="Previous event").click()
        expect(page.get_by_label("State at this seq")).to_have_attribute(
            "data-seq", str(len(journal) - 1)
        )
        state = json.loads(page.get_by_label("State at this seq").text_content() or "")
        assert (
            state
            == client.get(f"/v1/runs/{run_id}/state", params={"at_seq": len(journal) - 1}).json()
        )
        assert state["status"] == "running"


# -- actions ---------------------------------------------------------------------------------


def test_approving_from_the_page_resumes_the_parked_run(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("approver", {"amount": 12})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(eid(run_id), "approval:")
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("waiting")
    expect(row(page, "2:approval:refund")).to_have_attribute("data-status", "waiting")
    parked = row(page, "2:approval:refund").get_by_role(
        "img", name=re.compile(r"^parked \(approval\)")
    )
    expect(parked).to_have_count(1)
    # Parked time is drawn compressed (at most 8% of the working time), and in full on demand.
    width = "e => parseFloat(e.style.width)"
    squeezed = parked.evaluate(width)
    page.get_by_label("Compress parked time").uncheck()
    assert parked.evaluate(width) > squeezed
    page.get_by_label("Compress parked time").check()
    form = page.get_by_role("form", name="Approval refund")
    form.get_by_label("Comment").fill("looks right")
    form.get_by_role("button", name="Approve").click()
    expect(page.locator("#run-status")).to_have_text("succeeded")
    rec = h.wait_status(eid(run_id), "succeeded")
    assert rec.output == ["out-1", True, "ana", "out-3"]
    assert h.app.approvals(eid(run_id)) == []  # none pending any more


def test_a_child_run_is_a_linked_row_and_its_approval_is_decided_from_the_parent(
    dash: Dash,
) -> None:
    h = dash.h
    parent = dash.start("payout_parent", {"amount": 5})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(eid(parent), "child:")
    [child] = [r for r in h.app.runs() if r.parent_run_id == eid(parent)]
    h.wait_parked(child.run_id, "approval:")
    child_id = child.run_id.removeprefix("acme~")  # as the tenant's pages show it
    page = dash.signed_in()
    page.goto(f"/runs/{parent}")
    step_id = next(
        str(e.step_id)
        for e in h.app.events(eid(parent))
        if e.kind == "step_started" and e.payload.get("child_run_id")
    )
    expect(row(page, step_id).get_by_role("link", name="child run")).to_have_attribute(
        "href", f"/runs/{child_id}"
    )
    form = page.get_by_role("form", name="Approval payout")
    expect(form.get_by_role("link", name=child_id)).to_be_visible()
    form.get_by_role("button", name="Reject").click()
    expect(page.locator("#run-status")).to_have_text("succeeded")
    assert h.app.get(child.run_id).output == {"approved": False, "by": "ana"}
    row(page, step_id).get_by_role("link", name="child run").click()
    expect(page.locator("h1 .runid")).to_have_text(child_id)
    expect(rows(page)).to_have_count(1)


def test_cancel_signal_and_dead_letter_retry_from_the_pages(dash: Dash) -> None:
    h = dash.h
    listening = dash.start("listener", {})
    parked = dash.start("listener", {})
    doomed = dash.start("retrier", {"succeed_on": 9, "block_on": 0})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(eid(listening), "signal:go")
    h.wait_parked(eid(parked), "signal:go")
    h.wait_status(eid(doomed), "failed")
    page = dash.signed_in()

    page.goto(f"/runs/{listening}")
    page.get_by_label("Signal name").fill("go")
    page.get_by_label("Data (JSON)").fill('{"k": 1}')
    page.get_by_role("button", name="Send signal").click()
    expect(page.locator("#run-status")).to_have_text("succeeded")
    assert h.app.get(eid(listening)).output == ["out-1", {"k": 1}, "out-3"]

    page.goto(f"/runs/{parked}")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_text("cancelled")
    assert h.app.get(eid(parked)).status == "cancelled"
    # Who cancelled it is the drive's end, in the story at the top.
    expect(page.locator("#story-drives li").last).to_have_text(
        re.compile(r"parked \(signal\), cancelled by ana$")
    )

    # A failed run: its error with the failing step's traceback; the step's input.
    page.goto(f"/runs/{doomed}")
    story = page.get_by_role("region", name="Story")
    expect(story.locator("#story-traceback")).to_be_visible()
    expect(story.locator("#story-traceback summary")).to_have_text("Traceback of step 1:flaky")
    expect(story.locator("#story-traceback pre")).to_contain_text("in flaky")
    expect(story.locator("#story-traceback pre")).to_contain_text("ToolError: attempt 3 failed")
    expect(story.locator("#story-drives li")).to_have_text(
        re.compile(r"^w: failed, dead-lettered \(step_failed\)$")
    )
    row(page, "1:flaky").get_by_role("button", name="1:flaky").click()
    expect(page.locator("#detail-input")).to_have_text(
        json.dumps({"block_on": 0, "succeed_on": 9}, indent=2)
    )
    expect(page.locator("#detail-tb")).to_be_visible()
    expect(page.locator("#detail-traceback")).to_contain_text("ToolError: attempt 3 failed")

    page.goto("/runs")
    letters = page.get_by_role("region", name="Dead letters")
    letters.get_by_role("button", name=f"Retry {doomed}").click()
    expect(page.locator("#live")).to_contain_text(f"{doomed} re-queued: queued")
    wait_for(
        lambda: any(
            e.kind == "run_queued" and e.payload.get("reason") == "retry"
            for e in h.app.events(eid(doomed))
        ),
        what="the retried run to be queued again",
    )


def test_retry_is_offered_only_for_a_dead_lettered_run_to_a_token_that_may_retry(
    dash: Dash,
) -> None:
    h = dash.h
    doomed = dash.start("retrier", {"succeed_on": 9, "block_on": 0})
    lost = dash.start("retrier", {"succeed_on": 9, "block_on": 0})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(doomed), "failed")
    h.wait_status(eid(lost), "failed")
    # A failed run whose dead letter is gone (retried elsewhere, cleared by hand) cannot be
    # retried: the page must not offer it.
    store = h.app.store
    assert (
        h.app.portal.call(
            store._run(lambda tx: tx.run("dead_letter_delete", {"run_id": eid(lost)}))
        )
        == 1
    )
    retry = "Retry from dead letters"

    reader = dash.signed_in(dash.token(scopes=("runs:read", "runs:write")))
    reader.goto(f"/runs/{doomed}")
    expect(reader.locator("#run-status")).to_have_text("failed")
    expect(reader.get_by_role("button", name=retry)).to_have_count(0)

    page = dash.signed_in()
    page.goto(f"/runs/{lost}")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
    expect(page.get_by_role("button", name=retry)).to_have_count(0)

    page.goto(f"/runs/{doomed}")
    page.get_by_role("button", name=retry).click()
    expect(page.locator("#action-result")).to_contain_text(f"{doomed} re-queued")
    wait_for(
        lambda: any(
            e.kind == "run_queued" and e.payload.get("reason") == "retry"
            for e in h.app.events(eid(doomed))
        ),
        what="the retried run to be queued again",
    )


# -- isolation and CSRF ----------------------------------------------------------------------


def test_another_tenants_run_page_is_404_and_a_csrf_less_post_is_refused(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("listener", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_parked(eid(run_id), "signal:go")

    # globex's session: acme's run is not found, exactly like a missing one.
    other = dash.page()
    other.goto("/signin")
    other.get_by_label("API token").fill(dash.token("globex"))
    other.get_by_role("button", name="Sign in").click()
    expect(other.get_by_role("table", name="Runs")).to_contain_text("No runs")
    theirs = other.request.get(f"/runs/{run_id}")
    missing = other.request.get("/runs/no-such-run")
    assert (theirs.status, missing.status) == (404, 404)
    assert theirs.text().replace(run_id, "X") == missing.text().replace("no-such-run", "X")
    assert other.request.get(f"/v1/runs/{run_id}").status == 404
    assert (
        other.request.get(
            f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}
        ).status
        == 404
    )

    # acme's session: a POST on its cookie without the page's CSRF token changes nothing.
    page = dash.signed_in()
    for headers in ({}, {"X-CSRF-Token": "0" * 64}):
        refused = page.request.post(f"/v1/runs/{run_id}/cancel", headers=headers)
        assert refused.status == 403 and "CSRF" in refused.json()["message"]
    assert page.request.post("/signout", form={"csrf": "nope"}).status == 403
    assert h.app.get(eid(run_id)).status == "waiting"
    csrf = page.locator('meta[name="csrf-token"]').get_attribute("content")
    done = page.request.post(f"/v1/runs/{run_id}/cancel", headers={"X-CSRF-Token": csrf})
    assert done.status == 202 and h.app.get(eid(run_id)).status == "cancelled"
    # The run page follows the session's reads with the cookie over EventSource too.
    page.goto(f"/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("cancelled")


# -- a model call's answer ------------------------------------------------------------------


def test_a_run_page_tells_the_story_and_shows_a_models_answer_as_text(dash: Dash) -> None:
    from ratchet.llm.server import LocalProvider, serve

    h = dash.h
    with serve(LocalProvider()) as base:
        run_id = dash.start("asker", {"n": 1})
        h.spawn("w", env_extra={"CRASH_LLM_URL": base})
        h.wait_status(eid(run_id), "succeeded")
    page = dash.signed_in()
    page.goto(f"/runs/{run_id}")
    story = page.get_by_role("region", name="Story")
    expect(story.locator("#story-input")).to_have_text(json.dumps({"n": 1}, indent=2))
    expect(story.locator("#story-output")).to_contain_text("echo: question 1")
    expect(story.locator("#story-drives li")).to_have_text("w: succeeded")
    tokens = int(story.locator("#story-tokens").inner_text().replace(",", ""))
    assert tokens > 0
    expect(story.locator("#story-cost")).to_have_text(re.compile(r"^\$0\.\d{6}"))
    expect(story.locator("#story-duration")).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s)$"))

    step = "1:openai.chat.completions.create"
    row(page, step).get_by_role("button", name=step).click()
    # The answer as text; the raw response one click away.
    expect(page.locator("#detail-answer")).to_have_text("echo: question 1")
    raw = page.locator("#detail-raw")
    expect(page.locator("#detail-output")).not_to_be_visible()
    raw.locator("summary").click()
    expect(page.locator("#detail-output")).to_be_visible()
    expect(page.locator("#detail-output")).to_contain_text('"choices"')
    # What the call was sent with.
    expect(page.locator("#detail-input")).to_contain_text('"content": "question 1"')


def test_a_long_step_name_is_shown_whole(dash: Dash) -> None:
    h = dash.h
    run_id = dash.start("long_names", {})
    h.spawn("w", lease_ttl=3.0)
    h.wait_status(eid(run_id), "succeeded")
    page = dash.signed_in(viewport={"width": 900, "height": 700})
    page.goto(f"/runs/{run_id}")
    step = f"1:{crash_app.LONG_STEP}"
    label = row(page, step).locator(".wf-label")
    expect(label).to_have_attribute("title", step)
    expect(label.get_by_role("button", name=step)).to_be_visible()
    # A label never hides what does not fit: it wraps instead of cutting the name short.
    assert label.evaluate("e => getComputedStyle(e).textOverflow") != "ellipsis"
    assert label.evaluate("e => e.scrollWidth <= e.clientWidth + 1")


# -- an isolated run -------------------------------------------------------------------------


def test_an_isolated_runs_page_shows_each_sandbox_and_how_it_ended(
    dash: Dash, make_app: Any
) -> None:
    import shutil

    import isolated_app as iso

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    app = make_app()
    app.workflows.update(iso.app.workflows)
    app.launch()
    run_id = app.start(iso.always_crashes)
    wait_for(
        lambda: len([r for r in app.sandboxes(run_id) if r.status == "terminated"]) == 3,
        timeout=90,
        what="three sandboxes ended",
    )
    page = dash.signed_in(dash.token(tenant="default"))
    page.goto(f"/runs/{run_id}")
    boxes = page.locator("li.wf-sandbox")
    expect(boxes).to_have_count(3)
    for n in (1, 2, 3):
        box = boxes.nth(n - 1)
        expect(box.locator(".wf-label")).to_contain_text(f"sandbox {n}")
        expect(box.locator(".wf-label")).to_contain_text("crashed, signal 9")
        expect(box.get_by_role("img")).to_have_attribute(
            "aria-label", re.compile(rf"^sandbox {n} \(sbx-[0-9a-f]+\): crashed, signal 9, ")
        )
    expect(row(page, "1:crash")).to_be_visible()  # the steps follow
