"""The journal-size bench (bench/journal_size.py) on short conversations: content-addressed
requests grow the journal linearly with the conversation, whole requests with its square."""

from __future__ import annotations

from pathlib import Path

from bench.journal_size import measure_many, render


def test_content_addressed_requests_grow_the_journal_linearly(tmp_path: Path) -> None:
    short, long = measure_many([10, 20], tmp_path)

    def growth(way: str, field: str = "journal_bytes") -> float:
        return float(long[way][field] / short[way][field])

    assert growth("content_addressed") < 2.2  # twice the turns, about twice the bytes
    assert growth("content_addressed", "request_bytes") < 2.2
    assert growth("whole_requests") > 3.0
    assert growth("content_addressed") < growth("whole_requests") - 0.8
    # The same conversation both ways: the same events, the same messages sent.
    for r in (short, long):
        assert r["content_addressed"]["events"] == r["whole_requests"]["events"]
        assert r["content_addressed"]["messages_sent"] == r["whole_requests"]["messages_sent"]
    assert "20-turn agent" in render(long)
