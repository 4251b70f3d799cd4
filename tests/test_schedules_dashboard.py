"""The dashboard's Schedules page in a real browser, on both backends: an admin pauses,
resumes and runs a schedule from it; a reader sees it without the buttons."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schedule_app
from proc import Harness
from serving import serving
from test_dashboard import ALL, Dash, browser, expect

__all__ = ["browser"]  # the module's Chromium fixture, shared


@pytest.fixture
def sh(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(db_url, tmp_path, app=schedule_app)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def dash(sh: Harness, browser: Any) -> Iterator[Dash]:
    app = schedule_app.build(sh.db_url)
    try:
        with serving(app, workers=0) as base:
            d = Dash(base, sh, browser)
            try:
                yield d
            finally:
                for context in d.contexts:
                    context.close()
            assert d.problems == [], "\n".join(d.problems)
    finally:
        app.shutdown()


def test_an_admin_pauses_resumes_and_runs_a_schedule_from_the_page(dash: Dash) -> None:
    page = dash.signed_in(dash.token("default", ALL))
    page.get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    tick = page.locator('tr[data-schedule="tick"]')
    expect(tick).to_contain_text("every 1s")
    expect(tick.locator(".state")).to_have_text("active")
    tick.get_by_role("button", name="Pause").click()
    expect(tick.locator(".state")).to_have_text("paused")
    assert dash.h.app.schedules()[0]["paused"] is True
    tick.get_by_role("button", name="Run now").click()
    expect(page.get_by_role("status")).to_contain_text("run sched:tick:trigger:")
    assert any(r.run_id.startswith("sched:tick:trigger:") for r in dash.h.app.runs())
    tick.get_by_role("button", name="Resume").click()
    expect(tick.locator(".state")).to_have_text("active")


def test_a_reader_sees_schedules_without_their_buttons(dash: Dash) -> None:
    page = dash.signed_in(dash.token("default", ("runs:read",)))
    page.goto("/schedules")
    expect(page.locator('tr[data-schedule="tick"]')).to_contain_text("every 1s")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    # Another tenant has none of the default tenant's schedules.
    other = dash.signed_in(dash.token("globex", ALL))
    other.goto("/schedules")
    expect(other.get_by_text("No schedules.")).to_be_visible()
