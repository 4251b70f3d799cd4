"""The README's Performance tables and the benchmarks page's, from a full run's results.

A full ``make bench`` (and ``python -m bench.run --report-only``) rewrites the part of
README.md and of docs/results/benchmarks.md between the two markers below, so the tables
there are always those of the latest full run, with its date and machine; quick runs never
touch them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import METRICS, _cell, _label, llm_bill_table, server_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "results" / "benchmarks.md"
START = "<!-- bench:start (written by python -m bench.run from bench/results/latest.json) -->"
END = "<!-- bench:end -->"
# The rows the README shows of each backend's table; the full tables are in latest.md.
ROWS = {
    ("sequential", "step_us"),
    ("concurrent", "steps_per_s"),
    ("recovery", "to_result_ms"),
    ("replay", "to_last_step_ms"),
    ("pickup", "p50_ms"),
}
# Sections of latest.md the benchmarks page presents in its own words, with its own tables.
OWN_SECTIONS = ("Tokens billed", "Per-call overhead", "`ratchet server`", "The dashboard")


def _backend_table(figs: dict[str, dict[str, Any]], backend: str) -> list[str]:
    systems = sorted(
        (k for k in figs if k.split("|")[1:2] == [backend] and not k.startswith("limit|")),
        key=lambda k: (not k.startswith("ratchet|"), k),
    )
    me = figs.get(f"ratchet|{backend}|default", {})
    out = [
        "| measure | " + " | ".join(map(_label, systems)) + " |",
        "|---|" + "---|" * len(systems),
    ]
    for measure, fld, label, unit, _ in METRICS:
        key = f"{measure}.{fld}"
        if (measure, fld) not in ROWS or not any(figs[s].get(key) for s in systems):
            continue
        cells = []
        for s in systems:
            stats, mine = figs[s].get(key), me.get(key)
            cell = _cell(stats) if stats else "n/a"
            if stats and mine and not s.startswith("ratchet|") and stats["median"]:
                cell += f" — ratio {mine['median'] / stats['median']:.2f}"
            cells.append(cell)
        out.append(f"| {label} ({unit}) | " + " | ".join(cells) + " |")
    return out


# What the bill table rests on, said beside it: the re-sent call is billed once because the
# local provider honours Idempotency-Key; real providers decide that for themselves.
BILL_NOTE = (
    "Billed once rests on the provider honouring `Idempotency-Key`: the local provider "
    "does; OpenAI and Anthropic do not document it, and against them the call in flight "
    "at the crash may be billed twice. Finished calls are never re-sent, whatever the "
    "provider ([What is promised](docs/concepts/guarantees.md))."
)


def block(results: dict[str, Any]) -> str:
    """The README's Performance tables from ``results`` (after ``write_reports`` set its
    figures)."""
    figs, m = results["figures"], results["machine"]
    lines = [
        START,
        "",
        f"Ratchet beside DBOS, LangGraph and Absurd, every system at the same durability "
        f"(an fsync per commit), from the full run of {m['date']} on {m['cpus']} cores "
        f"({m['platform']}, Python {m['python']}, SQLite {m['sqlite']}, PostgreSQL "
        f"{m['postgres'].split(' ')[0]}); median (min–max) of {results['repeats']} repeats, "
        "ratio = Ratchet / peer. The full tables, the targets, what bounds the misses and "
        "how to reproduce them (`make bench`): [Benchmarks](docs/results/benchmarks.md).",
        "",
    ]
    for backend, title in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
        table = _backend_table(figs, backend)
        if len(table) > 2:
            lines += [f"{title}:", "", *table, ""]
    bill = llm_bill_table(results)
    if bill:
        lines += [
            "An agent of five model calls, its process SIGKILLed while the provider holds "
            "call 4, then resumed as each system resumes a run; what the provider billed:",
            "",
            *bill,
            "",
            BILL_NOTE,
            "",
        ]
    server = server_table(results)
    if server:
        lines += [
            "`ratchet server` (`python -m bench.run --server-only`, median):",
            "",
            *server,
            "",
        ]
    lines.append(END)
    return "\n".join(lines)


def page_block(report: str) -> str:
    """The benchmarks page's block: ``report`` (latest.md) without its title and the
    sections the page tells itself, its headings one level down."""
    sections = report.split("\n## ")
    intro = sections[0].split("\n", 1)[1].strip()  # the title's line dropped
    kept = ["### " + body.strip() for body in sections[1:] if not body.startswith(OWN_SECTIONS)]
    return "\n\n".join([START, intro, *kept, END])


def _replace(path: Path, text: str) -> bool:
    old = path.read_text("utf-8")
    head, sep, rest = old.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        return False
    path.write_text(head + text + tail, "utf-8")
    return True


def update(results: dict[str, Any], readme: Path = README) -> bool:
    """Rewrite the README's block from ``results``; False when the markers are missing."""
    return _replace(readme, block(results))


def update_page(report: str, page: Path = BENCHMARKS) -> bool:
    """Rewrite the benchmarks page's block from ``report``; False without the markers."""
    return _replace(page, page_block(report))
