"""The chaos campaign's invariant checker on hand-made journals: a well-formed journal,
including legitimate re-drives, passes every check, and each check fails on a journal
that breaks its invariant."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from chaos.check import (
    DupStart,
    Evidence,
    LockRow,
    ReceiptRow,
    RunRow,
    check_all,
    check_branches,
    check_completions,
    check_fencing,
    check_journal,
    check_keys,
    check_lost,
    check_receiver,
    percentile,
    recovery_times,
)
from ratchet.model import GENESIS_HASH, Event, idempotency_key

RUN = "run-1"
Spec = tuple[str, str | None, int | None, dict[str, Any]]


def key(step: str, attempt: int = 1, run: str = RUN) -> str:
    return idempotency_key(run, step, attempt)


def chain(specs: list[Spec], run: str = RUN, t0: float = 1000.0) -> list[Event]:
    """A hash-chained journal from (kind, step_id, attempt, payload) specs."""
    out: list[Event] = []
    prev = GENESIS_HASH
    for i, (kind, step, attempt, payload) in enumerate(specs, start=1):
        ev = Event.chain(run, i, kind, step, attempt, payload, t0 + i, prev)
        out.append(ev)
        prev = ev.hash
    return out


def drive(n: int, epoch: int, worker: str = "w0-1", reason: str = "claim") -> Spec:
    kind = "run_started" if n == 1 else "run_resumed"
    return (kind, None, None, {"worker_id": worker, "epoch": epoch, "reason": reason, "drive": n})


def started(step: str, attempt: int = 1, resumed: bool = False, run: str = RUN) -> Spec:
    payload: dict[str, Any] = {"idempotency_key": key(step, attempt, run)}
    if resumed:
        payload["resumed"] = True
    return ("step_started", step, attempt, payload)


def completed(step: str, output: Any, attempt: int | None = 1) -> Spec:
    return ("step_completed", step, attempt, {"output": output})


ANSWER = {"key": key("2:send"), "applied_as": 1}
QUEUED: Spec = ("run_queued", None, None, {"workflow": "flow", "version": "1"})
SUCCEEDED: Spec = ("run_succeeded", None, None, {"output": ["w0", ANSWER]})


def good_specs() -> list[Spec]:
    """Drive 1 dies inside step 2 after dispatching; drive 2 (a steal, epoch 2) resumes
    the same attempt under the same key, finds the receipt claimed, resends, settles."""
    return [
        QUEUED,
        drive(1, 1),
        started("1:work"),
        completed("1:work", "w0"),
        started("2:send"),
        drive(2, 2, "w1-1", "sweep"),
        started("2:send", resumed=True),
        completed("2:send", ANSWER),
        SUCCEEDED,
    ]


def arrival(
    k: str,
    n: int,
    applied: bool,
    epoch: int = 1,
    step: str = "2:send",
    t: float = 1005.5,
    run: str = RUN,
) -> dict[str, Any]:
    return {
        "key": k,
        "run": run,
        "step": step,
        "epoch": epoch,
        "t": t,
        "arrival": n,
        "applied": applied,
        "response": {"key": k, "applied_as": 1},
    }


def good_evidence() -> Evidence:
    events = chain(good_specs())
    return Evidence(
        submitted=[RUN],
        runs={RUN: RunRow(RUN, "succeeded")},
        events={RUN: events},
        receipts=[ReceiptRow(key("2:send"), RUN, "2:send", "settled", 2, ANSWER, "#1", 1)],
        locks={RUN: LockRow(RUN, None, 2, 0.0)},
        arrivals=[
            arrival(key("2:send"), 1, True, epoch=1),
            arrival(key("2:send"), 2, False, epoch=2, t=1007.5),
        ],
        now=2000.0,
        max_attempts={"work": 1, "send": 4},
    )


def checks_of(ev: Evidence) -> set[str]:
    return {v.check for v in check_all(ev).violations}


def with_specs(specs: list[Spec], **changes: Any) -> Evidence:
    ev = good_evidence()
    ev.events = {RUN: chain(specs)}
    return dataclasses.replace(ev, **changes)


# -- the well-formed case --------------------------------------------------------------------


def test_a_well_formed_campaign_with_a_redrive_passes_every_check() -> None:
    findings = check_all(good_evidence())
    assert findings.violations == []
    assert findings.figures["runs"]["lost"] == 0
    assert findings.figures["deliveries"]["dispatches"] == 2
    assert findings.figures["deliveries"]["unique_keys"] == 1
    assert findings.figures["deliveries"]["receiver_double_applies"] == 0


def test_retries_and_sleeps_and_signals_are_legitimate() -> None:
    specs = [
        QUEUED,
        drive(1, 1),
        started("1:send"),
        ("step_retrying", "1:send", 1, {"attempt": 1, "of": 4, "error": "x", "delay_s": 0.2}),
        started("1:send", 2),
        completed("1:send", {"key": key("1:send", 2), "applied_as": 1}, 2),
        ("step_waiting", "2:sleep", None, {"reason": "sleep", "seconds": 0.5, "until": 5.0}),
        drive(2, 2),
        completed("2:sleep", None, None),
        ("step_waiting", "3:signal:go", None, {"reason": "signal", "name": "go"}),
        drive(3, 3),
        ("signal_received", "3:signal:go", None, {"name": "go", "signal_id": 1}),
        completed("3:signal:go", {"from": "campaign"}, None),
        ("run_succeeded", None, None, {"output": []}),
    ]
    k2 = key("1:send", 2)
    ev = with_specs(
        specs,
        receipts=[
            ReceiptRow(k2, RUN, "1:send", "settled", 1, {"key": k2, "applied_as": 1}, "#1", 2)
        ],
        locks={RUN: LockRow(RUN, None, 3, 0.0)},
        arrivals=[arrival(k2, 1, True, step="1:send")],
    )
    assert check_all(ev).violations == []


# -- 1. lost runs, and unexpected failures ---------------------------------------------------


@pytest.mark.parametrize(
    ("row", "pending"),
    [
        pytest.param(None, {}, id="missing"),
        pytest.param(RunRow(RUN, "running"), {}, id="stuck-running"),
        pytest.param(RunRow(RUN, "queued"), {}, id="stuck-queued"),
        pytest.param(RunRow(RUN, "waiting", None), {}, id="waiting-on-nothing"),
        pytest.param(RunRow(RUN, "waiting", "signal:go"), {RUN: {"go"}}, id="lost-wakeup"),
        pytest.param(RunRow(RUN, "waiting", "sleep:2:sleep", 100.0), {}, id="timer-missed"),
    ],
)
def test_lost_runs_are_violations(row: RunRow | None, pending: dict[str, set[str]]) -> None:
    ev = dataclasses.replace(
        good_evidence(), runs={RUN: row} if row else {}, pending_signals=pending
    )
    figures, violations = check_lost(ev)
    assert [v.check for v in violations] == ["lost"]
    assert figures["lost"] == 1


def test_visibly_waiting_runs_are_not_lost() -> None:
    ev = dataclasses.replace(good_evidence(), runs={RUN: RunRow(RUN, "waiting", "signal:go")})
    figures, violations = check_lost(ev)
    assert violations == [] and figures["waiting_visibly"] == 1


def test_an_unexpected_failure_is_a_violation_an_expected_one_is_not() -> None:
    ev = dataclasses.replace(
        good_evidence(),
        runs={RUN: RunRow(RUN, "failed", error="step 2:send failed: StorageError: boom")},
    )
    assert [v.check for v in check_lost(ev)[1]] == ["failure"]
    ev.expected_failures = ("StorageError",)
    assert check_lost(ev)[1] == []


# -- 2. the journal's shape ------------------------------------------------------------------


def test_a_seq_gap_is_a_violation() -> None:
    events = chain(good_specs())
    del events[3]
    assert check_journal(RUN, events, RunRow(RUN, "succeeded"))


def test_a_broken_chain_is_a_violation() -> None:
    events = chain(good_specs())
    events[4] = dataclasses.replace(events[4], prev_hash="f" * 64)
    assert any("chain" in v.detail for v in check_journal(RUN, events, RunRow(RUN, "succeeded")))


def test_a_tampered_event_is_a_violation() -> None:
    events = chain(good_specs())
    events[3] = dataclasses.replace(
        events[3], payload={"output": "forged"}, payload_json='{"output":"forged"}'
    )
    assert any("hash" in v.detail for v in check_journal(RUN, events, RunRow(RUN, "succeeded")))


def test_two_terminal_events_are_a_violation() -> None:
    specs = [*good_specs(), ("run_failed", None, None, {"error": "late"})]
    assert checks_of(with_specs(specs)) >= {"journal"}


def test_an_event_after_the_terminal_one_is_a_violation() -> None:
    specs = [*good_specs(), started("3:work")]
    violations = check_journal(RUN, chain(specs), RunRow(RUN, "succeeded"))
    assert any("after the terminal" in v.detail for v in violations)


def test_status_and_terminal_event_must_agree() -> None:
    assert check_journal(RUN, chain(good_specs()), RunRow(RUN, "failed"))
    assert check_journal(RUN, chain(good_specs()), RunRow(RUN, "running"))
    assert check_journal(RUN, chain(good_specs()[:-1]), RunRow(RUN, "succeeded"))


# -- 3. completions --------------------------------------------------------------------------


def test_a_second_completion_of_a_step_is_a_violation() -> None:
    specs = good_specs()
    specs.insert(4, completed("1:work", "w0-again"))
    surplus, violations = check_completions(RUN, chain(specs))
    assert surplus == 1 and violations


def test_starting_a_completed_step_again_is_a_violation() -> None:
    specs = good_specs()
    specs.insert(6, started("1:work", resumed=True))
    assert check_completions(RUN, chain(specs))[1]


# -- 5. fencing ------------------------------------------------------------------------------


def fencing(
    specs: list[Spec], receipts: list[ReceiptRow] | None = None, lock: LockRow | None = None
) -> list[str]:
    return [
        v.detail
        for v in check_fencing(
            RUN, chain(specs), receipts or [], lock or LockRow(RUN, None, 9, 0.0)
        )
    ]


def test_legitimate_redrives_pass_fencing() -> None:
    assert fencing(good_specs()) == []


def test_a_zombie_completion_inside_a_later_drive_is_a_violation() -> None:
    # Drive 1 started step 2, lost its lease; drive 2 began; then drive 1's
    # step_completed landed anyway.
    specs = [*good_specs()[:6], completed("2:send", ANSWER), SUCCEEDED]
    found = fencing(specs)
    assert found and "never started that attempt" in found[0]


def test_a_zombie_retry_inside_a_later_drive_is_a_violation() -> None:
    specs = [
        *good_specs()[:6],
        ("step_retrying", "2:send", 1, {"attempt": 1, "of": 4, "error": "x"}),
        started("2:send", 2),
        completed("2:send", ANSWER, 2),
        SUCCEEDED,
    ]
    assert fencing(specs)


def test_a_drive_epoch_that_does_not_grow_is_a_violation() -> None:
    specs = good_specs()
    specs[5] = drive(2, 1, "w1-1", "sweep")
    assert any("not above" in d for d in fencing(specs))


def test_a_repeated_drive_number_is_a_violation() -> None:
    specs = good_specs()
    specs[5] = ("run_resumed", None, None, {"worker_id": "w1", "epoch": 2, "drive": 1})
    assert fencing(specs)


def test_events_before_any_drive_are_a_violation() -> None:
    specs = good_specs()
    specs.insert(1, started("1:work"))
    assert any("before any drive" in d for d in fencing(specs))


def test_a_receipt_from_an_epoch_no_drive_held_is_a_violation() -> None:
    receipt = ReceiptRow(key("2:send"), RUN, "2:send", "settled", 7, ANSWER)
    assert any("no drive" in d for d in fencing(good_specs(), [receipt]))


def test_a_receipt_written_after_its_step_completed_is_a_violation() -> None:
    specs = [*good_specs()[:-1], drive(3, 3, "w2-1", "sweep"), SUCCEEDED]
    receipt = ReceiptRow(key("2:send"), RUN, "2:send", "settled", 3, ANSWER)
    assert any("after the step completed" in d for d in fencing(specs, [receipt]))


def test_a_lease_row_behind_the_journal_is_a_violation() -> None:
    assert fencing(good_specs(), lock=LockRow(RUN, None, 1, 0.0))


# -- 6. keys ---------------------------------------------------------------------------------


def keys(specs: list[Spec], receipts: list[ReceiptRow] | None = None) -> list[str]:
    return [v.detail for v in check_keys(RUN, chain(specs), receipts or [], {"work": 1, "send": 2})]


def test_legitimate_keys_pass() -> None:
    assert keys(good_specs()) == []


def test_a_key_that_is_not_the_formula_is_a_violation() -> None:
    specs = good_specs()
    specs[6] = ("step_started", "2:send", 1, {"idempotency_key": "0" * 64, "resumed": True})
    assert any("not sha256" in d for d in keys(specs))


def test_a_redrive_that_restarts_an_attempt_as_new_is_a_violation() -> None:
    specs = good_specs()
    specs[6] = started("2:send", resumed=False)
    assert any("without being marked" in d for d in keys(specs))


def test_resuming_an_attempt_never_started_is_a_violation() -> None:
    specs = good_specs()
    specs[4] = started("2:send", resumed=True)
    del specs[6]
    assert any("never started" in d for d in keys(specs))


def test_a_new_attempt_without_a_journaled_failure_is_a_violation() -> None:
    specs = good_specs()
    specs[6] = started("2:send", 2)
    assert any("without a journaled failure" in d for d in keys(specs))


def test_attempts_over_budget_are_a_violation() -> None:
    specs = [QUEUED, drive(1, 1)]
    for attempt in (1, 2, 3):
        specs += [
            started("1:send", attempt),
            ("step_retrying", "1:send", attempt, {"attempt": attempt}),
        ]
    assert any("over its budget" in d for d in keys(specs))


def test_a_receipt_under_a_foreign_key_is_a_violation() -> None:
    receipt = ReceiptRow(key("9:send"), RUN, "2:send", "settled", 2, ANSWER)
    assert keys(good_specs(), [receipt])


def derived(step: str, attempt: int, delivery: str) -> str:
    return hashlib.sha256(f"{key(step, attempt)}|{delivery}".encode()).hexdigest()


def retried_send(receipts: list[ReceiptRow]) -> Evidence:
    """Step 1:send delivers (#1, #2 and "audit"), then fails; attempt 2 gets the three
    stored answers back without dispatching."""
    answer = {"key": key("1:send"), "applied_as": 1}
    specs = [
        QUEUED,
        drive(1, 1),
        started("1:send"),
        ("step_retrying", "1:send", 1, {"attempt": 1, "of": 4, "error": "x", "delay_s": 0.2}),
        started("1:send", 2),
        completed("1:send", answer, 2),
        ("run_succeeded", None, None, {"output": [answer]}),
    ]
    arrivals = [arrival(r.key, n, True, step="1:send") for n, r in enumerate(receipts, 1)]
    for a, r in zip(arrivals, receipts, strict=True):
        a["response"] = r.response
    return with_specs(
        specs, receipts=receipts, arrivals=arrivals, locks={RUN: LockRow(RUN, None, 1, 0.0)}
    )


def sent(k: str, delivery: str = "#1", attempt: int = 1, n: int = 1) -> ReceiptRow:
    return ReceiptRow(
        k, RUN, "1:send", "settled", 1, {"key": k, "applied_as": n}, delivery, attempt
    )


def test_deliveries_kept_across_a_retry_and_several_per_step_pass() -> None:
    ev = retried_send(
        [
            sent(key("1:send")),
            sent(derived("1:send", 1, "#2"), "#2", n=2),
            sent(derived("1:send", 1, "audit"), "audit", n=3),
        ]
    )
    assert check_all(ev).violations == []


def test_a_retry_that_claims_a_delivery_again_under_its_own_key_is_a_violation() -> None:
    # The old per-attempt receipts: attempt 2 claimed and dispatched #1 a second time.
    ev = retried_send([sent(key("1:send")), sent(key("1:send", 2), attempt=2, n=2)])
    assert any("more than one receipt" in v.detail for v in check_all(ev).violations)


def test_a_receipt_not_under_its_claiming_attempts_key_is_a_violation() -> None:
    wrong = [sent(key("1:send")), sent(key("1:send", 2), "#2")]  # not derived for #2
    found = [v.detail for v in check_keys(RUN, retried_send(wrong).events[RUN], wrong, {})]
    assert any("is not the key attempt 1 derives" in d for d in found)


def test_a_receipt_claimed_by_an_attempt_never_started_is_a_violation() -> None:
    ghost = [sent(key("1:send", 3), attempt=3)]
    found = [v.detail for v in check_keys(RUN, retried_send(ghost).events[RUN], ghost, {})]
    assert any("never started" in d for d in found)


# -- 4. the receiver -------------------------------------------------------------------------


def receiver(ev: Evidence) -> list[str]:
    return [v.detail for v in check_receiver(ev)[1]]


def test_a_key_applied_twice_is_a_violation() -> None:
    ev = good_evidence()
    ev.arrivals[1] = arrival(key("2:send"), 2, True, epoch=2)
    assert any("applied 2 times" in d for d in receiver(ev))
    assert check_receiver(ev)[0]["receiver_double_applies"] == 1


def test_an_arrival_without_a_receipt_is_a_violation() -> None:
    ev = good_evidence()
    ev.arrivals.append(arrival(key("2:send", 3), 3, True))
    assert any("without a receipt" in d for d in receiver(ev))


def test_an_arrival_whose_headers_disagree_with_its_key_is_a_violation() -> None:
    ev = good_evidence()
    ev.arrivals[1] = arrival(key("2:send"), 2, False, step="1:work")
    assert any("but its key" in d for d in receiver(ev))


def test_a_receipt_that_recorded_another_answer_is_a_violation() -> None:
    ev = good_evidence()
    ev.receipts = [ReceiptRow(key("2:send"), RUN, "2:send", "settled", 2, {"other": 1})]
    assert any("the receiver answered" in d for d in receiver(ev))


def test_a_settled_receipt_the_receiver_never_applied_is_a_violation() -> None:
    ev = good_evidence()
    ev.arrivals = []
    assert any("never applied" in d for d in receiver(ev))


def test_a_step_that_completed_with_another_answer_is_a_violation() -> None:
    other = {"key": key("2:send"), "applied_as": 42}
    specs = good_specs()
    specs[7] = completed("2:send", other)
    assert any("the receiver answered" in d for d in receiver(with_specs(specs)))


def test_zombie_dispatches_are_counted_not_violations() -> None:
    ev = good_evidence()
    ev.arrivals.append(arrival(key("2:send"), 3, False, epoch=1, t=1008.0))
    figures, violations = check_receiver(ev)
    assert violations == [] and figures["stale_epoch_dispatches"] == 1


# -- figures ---------------------------------------------------------------------------------


def test_recovery_is_measured_from_the_outage_to_the_next_drive() -> None:
    events = {RUN: chain(good_specs())}  # drive 1 at t0+2, drive 2 at t0+6
    assert recovery_times(events, [(1005.0, "w0-1")]) == [1.0]
    assert recovery_times(events, [(1005.0, "someone-else")]) == []
    assert recovery_times(events, [(1001.0, "w0-1")]) == []  # before it held the run


def test_percentiles() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


def test_a_database_failing_its_integrity_check_is_a_violation() -> None:
    ev = good_evidence()
    ev.integrity = "ok"
    assert check_all(ev).violations == []
    ev.integrity = "*** in database main *** Page 7: btreeInitPage() returns error code 11"
    assert checks_of(ev) == {"storage"}


# -- the paths of the structured engine: branches, cancels, children, versions, starts -------

PARENT, CHILD1, CHILD2, AUDIT, DUP = "p-1", "p-1/2", "p-1/3", "a-1", "d-1"


def answer(k: str, n: int = 1) -> dict[str, Any]:
    return {"key": k, "applied_as": n}


def rich_evidence() -> Evidence:
    """A campaign over the new paths, all well-formed: a parent whose first step makes two
    deliveries and whose second fans out two children, then is cancelled while its third
    step runs (the children ended first); a v2-only run driven by a v2 worker whose step
    delivers, fails, and gets the delivery back on its retry; a run started by three callers
    at once, each answered with its id, and refused for another input."""
    k1, k2 = (
        key("1:send2", run=PARENT),
        hashlib.sha256(f"{key('1:send2', run=PARENT)}|copy".encode()).hexdigest(),
    )
    parent = chain(
        [
            QUEUED,
            drive(1, 1),
            started("1:send2", run=PARENT),
            completed("1:send2", [answer(k1, 1), answer(k2, 2)]),
            ("step_started", "2:child:leaf", 1, {"child_run_id": CHILD1}),
            ("step_started", "3:child:leaf", 1, {"child_run_id": CHILD2}),
            ("step_waiting", "2:child:leaf", None, {"reason": "child", "child_run_id": CHILD1}),
            ("step_waiting", "3:child:leaf", None, {"reason": "child", "child_run_id": CHILD2}),
            drive(2, 2),
            completed("2:child:leaf", ["w0"], None),
            completed("3:child:leaf", ["w1"], None),
            started("4:tick", run=PARENT),
            ("run_cancelled", None, None, {"error": "cancelled"}),
        ],
        run=PARENT,
    )
    children = {
        c: chain(
            [
                QUEUED,
                drive(1, 1, "w1-1"),
                started("1:work", run=c),
                completed("1:work", "w0"),
                ("run_succeeded", None, None, {"output": ["w0"]}),
            ],
            run=c,
            t0=1001.0,
        )
        for c in (CHILD1, CHILD2)
    }
    k3 = key("1:flaky_send", run=AUDIT)
    audit = chain(
        [
            QUEUED,
            drive(1, 1, "w2-1-v2"),
            started("1:flaky_send", run=AUDIT),
            ("step_retrying", "1:flaky_send", 1, {"attempt": 1, "of": 6, "error": "x"}),
            started("1:flaky_send", 2, run=AUDIT),
            completed("1:flaky_send", answer(k3, 3), 2),
            ("run_succeeded", None, None, {"output": [answer(k3, 3)]}),
        ],
        run=AUDIT,
    )
    dup = chain(
        [
            QUEUED,
            drive(1, 1),
            started("1:work", run=DUP),
            completed("1:work", "w0"),
            ("run_succeeded", None, None, {"output": ["w0"]}),
        ],
        run=DUP,
    )

    def arrive(k: str, run: str, step: str, delivery: str, n: int) -> dict[str, Any]:
        a = arrival(k, n, True, step=step, run=run)
        a["delivery"], a["response"] = delivery, answer(k, n)
        return a

    return Evidence(
        submitted=[PARENT, AUDIT, DUP],
        runs={
            PARENT: RunRow(PARENT, "cancelled", workflow="flow"),
            CHILD1: RunRow(CHILD1, "succeeded", workflow="leaf", parent_run_id=PARENT),
            CHILD2: RunRow(CHILD2, "succeeded", workflow="leaf", parent_run_id=PARENT),
            AUDIT: RunRow(AUDIT, "succeeded", workflow="audit"),
            DUP: RunRow(DUP, "succeeded", workflow="flow"),
        },
        events={PARENT: parent, **children, AUDIT: audit, DUP: dup},
        receipts=[
            ReceiptRow(k1, PARENT, "1:send2", "settled", 1, answer(k1, 1), "#1", 1),
            ReceiptRow(k2, PARENT, "1:send2", "settled", 1, answer(k2, 2), "copy", 1),
            ReceiptRow(k3, AUDIT, "1:flaky_send", "settled", 1, answer(k3, 3), "#1", 1),
        ],
        locks={
            r: LockRow(r, None, 2 if r == PARENT else 1, 0.0)
            for r in (PARENT, CHILD1, CHILD2, AUDIT, DUP)
        },
        arrivals=[
            arrive(k1, PARENT, "1:send2", "#1", 1),
            arrive(k2, PARENT, "1:send2", "copy", 2),
            arrive(k3, AUDIT, "1:flaky_send", "#1", 3),
        ],
        now=2000.0,
        max_attempts={"work": 1, "tick": 1, "send2": 4, "flaky_send": 6},
        deliveries_per_step={"send": 1, "send2": 2, "flaky_send": 1},
        cancel_requested={PARENT: 1010.5},
        v2_only=("audit",),
        v2_workers={"w2-1-v2"},
        dup_starts={DUP: DupStart(DUP, [DUP, DUP, DUP], "RunIdConflict: run id 'd-1' ...")},
    )


def test_a_well_formed_campaign_over_the_new_paths_passes_every_check() -> None:
    findings = check_all(rich_evidence())
    assert findings.violations == []
    figures = findings.figures
    assert figures["runs"]["children"] == {"succeeded": 2}
    assert figures["cancels"]["outcomes"] == {"cancelled": 1}
    assert figures["cancels"]["latency_s"]["p50"] == pytest.approx(2.5)
    assert figures["versions"]["v2_only_runs"] == 1
    assert figures["duplicate_starts"]["answered_with_id"] == 3
    assert figures["deliveries"]["receipts_reused_by_a_later_attempt"] == 1


def replace_events(ev: Evidence, run_id: str, specs: list[Spec]) -> Evidence:
    ev.events[run_id] = chain(specs, run=run_id)
    return ev


def violations(ev: Evidence, check: str) -> list[str]:
    return [v.detail for v in check_all(ev).violations if v.check == check]


# lost and failures, children included


def test_a_child_left_running_is_lost_and_outlives_its_parent() -> None:
    ev = rich_evidence()
    ev.runs[CHILD1] = RunRow(CHILD1, "running", workflow="leaf", parent_run_id=PARENT)
    assert any("stuck running" in d for d in violations(ev, "lost"))
    assert any(
        "child run left running after its parent p-1 ended cancelled" in d
        for d in violations(ev, "cancel")
    )


def test_a_cancel_nobody_asked_for_is_a_violation_one_asked_of_an_ancestor_is_not() -> None:
    ev = rich_evidence()
    ev.runs[CHILD1] = RunRow(CHILD1, "cancelled", workflow="leaf", parent_run_id=PARENT)
    ev.events[CHILD1] = chain(
        [
            QUEUED,
            drive(1, 1, "w1-1"),
            started("1:work", run=CHILD1),
            ("run_cancelled", None, None, {"error": "cancelled"}),
        ],
        run=CHILD1,
    )
    assert violations(ev, "failure") == []
    ev.cancel_requested = {}
    # The parent's cancel is unexplained; its child's follows from the parent's end.
    assert violations(ev, "failure") == ["cancelled, though nobody asked"]
    assert [v.run_id for v in check_all(ev).violations if v.check == "failure"] == [PARENT]
    ev.runs[PARENT] = RunRow(PARENT, "running", workflow="flow")
    assert "cancelled, though nobody asked" in violations(ev, "failure")  # parent still on


def child_crash_looped(child_error: str, child_specs: list[Spec]) -> Evidence:
    """The parent's first child fails; the parent fails with ChildRunFailed and its end
    cancels the second child."""
    ev = rich_evidence()
    ev.cancel_requested = {}
    ev.runs[PARENT] = RunRow(
        PARENT, "failed", workflow="flow", error=f"child run {CHILD1} failed: {child_error}"
    )
    ev.runs[CHILD1] = RunRow(
        CHILD1, "failed", workflow="leaf", parent_run_id=PARENT, error=child_error
    )
    ev.runs[CHILD2] = RunRow(CHILD2, "cancelled", workflow="leaf", parent_run_id=PARENT)
    ev.events[CHILD1] = chain(child_specs, run=CHILD1)
    return ev


def test_a_parent_failed_by_a_child_s_crash_loop_and_its_cancelled_sibling_are_expected() -> None:
    ev = child_crash_looped("crash loop", crash_looped(5, step="1:work", run=CHILD1))
    assert violations(ev, "failure") == []
    assert check_lost(ev)[0]["crash_loops"] == 1
    # A child failing for no expected reason fails its parent for none either.
    plain = [
        QUEUED,
        drive(1, 1, "w1-1"),
        started("1:work", run=CHILD1),
        ("step_failed", "1:work", 1, {"error": "boom", "error_type": "RuntimeError"}),
        ("run_failed", None, None, {"error": "boom"}),
    ]
    ev = child_crash_looped("RuntimeError: boom", plain)
    assert sorted(str(v.run_id) for v in check_all(ev).violations if v.check == "failure") == [
        PARENT,
        CHILD1,
    ]
    ev.expected_failures = ("boom",)
    assert violations(ev, "failure") == []


def test_a_run_waiting_on_several_branches_is_checked_for_each() -> None:
    ev = dataclasses.replace(
        good_evidence(), runs={RUN: RunRow(RUN, "waiting", 'any:["child:x/1","signal:go3"]')}
    )
    assert check_lost(ev)[1] == []
    ev.pending_signals = {RUN: {"go3"}}
    assert [v.detail for v in check_lost(ev)[1]] == [
        "waiting for signal 'go3' although it was sent (a lost wake-up)"
    ]


def crash_looped(
    drives: int, reasons: str = "sweep", step: str = "1:send", run: str = RUN
) -> list[Spec]:
    specs: list[Spec] = [QUEUED]
    for n in range(1, drives + 1):
        specs += [
            drive(n, n, reason="claim" if n == 1 else reasons),
            started(step, resumed=n > 1, run=run),
        ]
    specs += [
        drive(drives + 1, drives + 1, reason=reasons),
        ("step_failed", step, 1, {"error": "started 5 times", "error_type": "StepCrashLoop"}),
        ("run_failed", None, None, {"error": "crash loop", "reason": "crash_loop"}),
    ]
    return specs


def test_a_crash_loop_the_journal_bears_out_is_expected() -> None:
    ev = with_specs(
        crash_looped(5),
        runs={RUN: RunRow(RUN, "failed", error="crash loop")},
        receipts=[],
        arrivals=[],
        locks={RUN: LockRow(RUN, None, 6, 0.0)},
    )
    findings = check_all(ev)
    assert findings.violations == []
    assert findings.figures["runs"]["crash_loops"] == 1


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param(crash_looped(4), id="too-few-starts"),
        pytest.param(crash_looped(5, reasons="claim"), id="not-taken-over"),
    ],
)
def test_a_crash_loop_the_journal_does_not_bear_out_is_a_violation(specs: list[Spec]) -> None:
    ev = with_specs(
        specs,
        runs={RUN: RunRow(RUN, "failed", error="crash loop")},
        receipts=[],
        arrivals=[],
        locks={RUN: LockRow(RUN, None, 9, 0.0)},
    )
    assert any("failed as a crash loop" in d for d in violations(ev, "failure"))


# fencing: a drive retried under its own lease


def test_a_drive_retried_after_a_storage_failure_holds_a_newer_epoch_too() -> None:
    specs = good_specs()
    specs[5] = drive(2, 2, "w0-1", "retry")  # driven again after a storage failure
    assert fencing(specs) == []
    for worker in ("w0-1", "w1-1"):  # the same epoch again is a stale lease, whoever holds it
        specs[5] = drive(2, 1, worker, "retry")
        assert any("not above" in d for d in fencing(specs))


# parallel branches


def parked_beside(in_flight: bool, reason: str = "claim", epoch: int = 2) -> list[Spec]:
    """gather(work, wait_for_signal): the drive parks on the signal; the work step is
    journaled before the park, unless ``in_flight``."""
    specs: list[Spec] = [
        QUEUED,
        drive(1, 1),
        started("1:work"),
        ("step_waiting", "2:signal:go1", None, {"reason": "signal", "name": "go1"}),
    ]
    if not in_flight:
        specs.append(completed("1:work", "w0"))
    specs.append(drive(2, epoch, "w1-1", reason))
    if in_flight:
        specs += [started("1:work", resumed=True), completed("1:work", "w0")]
    specs += [
        ("signal_received", "2:signal:go1", None, {"name": "go1", "signal_id": 1}),
        completed("2:signal:go1", {"from": "campaign"}, None),
        ("run_succeeded", None, None, {"output": []}),
    ]
    return specs


def test_a_run_parked_with_a_branch_in_flight_is_a_violation() -> None:
    assert check_branches(RUN, chain(parked_beside(in_flight=False))) == []
    found = check_branches(RUN, chain(parked_beside(in_flight=True)))
    assert [v.check for v in found] == ["branches"]
    assert "step 1:work attempt 1 (seq 3) in flight" in found[0].detail


@pytest.mark.parametrize(("reason", "epoch"), [("sweep", 2), ("reclaim", 2), ("claim", 1)])
def test_a_step_in_flight_when_a_drive_died_is_no_branch_violation(reason: str, epoch: int) -> None:
    assert check_branches(RUN, chain(parked_beside(True, reason, epoch))) == []


# cancels


def test_two_run_cancelled_events_are_a_violation() -> None:
    ev = rich_evidence()
    specs = [
        QUEUED,
        drive(1, 1),
        ("run_cancelled", None, None, {"error": "cancelled"}),
        ("run_cancelled", None, None, {"error": "cancelled"}),
    ]
    replace_events(ev, DUP, specs)
    ev.runs[DUP] = RunRow(DUP, "cancelled")
    ev.cancel_requested[DUP] = 1000.0
    assert any("2 run_cancelled events" in d for d in violations(ev, "cancel"))


def test_a_step_started_after_run_cancelled_is_a_violation() -> None:
    ev = rich_evidence()
    specs = [
        QUEUED,
        drive(1, 1),
        ("run_cancelled", None, None, {"error": "cancelled"}),
        started("1:work", run=DUP),
    ]
    replace_events(ev, DUP, specs)
    ev.runs[DUP] = RunRow(DUP, "cancelled")
    ev.cancel_requested[DUP] = 1000.0
    assert any("after run_cancelled" in d for d in violations(ev, "cancel"))


# versions


def test_a_v2_only_run_driven_by_an_old_worker_is_a_violation() -> None:
    ev = rich_evidence()
    ev.v2_workers = {"w2-2-v2"}
    assert any("not a version-2 worker" in d for d in violations(ev, "versions"))


def test_a_run_failed_as_not_registered_is_a_violation() -> None:
    ev = rich_evidence()
    ev.runs[DUP] = RunRow(
        DUP, "failed", error="RatchetError: workflow 'audit' is not registered with this worker"
    )
    ev.events[DUP] = chain(
        [QUEUED, drive(1, 1), ("run_failed", None, None, {"error": "not registered"})], run=DUP
    )
    assert any("does not serve it" in d for d in violations(ev, "versions"))


# duplicate starts


@pytest.mark.parametrize(
    ("dup", "specs", "found"),
    [
        pytest.param(
            DupStart(DUP, [DUP, "ValueError: not enough values to unpack", DUP]),
            None,
            "caller 2 of 3 got",
            id="a-caller-failed",
        ),
        pytest.param(DupStart(DUP, [DUP, "d-2"]), None, "not the run id", id="another-id"),
        pytest.param(
            DupStart(DUP, [DUP], conflict=DUP),
            None,
            "not RunIdConflict",
            id="differing-start-accepted",
        ),
        pytest.param(DupStart(DUP, [DUP]), [QUEUED, QUEUED], "2 creations", id="created-twice"),
    ],
)
def test_duplicate_starts_that_went_wrong_are_violations(
    dup: DupStart, specs: list[Spec] | None, found: str
) -> None:
    ev = rich_evidence()
    ev.dup_starts = {DUP: dup}
    if specs is not None:
        replace_events(ev, DUP, specs)
    assert any(found in d for d in violations(ev, "starts"))


def test_a_duplicate_start_with_no_run_is_a_violation() -> None:
    ev = rich_evidence()
    ev.dup_starts = {"d-9": DupStart("d-9", ["d-9"])}
    assert any("no run exists" in d for d in violations(ev, "starts"))


# deliveries: several per step, across retries


def test_a_delivery_sent_again_under_a_later_attempts_key_is_a_violation() -> None:
    ev = rich_evidence()
    k = key("1:flaky_send", 2, run=AUDIT)
    again = arrival(k, 4, True, step="1:flaky_send", run=AUDIT)
    again["delivery"] = "#1"
    ev.arrivals.append(again)
    assert any(
        "delivery #1 of 1:flaky_send arrived under 2 keys" in d for d in violations(ev, "receiver")
    )


def test_a_step_with_two_deliveries_must_answer_with_both() -> None:
    ev = rich_evidence()
    k1 = key("1:send2", run=PARENT)
    specs = [(e.kind, e.step_id, e.attempt, e.payload) for e in ev.events[PARENT]]
    specs[3] = completed("1:send2", [answer(k1, 1)])
    replace_events(ev, PARENT, specs)
    assert any("not 2 answers" in d for d in violations(ev, "receiver"))
    specs[3] = completed("1:send2", [answer(k1, 1), answer(k1, 1)])
    replace_events(ev, PARENT, specs)
    assert any("twice" in d for d in violations(ev, "receiver"))
