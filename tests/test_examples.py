"""The account examples run as a user runs them (a fresh directory, their own SQLite file,
the local model provider), the graph and its code twin giving the same journal shape."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("script", ["accounts_graph.py", "accounts_code.py"])
def test_the_account_example_runs(script: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "approval asked: Acme first"
    assert lines[1] == "{'approved': True, 'delivered': True, 'top': 'Acme'}"
    journal = [line.split()[1:] for line in lines[2:-1]]
    kinds = [k for k, _ in journal]
    # Three enrichments, a rank, a summary, the approval parked then decided, the forecast
    # retried once after its timeout, one delivery.
    assert kinds == ["step_completed"] * 6 + [
        "step_waiting",
        "step_completed",
        "step_retrying",
        "step_completed",
        "step_completed",
    ]
    assert journal[6][1].startswith("7:approval:")
    assert journal[8][1].startswith("8:") and journal[-1][1] == "9:notify"
    if script == "accounts_graph.py":
        assert [s for _, s in journal[:4]] == [
            "1:load",
            "2:each#0/enrich",
            "3:each#1/enrich",
            "4:each#2/enrich",
        ]
    assert lines[-1] == "webhook: 1 delivery, 1 send(s)"
    # An ordinary run trips no guard (the defaults are on).
    with sqlite3.connect(tmp_path / ".ratchet" / "examples.db") as conn:
        journaled = {k for (k,) in conn.execute("SELECT DISTINCT kind FROM journal_events")}
    assert "step_completed" in journaled and "anomaly_detected" not in journaled


def test_the_example_graph_is_valid() -> None:
    from ratchet.graphs import load

    graph = load(EXAMPLES / "accounts.yaml", tools={"load_accounts", "rank_accounts"})
    assert len(graph.nodes) == 10
