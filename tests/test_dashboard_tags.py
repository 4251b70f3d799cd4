"""Run tags on the dashboard, in a real browser on both backends (the harness of
tests/test_dashboard.py): the list shows each run's tags as chips that filter by them, a
tag typed in the filters narrows the list (several: all of them), an active tag filter is
a chip that removes it, and a run's page shows its tags."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_dashboard
from proc import Harness
from test_dashboard import Dash, dashboard, expect

browser = test_dashboard.browser  # the module's browser fixture, shared


@pytest.fixture
def dash(h: Harness, browser: Any) -> Iterator[Dash]:
    with dashboard(h, browser, heartbeat_s=0.5, live_poll_s=0.2) as d:
        yield d


def test_the_list_filters_by_tags_and_a_run_page_shows_them(dash: Dash) -> None:
    with dash.api() as client:
        for run_id, tags in (
            ("a", {"customer": "acme", "env": "prod"}),
            ("b", {"customer": "acme"}),
            ("c", {"customer": "globex"}),
        ):
            body = {"workflow": "chain", "input": {"n": 1}, "run_id": run_id, "tags": tags}
            assert client.post("/v1/runs", json=body).status_code == 202
    page: Any = dash.signed_in()
    listed = page.get_by_role("table", name="Runs")
    expect(listed.locator("tbody tr")).to_have_count(3)
    row_a = listed.locator('tr[data-run-id="a"]')
    expect(row_a.get_by_role("link", name="env=prod")).to_be_visible()

    # A run's tag chip filters the list by it.
    listed.locator('tr[data-run-id="b"]').get_by_role("link", name="customer=acme").click()
    expect(listed.locator("tbody tr")).to_have_count(2)
    assert "tag=customer%3Dacme" in page.url
    # A second tag, typed: runs with both.
    page.get_by_label("Tag", exact=True).fill("env=prod")
    page.get_by_role("button", name="Filter").click()
    expect(listed.locator("tbody tr")).to_have_count(1)
    expect(listed.get_by_role("link", name="a", exact=True)).to_be_visible()
    # The active filter's chip removes it.
    page.get_by_role("link", name="Remove tag filter customer=acme").click()
    expect(listed.locator("tbody tr")).to_have_count(1)
    page.get_by_role("link", name="Remove tag filter env=prod").click()
    expect(listed.locator("tbody tr")).to_have_count(3)
    # A filter no run could match says why.
    page.get_by_label("Tag", exact=True).fill("no key")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("alert")).to_contain_text("expected key=value")

    page.goto("/runs/a")
    facts = page.locator("dl.facts")
    expect(facts.get_by_role("link", name="customer=acme")).to_be_visible()
    facts.get_by_role("link", name="env=prod").click()
    expect(page.get_by_role("table", name="Runs").locator("tbody tr")).to_have_count(1)
