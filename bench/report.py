"""Turn the bench's samples into figures: medians, ranges, ratios and the targets."""

from __future__ import annotations

import statistics
from typing import Any

# (measure, field, label, unit, better): better is "low" or "high".
METRICS = [
    ("sequential", "step_us", "sequential: per-step overhead", "µs", "low"),
    ("sequential", "workflows_per_s", "sequential: 10-step workflows/s", "/s", "high"),
    ("concurrent", "steps_per_s", "concurrent: durable steps/s", "/s", "high"),
    ("concurrent", "p50_ms", "concurrent: start→result p50", "ms", "low"),
    ("concurrent", "p99_ms", "concurrent: start→result p99", "ms", "low"),
    ("recovery", "to_step5_ms", "recovery: engine start → step 5 again", "ms", "low"),
    ("recovery", "to_result_ms", "recovery: engine start → result", "ms", "low"),
    ("takeover", "takeover_ms", "takeover by a running worker (defaults)", "ms", "low"),
    ("replay", "to_last_step_ms", "replay: re-drive → last step starts", "ms", "low"),
    ("replay", "peak_rss_mb", "replay: peak memory", "MB", "low"),
    ("graphreplay", "to_open_node_ms", "graph resume: engine start → first open node", "ms", "low"),
    ("pickup", "p50_ms", "pickup: start → first step, p50", "ms", "low"),
    ("pickup", "p99_ms", "pickup: start → first step, p99", "ms", "low"),
]


# Keys of the LLM measures' samples: "llmbill|<system>" (the crash bill) and
# "llmoverhead|<backend>" (the wrapped client's per-call overhead, bench/llm_overhead.py).
LLM_PREFIXES = ("llmbill|",)
LLM_OVERHEAD_PREFIX = "llmoverhead|"
LLM_OVERHEAD_EXTRA_US = 100  # the target: at most one commit plus this much
# Keys of the server measures' samples: "server|<backend>" (bench/server.py).
SERVER_PREFIX = "server|"
# Keys of the agent-scale samples (bench/agent_scale.py): "agentscale|<system>|<backend>|<n>".
AGENT_SCALE_PREFIX = "agentscale|"
# Its targets (10,000 runs): done within this many seconds of the last start, worker peak
# memory, and the time to start them all.
AGENT_SCALE_TARGETS = {"from_last_s": 4.0, "peak_rss_mb": 300.0, "start_s": 2.0}
# Key of the dashboard's samples (bench/dashboard.py): one per repeat of the whole measure.
DASHBOARD_KEY = "dashboard|sqlite"
# The dashboard's measures: (key in a sample's "ms", label with {events} and {runs}).
DASHBOARD_ROWS = (
    ("html", "run page, {events:,} events: HTML received"),
    ("run", "run page, {events:,} events: waterfall painted"),
    ("rows", "run page, {events:,} events: all rows in the DOM"),
    ("list", "runs list, {runs:,} runs: first contentful paint"),
)


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _figures(
    samples: dict[str, list[dict[str, Any]]], plan: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """{system key: {field: stats or note}} with derived figures."""
    out: dict[str, dict[str, Any]] = {}
    systems = {
        k.split("|", 1)[1]
        for k in samples
        if not k.startswith(
            (
                "limit|",
                "claimbacklog|",
                "sandbox|",
                SERVER_PREFIX,
                DASHBOARD_KEY,
                AGENT_SCALE_PREFIX,
                *LLM_PREFIXES,
            )
        )
    }
    for system in sorted(systems):
        figs: dict[str, Any] = {}
        zero = samples.get(f"sequential0|{system}", [])
        ten = samples.get(f"sequential10|{system}", [])
        step_us, wps = [], []
        for a, b in zip(zero, ten, strict=False):
            if "seconds" in a and "seconds" in b:
                n = b["n"]
                step_us.append((b["seconds"] - a["seconds"]) / (10 * n) * 1e6)
                wps.append(n / b["seconds"])
        figs["sequential.step_us"] = _stats(step_us)
        figs["sequential.workflows_per_s"] = _stats(wps)
        notes = [
            s.get("skipped") or s.get("error") for s in zero + ten if "skipped" in s or "error" in s
        ]
        if notes:
            figs["sequential.note"] = notes[0]
        for measure in ("concurrent", "recovery", "takeover", "replay", "graphreplay", "pickup"):
            rows = samples.get(f"{measure}|{system}", [])
            for m, fld, *_ in METRICS:
                if m == measure:
                    figs[f"{m}.{fld}"] = _stats([r[fld] for r in rows if fld in r])
            bad = [
                r.get("skipped") or r.get("error") for r in rows if "skipped" in r or "error" in r
            ]
            if bad:
                figs[f"{measure}.note"] = bad[0]
            settings = {r["setting"] for r in rows if "setting" in r}
            if measure == "concurrent":
                settings |= {
                    f"{n} ten-step workflows a pass"
                    for n in {r.get("n") for r in rows}
                    if n is not None
                }
            if settings:
                figs[f"{measure}.setting"] = "; ".join(sorted(settings))
        out[system] = figs
    for key, rows in samples.items():
        if key.startswith("limit|"):
            _, backend, clients = key.split("|")
            out.setdefault(f"limit|{backend}", {})[f"commits_per_s.{clients}"] = _stats(
                [r["commits_per_s"] for r in rows if "commits_per_s" in r]
            )
            out[f"limit|{backend}"][f"commit_us.{clients}"] = _stats(
                [r["commit_us"] for r in rows if "commit_us" in r]
            )
    return out


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(stats: dict[str, float] | None) -> str:
    if not stats:
        return "—"
    return f"{_fmt(stats['median'])} ({_fmt(stats['min'])}–{_fmt(stats['max'])})"


def _label(system: str) -> str:
    name, _backend, variant = system.split("|")
    return name if variant == "default" else f"{name} ({variant})"


def _targets(figs: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for backend in ("sqlite", "postgres"):
        me = figs.get(f"ratchet|{backend}|default", {})
        lim = figs.get(f"limit|{backend}", {})
        peers = {
            k: v
            for k, v in figs.items()
            if k.endswith(backend + "|" + k.split("|")[-1])
            and k.split("|")[1] == backend
            and not k.startswith(("ratchet|", "limit|"))
        }

        def med(d: dict[str, Any], key: str) -> float | None:
            s = d.get(key)
            return s["median"] if s else None

        step, commit = med(me, "sequential.step_us"), med(lim, "commit_us.1")
        if step is not None and commit:
            verdict = "met" if step <= 1.3 * commit else "missed"
            lines.append(
                f"- {backend}: per-step overhead {_fmt(step)} µs = "
                f"{step / commit:.2f}× one commit ({_fmt(commit)} µs); target ≤ 1.3×: "
                f"**{verdict}**"
            )
        sps, lim1 = med(me, "concurrent.steps_per_s"), med(lim, "commits_per_s.1")
        if sps is not None and lim1:
            verdict = "met" if sps >= 2 * lim1 else "missed"
            lines.append(
                f"- {backend}: concurrent {_fmt(sps)} steps/s = {sps / lim1:.2f}× the "
                f"single-client commit limit ({_fmt(lim1)}/s); target ≥ 2×: **{verdict}**"
            )
            for peer, pf in sorted(peers.items()):
                other = med(pf, "concurrent.steps_per_s")
                if other:
                    verdict = "met" if sps >= 10 * other else "missed"
                    lines.append(
                        f"  - vs {_label(peer)}: {sps / other:.1f}× (target ≥ 10×: **{verdict}**)"
                    )
        rec = med(me, "recovery.to_step5_ms")
        if rec is not None:
            lines.append(
                f"- {backend}: step 5 again {_fmt(rec)} ms after the new worker's "
                f"engine starts; target ≤ 10 ms: **{'met' if rec <= 10 else 'missed'}**"
            )
        tk = med(me, "takeover.takeover_ms")
        if tk is not None:
            lines.append(
                f"- {backend}: takeover {_fmt(tk)} ms after the kill (default settings); "
                f"target ≤ 2,000 ms: **{'met' if tk <= 2000 else 'missed'}**"
            )
        rp = med(me, "replay.to_last_step_ms")
        if rp is not None:
            lines.append(
                f"- {backend}: replay to the last step {_fmt(rp)} ms; target ≤ 50 ms: "
                f"**{'met' if rp <= 50 else 'missed'}**"
            )
        gr = med(me, "graphreplay.to_open_node_ms")
        if gr is not None:
            lines.append(
                f"- {backend}: graph resume at its first open node {_fmt(gr)} ms; "
                f"target ≤ 8 ms: **{'met' if gr <= 8 else 'missed'}**"
            )
        if backend == "postgres":
            pk = med(me, "pickup.p50_ms")
            if pk is not None:
                lines.append(
                    f"- postgres: pickup p50 {_fmt(pk)} ms; target ≤ 2 ms: "
                    f"**{'met' if pk <= 2 else 'missed'}**"
                )
    return lines


def _duration(results: dict[str, Any]) -> list[str]:
    """How long the run took and where the time went, largest family first."""
    if "elapsed_s" not in results:
        return []
    spent = sorted(results.get("spent_s", {}).items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{family} {seconds:,.0f} s" for family, seconds in spent)
    return [
        "",
        f"The run took {results['elapsed_s'] / 60:.1f} min" + (f" ({parts})." if parts else "."),
    ]


def write_reports(results: dict[str, Any]) -> str:
    """The markdown report; also stores the derived figures in ``results['figures']``."""
    figs = _figures(results["samples"], results.get("plan", {}))
    results["figures"] = figs
    m = results["machine"]
    out = [
        "# Benchmark results",
        "",
        f"{m['date']}; {m['cpus']} cores, {m['platform']}; Python {m['python']}; SQLite "
        f"{m['sqlite']} (WAL, synchronous=FULL); PostgreSQL {m['postgres']} "
        f"(fsync={m['postgres_settings']['fsync']}, synchronous_commit="
        f"{m['postgres_settings']['synchronous_commit']}). {results['repeats']} repeats"
        f"{' (QUICK)' if results['quick'] else ''}; median (min–max). Ratio = Ratchet / peer "
        "(for times lower is better, for rates higher is better).",
        *_duration(results),
        "",
        "## The database's own limit (one-row INSERT, one commit each)",
        "",
        "| backend | 1 client commits/s | µs per commit | 8 clients commits/s |",
        "|---|---|---|---|",
    ]
    for backend in ("sqlite", "postgres"):
        lim = figs.get(f"limit|{backend}", {})
        out.append(
            f"| {backend} | {_cell(lim.get('commits_per_s.1'))} | "
            f"{_cell(lim.get('commit_us.1'))} | {_cell(lim.get('commits_per_s.8'))} |"
        )
    for backend in ("sqlite", "postgres"):
        systems = sorted(
            (k for k in figs if k.split("|")[1:2] == [backend] and not k.startswith("limit|")),
            key=lambda k: (not k.startswith("ratchet|"), k),
        )
        if not systems:
            continue
        me = figs.get(f"ratchet|{backend}|default", {})
        out += [
            "",
            f"## {backend}",
            "",
            "| measure | " + " | ".join(map(_label, systems)) + " |",
            "|---|" + "---|" * len(systems),
        ]
        for measure, fld, label, unit, _ in METRICS:
            key = f"{measure}.{fld}"
            if not any(figs[s].get(key) for s in systems):
                continue
            cells = []
            for s in systems:
                stats = figs[s].get(key)
                cell = _cell(stats)
                mine = me.get(key)
                if stats and mine and not s.startswith("ratchet|") and stats["median"]:
                    cell += f" — ratio {mine['median'] / stats['median']:.2f}"
                if not stats and figs[s].get(f"{measure}.note"):
                    cell = "n/a"
                cells.append(cell)
            out.append(f"| {label} ({unit}) | " + " | ".join(cells) + " |")
        notes = [
            (s, k, v)
            for s in systems
            for k, v in figs[s].items()
            if k.endswith((".note", ".setting"))
        ]
        if notes:
            out += ["", "Notes:"]
            out += [
                f"- {_label(s)}, {k.replace('.note', '').replace('.setting', ' setting')}: "
                f"{str(v)[:200]}"
                for s, k, v in notes
            ]
    out += claim_backlog_section(results)
    out += llm_sections(results)
    out += llm_overhead_section(results)
    out += server_section(results)
    out += agent_scale_section(results)
    out += sandbox_section(results)
    out += dashboard_section(results)
    out += [
        "",
        "## Targets",
        "",
        *_targets(figs),
        *_llm_targets(results),
        *_llm_overhead_targets(results),
        *_server_targets(results),
        *_agent_scale_targets(results),
        *_dashboard_targets(results),
        "",
    ]
    return "\n".join(out)


def _dashboard_samples(results: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The dashboard's measured samples, and the notes of those that were not."""
    samples = results["samples"].get(DASHBOARD_KEY, [])
    return (
        [r for r in samples if "ms" in r],
        [str(r.get("skipped") or r.get("error")) for r in samples if "ms" not in r],
    )


def dashboard_section(results: dict[str, Any]) -> list[str]:
    """The dashboard's time to first render in Chromium (bench.dashboard)."""
    rows, notes = _dashboard_samples(results)
    if not rows:
        return ["", "## The dashboard", "", f"Not measured: {notes[0]}"] if notes else []
    first, run = rows[0], results.get("dashboard_run")
    out = [
        "",
        "## The dashboard: time to first render (Chromium, SQLite)",
        "",
        f"A run of {first['events']:,} journal events and a list of {first['runs']:,} runs "
        f"(`python -m bench.dashboard`): {first['repeats']} page loads each, after "
        "sign-in, in headless Chromium against `ratchet server`'s app; ms from the start "
        "of navigation, the first (cold) load included. Load average "
        f"{min(r['load_average'][0] for r in rows):.1f}–"
        f"{max(r['load_average'][0] for r in rows):.1f} while measuring."
        + (
            f" Measured {run['date']}{' (QUICK)' if run['quick'] else ''} with "
            "`python -m bench.run --dashboard-only`."
            if run
            else ""
        ),
        "",
        "| page | ms |",
        "|---|---|",
    ]
    for key, label in DASHBOARD_ROWS:
        stats = _stats([x for r in rows for x in r["ms"][key]])
        out.append(
            f"| {label.format(events=first['events'], runs=first['runs'])} | {_cell(stats)} |"
        )
    return out


def _dashboard_targets(results: dict[str, Any]) -> list[str]:
    rows, _ = _dashboard_samples(results)
    if not rows:
        return []
    out = []
    for key, what in (
        ("rows", f"run page of {rows[0]['events']:,} events, all rows"),
        ("list", f"runs list of {rows[0]['runs']:,} runs"),
    ):
        median = statistics.median(x for r in rows for x in r["ms"][key])
        out.append(
            f"- dashboard: {what} in {_fmt(median)} ms; target under 1 s: "
            f"**{'met' if median < 1000 else 'missed'}**"
        )
    return out


def sandbox_section(results: dict[str, Any]) -> list[str]:
    """The isolated tier (bench.sandbox): sandbox spawn to first step, per-step overhead."""
    rows = [r for r in results["samples"].get("sandbox|sqlite", []) if "step_us" in r]
    notes = [
        r.get("skipped") or r.get("error")
        for r in results["samples"].get("sandbox|sqlite", [])
        if "skipped" in r or "error" in r
    ]
    if not rows:
        return ["", "## The isolated tier", "", f"Not measured: {notes[0]}"] if notes else []
    first = _stats([r["spawn_to_first_step_ms"]["p50"] for r in rows])
    tail = _stats([r["spawn_to_first_step_ms"]["p99"] for r in rows])
    return [
        "",
        "## The isolated tier (bubblewrap, SQLite)",
        "",
        f"{rows[0]['runs']} sandboxes, then {rows[0]['steps']} trivial steps isolated and "
        "in-process, per repeat.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| sandbox spawn → first step reported, p50 (ms) | {_cell(first)} |",
        f"| sandbox spawn → first step reported, p99 (ms) | {_cell(tail)} |",
        f"| in-process step (µs) | {_cell(_stats([r['step_us']['process'] for r in rows]))} |",
        f"| reported step (µs) | {_cell(_stats([r['step_us']['isolated'] for r in rows]))} |",
        f"| overhead per reported step (µs) | "
        f"{_cell(_stats([r['step_overhead_us'] for r in rows]))} |",
    ]


def claim_backlog_section(results: dict[str, Any]) -> list[str]:
    """Ratchet's claim latency (p50 of one-run claims, ms) against the backlog size."""
    sizes = results.get("plan", {}).get("claim_backlogs") or sorted(
        {int(k.split("|")[2]) for k in results["samples"] if k.startswith("claimbacklog|")}
    )
    if not sizes:
        return []
    out = [
        "",
        "## Claim latency against backlog (Ratchet)",
        "",
        "A claim of one run, p50 in ms, with N runs in the database: half queued, half "
        "waiting on a timer an hour ahead. Flat means index-ordered."
        + (
            f" Measured {run['date']} ({run['repeats']} repeats"
            f"{', QUICK' if run['quick'] else ''}) with `python -m bench.run --claim-only`."
            if (run := results.get("claim_backlog_run"))
            else ""
        ),
        "",
        "| backend | " + " | ".join(f"N = {n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for backend in ("sqlite", "postgres"):
        cells = []
        for n in sizes:
            rows = results["samples"].get(f"claimbacklog|{backend}|{n}", [])
            stats = _stats([r["p50_ms"] for r in rows if "p50_ms" in r])
            bad = [r.get("error") for r in rows if "error" in r]
            cells.append(_cell(stats) if stats or not bad else "n/a")
        out.append(f"| {backend} | " + " | ".join(cells) + " |")
    return out


def _llm_rows(results: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return list(results["samples"].get(key, []))


def _counted(rows: list[dict[str, Any]], fld: str) -> str:
    """A count that should not vary: the value, or its range when the repeats differ."""
    values = [r[fld] for r in rows if fld in r]
    if not values:
        return "—"
    low, high = min(values), max(values)
    if low == high:
        return f"{low:,}"
    middle = statistics.median(values)
    shown = f"{int(middle):,}" if middle == int(middle) else f"{middle:,.1f}"
    return f"{shown} ({low:,}–{high:,})"


def _ratio(rows: list[dict[str, Any]]) -> str:
    values = [r["tokens_ratio"] for r in rows if "tokens_ratio" in r]
    if not values:
        return "—"
    low, high = min(values), max(values)
    if low == high:
        return f"{low:.2f}×"
    return f"{statistics.median(values):.2f}× ({low:.2f}–{high:.2f})"


def llm_bill_table(results: dict[str, Any], resumed_by: bool = False) -> list[str]:
    """The crash bill per system as a table (its header first); empty without samples."""
    systems = sorted(
        (k.split("|", 1)[1] for k in results["samples"] if k.startswith("llmbill|")),
        key=lambda s: (s != "ratchet", s),
    )
    if not systems:
        return []
    last = " resumed by |" if resumed_by else ""
    out = [
        "| system | calls sent | calls billed | billed tokens | × crash-free bill |" + last,
        "|---|---|---|---|---|" + ("---|" if resumed_by else ""),
    ]
    for system in systems:
        rows = _llm_rows(results, f"llmbill|{system}")
        ok = [r for r in rows if "tokens" in r]
        if not ok:
            bad = next((r.get("error") or r.get("skipped") for r in rows), "no sample")
            out.append(
                f"| {system} | n/a | n/a | n/a | n/a |"
                + (f" {str(bad)[:120]} |" if resumed_by else "")
            )
            continue
        out.append(
            f"| {system} | {_counted(ok, 'sent')} | {_counted(ok, 'calls')} | "
            f"{_counted(ok, 'tokens')} | {_ratio(ok)} |"
            + (f" {ok[0].get('resumed_by', '')} |" if resumed_by else "")
        )
    return out


def llm_sections(results: dict[str, Any]) -> list[str]:
    """The crash bill of a 5-call agent per system."""
    systems = [k.split("|", 1)[1] for k in results["samples"] if k.startswith("llmbill|")]
    if not systems:
        return []
    out: list[str] = []
    if systems:
        ordered = sorted(systems, key=lambda s: (s != "ratchet", s))
        clean = next(
            (r for s in ordered for r in _llm_rows(results, f"llmbill|{s}") if "clean_tokens" in r),
            None,
        )
        run = results.get("llm_run")
        out += [
            "",
            "## Tokens billed per completed run under crashes",
            "",
            "A 5-call agent (each call sends the conversation so far) through the official "
            "`openai` SDK against the local provider. Its process is SIGKILLed while the "
            "provider holds call 4, then the run is resumed as each system's users would; "
            "the provider bills every call it answers, the held one included, as a real "
            "provider does."
            + (
                f" Crash-free bill: {clean['clean_calls']} calls, {clean['clean_tokens']:,} tokens."
                if clean
                else ""
            )
            + (
                f" Measured {run['date']} ({run['repeats']} repeats"
                f"{', QUICK' if run['quick'] else ''}) with `python -m bench.run --llm-only`."
                if run
                else ""
            ),
            "",
            *llm_bill_table(results, resumed_by=True),
        ]
    return out


def _overhead_figures(
    results: dict[str, Any], backend: str
) -> tuple[dict[str, dict[str, float] | None], str | None]:
    rows = _llm_rows(results, f"{LLM_OVERHEAD_PREFIX}{backend}")
    ok = [r for r in rows if "commit_us" in r]
    figs = {
        f: _stats([r[f] for r in ok]) for f in ("bare_us", "wrapped_us", "overhead_us", "commit_us")
    }
    if ok:
        return figs, None
    # No figure: say why (the first repeat's error), so the table does not just go blank.
    return figs, next(
        (str(r.get("error") or r.get("skipped")) for r in rows if "error" in r or "skipped" in r),
        "no sample",
    )


def _overhead_verdict(figs: dict[str, dict[str, float] | None]) -> tuple[float, str] | None:
    over, commit = figs["overhead_us"], figs["commit_us"]
    if over is None or commit is None:
        return None
    bound = commit["median"] + LLM_OVERHEAD_EXTRA_US
    return bound, "met" if over["median"] <= bound else "missed"


def llm_overhead_section(results: dict[str, Any]) -> list[str]:
    """The wrapped client's per-call overhead on each backend, against one commit."""
    backends = [
        b for b in ("sqlite", "postgres") if f"{LLM_OVERHEAD_PREFIX}{b}" in results["samples"]
    ]
    if not backends:
        return []
    rows = [
        r for b in backends for r in _llm_rows(results, f"{LLM_OVERHEAD_PREFIX}{b}") if "n" in r
    ]
    n = rows[0]["n"] if rows else 0
    run = results.get("llm_overhead_run")
    out = [
        "",
        "## Per-call overhead of the wrapped client",
        "",
        f"{n} chat completions through `ratchet.llm.wrap(AsyncOpenAI())` inside a workflow "
        f"(each one journaled step) and {n} through the bare `AsyncOpenAI`, interleaved, "
        "to the same local provider with no delay; median µs per call, median (min–max) "
        "over the repeats. One commit: the database's own, measured beside "
        "(`bench.limit`, one client). Target: the difference at most one commit + "
        f"{LLM_OVERHEAD_EXTRA_US} µs."
        + (
            f" Measured {run['date']} ({run['repeats']} repeats"
            f"{', QUICK' if run['quick'] else ''}) with "
            "`python -m bench.run --llm-overhead-only`."
            if run
            else ""
        ),
        "",
        "| backend | bare `AsyncOpenAI` (µs) | `ratchet.llm.wrap`, in a workflow (µs) | "
        "difference (µs) | one commit (µs) | target | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend in backends:
        figs, error = _overhead_figures(results, backend)
        if error is not None:
            out.append(f"| {backend} | n/a | n/a | n/a | n/a | n/a | {error[:120]} |")
            continue
        judged = _overhead_verdict(figs)
        bound, verdict = judged if judged else (0.0, "n/a")
        out.append(
            f"| {backend} | {_cell(figs['bare_us'])} | {_cell(figs['wrapped_us'])} | "
            f"{_cell(figs['overhead_us'])} | {_cell(figs['commit_us'])} | "
            f"≤ {_fmt(bound)} | **{verdict}** |"
        )
    return out


def _llm_overhead_targets(results: dict[str, Any]) -> list[str]:
    lines = []
    for backend in ("sqlite", "postgres"):
        if f"{LLM_OVERHEAD_PREFIX}{backend}" not in results["samples"]:
            continue
        figs, _ = _overhead_figures(results, backend)
        judged = _overhead_verdict(figs)
        if judged is None or figs["overhead_us"] is None or figs["commit_us"] is None:
            continue
        bound, verdict = judged
        over, commit = figs["overhead_us"]["median"], figs["commit_us"]["median"]
        lines.append(
            f"- {backend}: the wrapped LLM client adds {_fmt(over)} µs to a call; "
            f"target ≤ one commit ({_fmt(commit)} µs) + {LLM_OVERHEAD_EXTRA_US} µs "
            f"= {_fmt(bound)} µs: **{verdict}**"
        )
    return lines


def _llm_targets(results: dict[str, Any]) -> list[str]:
    rows = [r for r in _llm_rows(results, "llmbill|ratchet") if "tokens_ratio" in r]
    if not rows:
        return []
    worst = max(rows, key=lambda r: abs(r["tokens_ratio"] - 1.0))
    verdict = "met" if all(r["tokens_ratio"] == 1.0 for r in rows) else "missed"
    return [
        f"- LLM crash bill: Ratchet {worst['tokens_ratio']:.2f}× the crash-free bill "
        f"({worst['calls']} calls billed of {worst['sent']} sent); target exactly 1.0×: "
        f"**{verdict}**"
    ]


# (measure, field, label): rows of the server section; a field "a/b" shows a/b.
SERVER_ROWS = [
    ("accept", "accepted_per_s", "`POST /v1/runs`: runs accepted/s"),
    ("accept", "p50_ms", "`POST /v1/runs`: latency p50 (ms)"),
    ("accept", "p99_ms", "`POST /v1/runs`: latency p99 (ms)"),
    ("accept", "server_cpu_pct/server_cpu_wait_pct", "`POST`: server CPU %, used / waited"),
    ("accept", "client_cpu_pct/client_cpu_wait_pct", "`POST`: clients CPU %, used / waited"),
    ("single", "p50_ms", "commit → SSE, 1 subscriber: p50 (ms)"),
    ("single", "p99_ms", "commit → SSE, 1 subscriber: p99 (ms)"),
    (
        "single",
        "created_p50_ms/created_p99_ms",
        "1 subscriber, from the event's creation: p50 / p99 (ms)",
    ),
    ("fanout", "p50_ms", "fan-out: commit → SSE p50 (ms)"),
    ("fanout", "p99_ms", "fan-out: commit → SSE p99 (ms)"),
    (
        "fanout",
        "created_p50_ms/created_p99_ms",
        "fan-out, from the event's creation: p50 / p99 (ms)",
    ),
    ("fanout", "deliveries_per_s", "fan-out: events delivered/s, all subscribers"),
    ("fanout", "server_cpu_pct/server_cpu_wait_pct", "fan-out: server CPU %, used / waited"),
    ("fanout", "server_rss_mb/server_peak_rss_mb", "fan-out: server RSS (MB), before / peak"),
    ("fanout", "client_cpu_pct/client_cpu_wait_pct", "fan-out: clients CPU %, used / waited"),
]


def _server_rows(results: dict[str, Any], backend: str) -> list[dict[str, Any]]:
    return list(results["samples"].get(f"{SERVER_PREFIX}{backend}", []))


def _server_cell(rows: list[dict[str, Any]], measure: str, fld: str) -> str:
    parts = []
    for name in fld.split("/"):
        stats = _stats([r[measure][name] for r in rows if name in r.get(measure, {})])
        parts.append(_cell(stats) if stats else "n/a")
    return " / ".join(parts)


# The server rows the README shows.
SERVER_SUMMARY = [
    ("accept", "accepted_per_s", "`POST /v1/runs` accepted/s"),
    ("single", "p50_ms/p99_ms", "commit → SSE, 1 subscriber, p50 / p99 (ms)"),
    ("fanout", "p50_ms/p99_ms", "commit → SSE, fan-out, p50 / p99 (ms)"),
]


def server_table(results: dict[str, Any]) -> list[str]:
    """A few of the server's figures as a table; empty without samples."""
    backends = [b for b in ("sqlite", "postgres") if _server_rows(results, b)]
    if not backends:
        return []
    out = ["| measure | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for measure, fld, label in SERVER_SUMMARY:
        cells = [_server_cell(_server_rows(results, b), measure, fld) for b in backends]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def server_section(results: dict[str, Any]) -> list[str]:
    """``ratchet server``: starts accepted per second, and commit → SSE client latency."""
    backends = [b for b in ("sqlite", "postgres") if _server_rows(results, b)]
    if not backends:
        return []
    first = _server_rows(results, backends[0])[0]
    subscribers = first.get("fanout", {}).get("subscribers", 0)
    clients = first.get("accept", {}).get("clients", "?")
    run = results.get("server_run")
    loads = [
        r[m]["load_average"]
        for b in backends
        for r in _server_rows(results, b)
        for m in ("accept", "single", "fanout")
        if "load_average" in r.get(m, {})
    ]
    out = [
        "",
        "## `ratchet server`: starts and journal streams",
        "",
        "One `ratchet server` process (uvicorn, `--workers 0`) per backend, on a fresh "
        f"database, with a real token. `POST /v1/runs`: {clients} keep-alive clients in "
        "separate processes. Streams: a worker in another process drives one run at 100 "
        "events/s (a commit every 20 ms, two events each); its store stamps each event as "
        "its commit returns, and the latency runs from that stamp to the event's arrival "
        "at the client, on the same clock. A stamp can only be late (the writer waited for a "
        "CPU after its commit: on a busy machine the smallest latencies come out below "
        "zero), so the latency from the event's creation, taken before its commit, is "
        f"given too, as a bound from above. Fan-out: {subscribers:,} SSE subscribers of "
        "that run, spread over client processes; every subscriber received every event "
        "exactly once, in order, or the sample is an error. CPU in % of one core: used, "
        "and waited for (runnable, but the cores were busy; Linux schedstat, summed over "
        "a process's threads, so it can pass 100). PostgreSQL "
        "wakes the server's tail by LISTEN/NOTIFY; SQLite has no cross-process wake-up, "
        "so the server polls the journal heads every 50 ms."
        + (
            f" Measured {run['date']} ({run['repeats']} repeats"
            f"{', QUICK' if run['quick'] else ''}) with `python -m bench.run --server-only`."
            if run
            else ""
        ),
        "",
        "**This machine is shared and was busy**: load average "
        + (f"{min(loads):.1f}–{max(loads):.1f}" if loads else "?")
        + " on its cores while measuring, so the waits for a CPU are in these figures; "
        "the fan-out figures in particular are the machine's, not the server's alone.",
        "",
        "| measure | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for measure, fld, label in SERVER_ROWS:
        cells = [_server_cell(_server_rows(results, b), measure, fld) for b in backends]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    notes = [
        f"- {b}, {m}: {r[m]['error']}"
        for b in backends
        for r in _server_rows(results, b)
        for m in ("accept", "single", "fanout")
        if "error" in r.get(m, {})
    ]
    if notes:
        out += ["", "Errors:", *notes]
    return out


def _server_targets(results: dict[str, Any]) -> list[str]:
    rows = [
        r["single"] for r in _server_rows(results, "postgres") if "p50_ms" in r.get("single", {})
    ]
    if not rows:
        return []
    p50 = statistics.median(r["p50_ms"] for r in rows)
    bound = statistics.median(r.get("created_p50_ms", r["p50_ms"]) for r in rows)
    return [
        f"- postgres: commit → SSE p50 with one subscriber {_fmt(p50)} ms (from the "
        f"event's creation {_fmt(bound)} ms); target under 10 ms: "
        f"**{'met' if bound < 10 else 'missed'}**"
    ]


AGENT_SCALE_ROWS = (
    ("start_s", "time to start all N (s)"),
    ("from_first_s", "first start → all done (s)"),
    ("from_last_s", "last start → all done (s)"),
    ("peak_rss_mb", "worker peak RSS (MB)"),
    ("worker_cpu_s", "worker CPU (s)"),
    ("worker_gc_s", "in the garbage collector, wall (s)"),
)


def _agent_scale_keys(results: dict[str, Any]) -> list[tuple[str, str, int]]:
    keys = []
    for key in results["samples"]:
        if key.startswith(AGENT_SCALE_PREFIX):
            _, system, backend, n = key.split("|")
            keys.append((system, backend, int(n)))
    return sorted(keys, key=lambda k: (k[1] != "sqlite", k[2], k[0] != "ratchet", k[0]))


def agent_scale_section(results: dict[str, Any]) -> list[str]:
    """N runs started at once, 3 one-second model calls each, one worker process."""
    keys = _agent_scale_keys(results)
    if not keys:
        return []
    run = results.get("agent_scale_run")
    out = [
        "",
        "## Agent scale: N runs at once, 3 one-second model calls each",
        "",
        "N runs started at once from a client process (Ratchet: one `app.start_many`; "
        "DBOS: a `DBOSClient.enqueue` per workflow, as it has no batch enqueue), driven "
        "by one worker process with concurrency N. A model call is a step awaiting "
        "`asyncio.sleep(1)`, so the ideal is everything done 3 s after the starts. "
        '"All done" is seen by counting finished runs every 25 ms; peak RSS is the '
        "worker's VmHWM. The worker's CPU time (all its threads, from ready to stop) is "
        "the figure a busy machine does not inflate: on an idle core the wall times "
        "cannot fall below it."
        + (
            f" Measured {run['date']} ({run['repeats']} repeats"
            f"{', QUICK' if run['quick'] else ''}) with "
            "`python -m bench.run --agent-scale-only`."
            if run
            else ""
        ),
        "",
        "| system | backend | N | " + " | ".join(label for _, label in AGENT_SCALE_ROWS) + " |",
        "|---|---|---|" + "---|" * len(AGENT_SCALE_ROWS),
    ]
    notes = []
    for system, backend, n in keys:
        rows = results["samples"][f"{AGENT_SCALE_PREFIX}{system}|{backend}|{n}"]
        cells = [
            _cell(_stats([r[f] for r in rows if f in r and "error" not in r]))
            for f, _ in AGENT_SCALE_ROWS
        ]
        out.append(f"| {system} | {backend} | {n:,} | " + " | ".join(cells) + " |")
        notes += [f"- {system}, {backend}, N={n:,}: {r['error']}" for r in rows if "error" in r]
        settings = {r["setting"] for r in rows if "setting" in r}
        notes += [f"- {system}, {backend}, N={n:,} setting: {s}" for s in sorted(settings)]
    loads = [
        r["load_average"][0]
        for key, rows in results["samples"].items()
        if key.startswith(AGENT_SCALE_PREFIX)
        for r in rows
        if "load_average" in r
    ]
    if loads:
        notes.append(
            f"- load average (1 min) while measuring: {min(loads):.1f}–"
            f"{max(loads):.1f} on {results['machine']['cpus']} cores"
        )
    if not any(system == "dbos" and n >= 10_000 for system, _, n in keys):
        notes.append(
            "- DBOS runs N=2,000 only: a queue of 10,000 one-second agents takes it "
            "minutes (enqueue one by one, dequeue by polling), past the bench's "
            "budget."
        )
    return out + (["", "Notes:", *notes] if notes else [])


def _agent_scale_targets(results: dict[str, Any]) -> list[str]:
    lines = []
    for backend in ("sqlite", "postgres"):
        rows = [
            r
            for r in results["samples"].get(f"{AGENT_SCALE_PREFIX}ratchet|{backend}|10000", [])
            if "error" not in r
        ]
        if not rows:
            continue
        parts = []
        for fld, label, unit in (
            ("from_last_s", "done after the last start", "s"),
            ("peak_rss_mb", "worker memory", "MB"),
            ("start_s", "start 10,000", "s"),
        ):
            value = statistics.median(r[fld] for r in rows if r.get(fld) is not None)
            bound = AGENT_SCALE_TARGETS[fld]
            parts.append(
                f"{label} {_fmt(value)} {unit} (target under {bound:g} {unit}: "
                f"**{'met' if value < bound else 'missed'}**)"
            )
        lines.append(f"- {backend}: 10,000 agent runs: " + "; ".join(parts))
    return lines
