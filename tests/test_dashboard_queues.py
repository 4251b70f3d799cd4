"""The dashboard's queues page in a real browser (Chromium, as tests/test_dashboard.py), on
both backends: the operator reaches it from the header and reads each queue's depth, runs
in flight and limits; a change through the API shows on the next load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import queues_app
from proc import Harness
from serving import serving
from test_dashboard import Dash, browser, expect

__all__ = ["browser"]  # the fixture, shared with test_dashboard


@pytest.fixture
def qdash(db_url: str, tmp_path: Path, browser: Any) -> Iterator[Dash]:
    h = Harness(db_url, tmp_path, queues_app)
    app = queues_app.build(db_url)
    try:
        with serving(app, workers=0) as base:
            d = Dash(base, h, browser)
            try:
                yield d
            finally:
                for context in d.contexts:
                    context.close()
            assert d.problems == [], "\n".join(d.problems)
    finally:
        app.shutdown()
        h.close()


def test_the_operator_reads_the_queues_page(qdash: Dash) -> None:
    qdash.h.app.start("limited")
    qdash.h.app.start("limited")
    secret = qdash.token("default", ("admin",), "ops")
    page = qdash.signed_in(secret)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Queues").click()
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    limited = page.locator('tr[data-queue="limited"]')
    expect(limited.get_by_role("cell")).to_have_text(
        ["limited", "2", "0 / 2", "2", "–", "–", "free their slot", "code"]
    )
    expect(page.locator('tr[data-queue="rated"]').get_by_role("cell").nth(5)).to_have_text(
        "2 per 1 s"
    )

    with qdash.api(secret) as client:
        r = client.patch("/v1/queues/limited", json={"concurrency": 5})
        assert r.status_code == 200, r.text
    page.reload()
    expect(limited.get_by_role("cell").nth(2)).to_have_text("0 / 5")
    expect(limited.get_by_role("cell").nth(7)).to_have_text("api")


def test_another_tenants_admin_has_no_queues_page(qdash: Dash) -> None:
    page = qdash.signed_in(qdash.token("acme"))
    nav = page.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Queues")).to_have_count(0)
    response = page.goto("/queues")
    assert response is not None and response.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.get_by_text("Queues are fleet-wide")).to_be_visible()
    expect(page.get_by_role("cell")).to_have_count(0)
    # The browser logs the 403 it was just shown, as it must.
    assert [p for p in qdash.problems if "403" not in p] == []
    qdash.problems.clear()
