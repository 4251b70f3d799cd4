"""The campaign report: its figures (the JSON written to chaos/results) and its text."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from chaos.app import LEASE_TTL, RECOVERY_INTERVAL
from chaos.check import Findings, percentile
from chaos.procs import CRASH_POINT_TARGET
from ratchet.engine.faults import POINTS

if TYPE_CHECKING:
    from chaos.campaign import Campaign


def assemble(
    c: Campaign,
    findings: Findings,
    from_logs: dict[str, int],
    recovery: dict[str, Any],
    timing: dict[str, Any],
) -> dict[str, Any]:
    """The report of campaign ``c`` from its findings, its workers' logs and the recovery
    times (all, outside partitions, by kind of outage, by cause, the slowest)."""
    cfg, fig = c.cfg, findings.figures
    hits = dict(c.arming.hits)
    refused = from_logs.get("stale_writes_refused", 0)
    accepted = fig["fencing_violations"]
    runs = dict(fig["runs"])
    runs["unconfirmed_submissions"] = len(c.unconfirmed)
    runs["submit_retries"] = c.submit_retries
    runs["statuses_at_drain_end"] = timing.pop("statuses_at_drain_end")
    runs["failed_by_error"] = dict(Counter(_error_class(r["error"]) for r in runs["failed_runs"]))
    runs["failed_runs"] = runs["failed_runs"][:20]
    violations = findings.violations
    rerun = (
        f"python -m chaos.run --backend {cfg.backend} --seed {cfg.seed} --runs {cfg.runs} "
        f"--faults {cfg.faults}{' --long' if cfg.long else ''}"
        f"{' --skip ' + ','.join(cfg.skip) if cfg.skip else ''}"
    )
    return {
        "backend": cfg.backend,
        "seed": cfg.seed,
        "rerun": rerun,
        **timing,
        "config": {
            "workers": cfg.workers,
            "concurrency": cfg.concurrency,
            "lease_ttl_s": LEASE_TTL,
            "recovery_interval_s": RECOVERY_INTERVAL,
            "runs": cfg.runs,
            "scheduled_faults": cfg.faults,
            "postgres": c.pg.target if c.pg is not None else None,
        },
        "runs": runs,
        "faults": {
            "injected": dict(sorted(c.injected.items())),
            "total": sum(c.injected.values()),
            "not_run": dict(c.not_run),
            "skipped_target_unavailable": dict(c.skipped),
            "details": dict(c.details),
            "timings_s": {k: [round(x, 2) for x in v] for k, v in c.timings.items()},
        },
        "crash_points": {
            "hits": {p: hits[p] for p in POINTS},
            "required": CRASH_POINT_TARGET,
            "covered": all(hits[p] >= CRASH_POINT_TARGET for p in POINTS),
        },
        "duplicate_completions": fig["duplicate_completions"],
        "deliveries": fig["deliveries"],
        "signals": {"sent": c.signals_sent, "errors": c.signal_errors},
        "cancels": {"chosen": len(c.to_cancel), **fig["cancels"], "errors": c.cancel_errors},
        "versions": fig["versions"],
        "duplicate_starts": fig["duplicate_starts"],
        "stale_writes": {
            "attempted": refused + accepted,
            "refused": refused,
            "accepted": accepted,
            "fenced_on_renewal": from_logs.get("fenced_on_renewal", 0),
            "stale_epoch_dispatches": fig["deliveries"]["stale_epoch_dispatches"],
        },
        "recovery_s": {
            **_spread(recovery["all"]),
            "outside_partitions": _spread(recovery["outside_partitions"]),
            "by_fault": {kind: _spread(xs) for kind, xs in recovery["by_fault"].items() if xs},
            "by_cause": {kind: _spread(xs) for kind, xs in sorted(recovery["by_cause"].items())},
            "slowest": recovery["slowest"],
        },
        "workers": {
            "starts": c.fleet.starts if c.fleet else 0,
            "unexpected_exits": dict(c.exits),
            "unexpected_exit_notes": c.exit_notes[:10],
            **from_logs,
        },
        "violations": {
            "count": len(violations),
            "by_check": fig["violations_by_check"],
            "examples": [v.as_dict() for v in violations[:25]],
        },
    }


def _error_class(error: str | None) -> str:
    """``StorageError`` from ``step 4:send failed: StorageError: PostgreSQL: ...``."""
    match = re.search(r"\b([A-Z]\w*(?:Error|Exception|Timeout|Failed|Lost))\b", error or "")
    return match.group(1) if match else (error or "?")[:40]


def _spread(xs: list[float]) -> dict[str, Any]:
    return {
        "samples": len(xs),
        "p50": _round(percentile(xs, 50)),
        "p99": _round(percentile(xs, 99)),
        "max": _round(max(xs) if xs else None),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _kv(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def render(r: dict[str, Any]) -> str:
    """The report as the text printed after a campaign."""
    runs, faults, dl, sw, rec = (
        r["runs"],
        r["faults"],
        r["deliveries"],
        r["stale_writes"],
        r["recovery_s"],
    )
    cp = r["crash_points"]
    cn, vs, ds = r["cancels"], r["versions"], r["duplicate_starts"]
    v = r["violations"]
    lines = [
        f"== chaos report: {r['backend']} (seed {r['seed']}) — {r['duration_s']}s "
        f"(faults {r['fault_phase_s']}s, drain {r['drain']['seconds']}s) ==",
        f"runs           submitted {runs['submitted']}, terminal {runs['terminal']} "
        f"(succeeded {runs['succeeded']}, failed {runs['failed']}, cancelled "
        f"{runs['cancelled']}), visibly waiting {runs['waiting_visibly']}, lost {runs['lost']}",
        f"children       {_kv(runs['children'])}",
        f"faults         {faults['total']} injected: {_kv(faults['injected'])}",
    ]
    if faults["details"]:
        lines.append(f"               {_kv(faults['details'])}")
    for kind, reason in faults["not_run"].items():
        lines.append(f"               NOT RUN {kind}: {reason}")
    if faults["skipped_target_unavailable"]:
        lines.append(
            f"               skipped (no eligible target): "
            f"{_kv(faults['skipped_target_unavailable'])}"
        )
    lines += [
        f"crash points   {_kv(cp['hits'])} (each >= {cp['required']}: "
        f"{'yes' if cp['covered'] else 'NO'})",
        f"completions    duplicate step completions {r['duplicate_completions']}",
        f"deliveries     dispatches {dl['dispatches']} for {dl['unique_keys']} unique keys "
        f"(resends {dl['resends']}), receiver double-applies "
        f"{dl['receiver_double_applies']}, receipts {dl['receipts']} "
        f"({dl['receipts_settled']} settled, {dl['receipts_reused_by_a_later_attempt']} "
        "reused by a later attempt of their step)",
        f"stale writes   attempted {sw['attempted']}, refused {sw['refused']}, accepted "
        f"{sw['accepted']}; fenced at renewal {sw['fenced_on_renewal']}; zombie dispatches "
        f"(deduped) {sw['stale_epoch_dispatches']}",
        f"cancels        {cn['requested']} of {cn['chosen']} chosen runs cancelled while busy: "
        f"{_kv(cn['outcomes'])}; children cancelled {cn['children_cancelled']}; latency "
        f"p50 {cn['latency_s']['p50']}s, p99 {cn['latency_s']['p99']}s, max "
        f"{cn['latency_s']['max']}s; steps started after the request "
        f"{cn['steps_started_after_request']}",
        f"versions       {vs['v2_only_runs']} runs of v2-only workflows, {vs['v2_only_drives']} "
        f"drives, by {vs['v2_workers']} version-2 worker ids",
        f"dup starts     {ds['runs']} runs started by {ds['callers']} callers at once; "
        f"{ds['answered_with_id']} callers got the id back",
        f"recovery       p50 {rec['p50']}s, p99 {rec['p99']}s, max {rec['max']}s "
        f"over {rec['samples']} held runs",
    ]
    out = rec.get("outside_partitions")
    if out:
        lines.append(
            f"               outside partitions: p50 {out['p50']}s, p99 {out['p99']}s, "
            f"max {out['max']}s ({out['samples']})"
        )
    for title, group in (
        ("by fault", rec.get("by_fault", {})),
        ("by cause", rec.get("by_cause", {})),
    ):
        lines.append(f"               {title}:")
        for kind, x in group.items():
            lines.append(
                f"                 {kind}: p50 {x['p50']}s, p99 {x['p99']}s, "
                f"max {x['max']}s ({x['samples']})"
            )
    w = r["workers"]
    exits = dict(w["unexpected_exits"])
    at_start = exits.pop("storage_error_at_start", 0)
    lines.append(
        f"workers        {w['starts']} starts; {at_start} exited at start on a storage "
        f"error (server down, disk full, connection cut); other exits: {_kv(exits)}"
    )
    if w.get("disk_full_errors"):
        lines.append(
            f"               'database or disk is full' seen {w['disk_full_errors']} "
            "times in worker logs"
        )
    if runs["failed"]:
        lines.append(f"failed runs    by error: {_kv(runs['failed_by_error'])}")
    lines.append(
        f"violations     {v['count']}" + (f" ({_kv(v['by_check'])})" if v["count"] else "")
    )
    for ex in v["examples"][:10]:
        lines.append(f"  - [{ex['check']}] {ex['run_id']}: {ex['detail']}")
    if r.get("workdir"):
        lines.append(f"kept           {r['workdir']}")
    return "\n".join(lines)
