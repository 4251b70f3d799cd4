"""The bench's LLM measures: Ratchet's crash bill end to end (a real child process
SIGKILLed while the local provider holds its 4th call, then a worker resuming the run), and
how the report renders the crash bills and the wrapped client's overhead."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.peers import llm
from bench.report import llm_overhead_section, llm_sections, write_reports


@pytest.mark.crash
def test_ratchet_bills_a_run_killed_during_call_4_exactly_once(tmp_path: Path) -> None:
    bill = llm.crash_bill("ratchet", str(tmp_path / "ratchet.db"), timeout=60)
    assert "error" not in bill, bill["error"]
    assert bill["sent_before_kill"] == llm.KILL_AT
    # Six requests reached the provider, five were billed: exactly the crash-free bill.
    assert (bill["sent"], bill["calls"], bill["replayed"]) == (6, 5, 1)
    assert bill["tokens"] == bill["clean_tokens"] and bill["tokens_ratio"] == 1.0
    keys = [r["key"] for r in bill["requests"]]
    assert all(keys)
    # Call 4 was sent twice, by the killed process and by the resuming worker, under one
    # key: billed the first time, answered from the provider's store the second.
    assert keys[3] == keys[4]
    assert [(r["billed"], r["replayed"]) for r in bill["requests"][3:5]] == [
        (True, False),
        (False, True),
    ]
    assert Counter(keys).most_common(2)[1][1] == 1  # every other call once


def _bill(system: str, calls: int, tokens: int, sent: int = 6) -> dict[str, Any]:
    return {
        "system": system,
        "sent": sent,
        "calls": calls,
        "tokens": tokens,
        "clean_calls": 5,
        "clean_tokens": 915,
        "tokens_ratio": tokens / 915,
        "resumed_by": f"{system} resumes",
    }


def _results() -> dict[str, Any]:
    return {
        "quick": True,
        "repeats": 2,
        "machine": {
            "date": "2026-01-01 00:00 UTC",
            "cpus": 2,
            "platform": "Linux",
            "python": "3.11",
            "sqlite": "3.40",
            "postgres": "15",
            "postgres_settings": {"fsync": "on", "synchronous_commit": "on"},
        },
        "samples": {
            "llmbill|langgraph": [_bill("langgraph", 6, 1135), _bill("langgraph", 6, 1135)],
            "llmbill|dbos": [_bill("dbos", 6, 1135), {"error": "timeout: no answer"}],
            "llmbill|ratchet": [_bill("ratchet", 5, 915), _bill("ratchet", 5, 915)],
            "llmoverhead|sqlite": [
                {
                    "n": 100,
                    "bare_us": 1800.0,
                    "wrapped_us": 2000.0,
                    "overhead_us": 200.0,
                    "commit_us": 150.0,
                },
                {
                    "n": 100,
                    "bare_us": 2000.0,
                    "wrapped_us": 2240.0,
                    "overhead_us": 240.0,
                    "commit_us": 170.0,
                },
            ],
            "llmoverhead|postgres": [
                {
                    "n": 100,
                    "bare_us": 1900.0,
                    "wrapped_us": 2900.0,
                    "overhead_us": 1000.0,
                    "commit_us": 400.0,
                },
                {"backend": "postgres", "error": "no answer within 140 s"},
            ],
        },
    }


def test_the_report_renders_the_crash_bills_and_the_overhead() -> None:
    lines = llm_sections(_results())
    text = "\n".join(lines)
    assert "## Tokens billed per completed run under crashes" in lines
    assert "Crash-free bill: 5 calls, 915 tokens." in text
    table = [line for line in lines if line.startswith("| ")]
    assert table[:4] == [
        "| system | calls sent | calls billed | billed tokens | × crash-free bill | resumed by |",
        "| ratchet | 6 | 5 | 915 | 1.00× | ratchet resumes |",  # Ratchet first
        "| dbos | 6 | 6 | 1,135 | 1.24× | dbos resumes |",  # the failed repeat left out
        "| langgraph | 6 | 6 | 1,135 | 1.24× | langgraph resumes |",
    ]
    assert "## Per-call overhead of the wrapped client" not in lines  # a section of its own
    assert len(table) == 4


def test_the_overhead_is_judged_per_backend_against_one_commit_plus_100_us() -> None:
    results = _results()
    lines = llm_overhead_section(results)
    assert "## Per-call overhead of the wrapped client" in lines
    table = [line for line in lines if line.startswith("| ")]
    assert table == [
        "| backend | bare `AsyncOpenAI` (µs) | `ratchet.llm.wrap`, in a workflow (µs) | "
        "difference (µs) | one commit (µs) | target | verdict |",
        "| sqlite | 1,900 (1,800–2,000) | 2,120 (2,000–2,240) | 220 (200–240) | "
        "160 (150–170) | ≤ 260 | **met** |",
        # The failed repeat is left out; the one that answered is judged.
        "| postgres | 1,900 (1,900–1,900) | 2,900 (2,900–2,900) | 1,000 (1,000–1,000) | "
        "400 (400–400) | ≤ 500 | **missed** |",
    ]
    report = write_reports(results)
    assert (
        "- sqlite: the wrapped LLM client adds 220 µs to a call; target ≤ one commit "
        "(160 µs) + 100 µs = 260 µs: **met**"
    ) in report
    assert "- postgres: the wrapped LLM client adds 1,000 µs" in report
    # A backend whose every repeat failed says why.
    results["samples"]["llmoverhead|postgres"] = [{"backend": "postgres", "error": "boom"}]
    assert "| postgres | n/a | n/a | n/a | n/a | n/a | boom |" in llm_overhead_section(results)


def test_a_system_whose_every_repeat_failed_says_why_and_ratchet_off_target_is_missed() -> None:
    results = _results()
    results["samples"]["llmbill|dbos"] = [{"error": "the crash run ended first"}]
    results["samples"]["llmbill|ratchet"] = [_bill("ratchet", 5, 915), _bill("ratchet", 6, 1135)]
    lines = llm_sections(results)
    assert "| dbos | n/a | n/a | n/a | n/a | the crash run ended first |" in lines
    assert (
        "| ratchet | 6 | 5.5 (5–6) | 1,025 (915–1,135) | 1.12× (1.00–1.24) | ratchet resumes |"
        in lines
    )
    report = write_reports(results)
    assert "target exactly 1.0×: **missed**" in report
    # The LLM samples are no system of the main tables.
    assert "## sqlite" not in report and "llmbill" not in report
