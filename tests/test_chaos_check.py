"""The chaos campaign's invariant checker on hand-made journals: a well-formed journal,
including legitimate re-drives, passes every check, and each check fails on a journal
that breaks its invariant."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from chaos.check import (
    Evidence,
    LockRow,
    ReceiptRow,
    RunRow,
    check_all,
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
    return (kind, None, None, {"worker_id": worker, "epoch": epoch, "reason": reason,
                               "drive": n})


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


def arrival(k: str, n: int, applied: bool, epoch: int = 1, step: str = "2:send",
            t: float = 1005.5, run: str = RUN) -> dict[str, Any]:
    return {"key": k, "run": run, "step": step, "epoch": epoch, "t": t, "arrival": n,
            "applied": applied, "response": {"key": k, "applied_as": 1}}


def good_evidence() -> Evidence:
    events = chain(good_specs())
    return Evidence(
        submitted=[RUN],
        runs={RUN: RunRow(RUN, "succeeded")},
        events={RUN: events},
        receipts=[ReceiptRow(key("2:send"), RUN, "2:send", "settled", 2, ANSWER, "#1", 1)],
        locks={RUN: LockRow(RUN, None, 2, 0.0)},
        arrivals=[arrival(key("2:send"), 1, True, epoch=1),
                  arrival(key("2:send"), 2, False, epoch=2, t=1007.5)],
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
        QUEUED, drive(1, 1),
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
    ev = with_specs(specs,
                    receipts=[ReceiptRow(k2, RUN, "1:send", "settled", 1,
                                         {"key": k2, "applied_as": 1}, "#1", 2)],
                    locks={RUN: LockRow(RUN, None, 3, 0.0)},
                    arrivals=[arrival(k2, 1, True, step="1:send")])
    assert check_all(ev).violations == []


# -- 1. lost runs, and unexpected failures ---------------------------------------------------


@pytest.mark.parametrize(("row", "pending"), [
    pytest.param(None, {}, id="missing"),
    pytest.param(RunRow(RUN, "running"), {}, id="stuck-running"),
    pytest.param(RunRow(RUN, "queued"), {}, id="stuck-queued"),
    pytest.param(RunRow(RUN, "waiting", None), {}, id="waiting-on-nothing"),
    pytest.param(RunRow(RUN, "waiting", "signal:go"), {RUN: {"go"}}, id="lost-wakeup"),
    pytest.param(RunRow(RUN, "waiting", "sleep:2:sleep", 100.0), {}, id="timer-missed"),
])
def test_lost_runs_are_violations(row: RunRow | None, pending: dict[str, set[str]]) -> None:
    ev = dataclasses.replace(good_evidence(), runs={RUN: row} if row else {},
                             pending_signals=pending)
    figures, violations = check_lost(ev)
    assert [v.check for v in violations] == ["lost"]
    assert figures["lost"] == 1


def test_visibly_waiting_runs_are_not_lost() -> None:
    ev = dataclasses.replace(good_evidence(), runs={
        RUN: RunRow(RUN, "waiting", "signal:go")})
    figures, violations = check_lost(ev)
    assert violations == [] and figures["waiting_visibly"] == 1


def test_an_unexpected_failure_is_a_violation_an_expected_one_is_not() -> None:
    ev = dataclasses.replace(good_evidence(), runs={
        RUN: RunRow(RUN, "failed", error="step 2:send failed: StorageError: boom")})
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
    events[3] = dataclasses.replace(events[3], payload={"output": "forged"},
                                    payload_json='{"output":"forged"}')
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


def fencing(specs: list[Spec], receipts: list[ReceiptRow] | None = None,
            lock: LockRow | None = None) -> list[str]:
    return [v.detail for v in check_fencing(
        RUN, chain(specs), receipts or [], lock or LockRow(RUN, None, 9, 0.0))]


def test_legitimate_redrives_pass_fencing() -> None:
    assert fencing(good_specs()) == []


def test_a_zombie_completion_inside_a_later_drive_is_a_violation() -> None:
    # Drive 1 started step 2, lost its lease; drive 2 began; then drive 1's
    # step_completed landed anyway.
    specs = [*good_specs()[:6], completed("2:send", ANSWER), SUCCEEDED]
    found = fencing(specs)
    assert found and "never started that attempt" in found[0]


def test_a_zombie_retry_inside_a_later_drive_is_a_violation() -> None:
    specs = [*good_specs()[:6],
             ("step_retrying", "2:send", 1, {"attempt": 1, "of": 4, "error": "x"}),
             started("2:send", 2), completed("2:send", ANSWER, 2), SUCCEEDED]
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
    return [v.detail for v in check_keys(RUN, chain(specs), receipts or [],
                                         {"work": 1, "send": 2})]


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
        specs += [started("1:send", attempt),
                  ("step_retrying", "1:send", attempt, {"attempt": attempt})]
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
        QUEUED, drive(1, 1),
        started("1:send"),
        ("step_retrying", "1:send", 1, {"attempt": 1, "of": 4, "error": "x", "delay_s": 0.2}),
        started("1:send", 2),
        completed("1:send", answer, 2),
        ("run_succeeded", None, None, {"output": [answer]}),
    ]
    arrivals = [arrival(r.key, n, True, step="1:send") for n, r in enumerate(receipts, 1)]
    for a, r in zip(arrivals, receipts, strict=True):
        a["response"] = r.response
    return with_specs(specs, receipts=receipts, arrivals=arrivals,
                      locks={RUN: LockRow(RUN, None, 1, 0.0)})


def sent(k: str, delivery: str = "#1", attempt: int = 1, n: int = 1) -> ReceiptRow:
    return ReceiptRow(k, RUN, "1:send", "settled", 1, {"key": k, "applied_as": n}, delivery,
                      attempt)


def test_deliveries_kept_across_a_retry_and_several_per_step_pass() -> None:
    ev = retried_send([sent(key("1:send")), sent(derived("1:send", 1, "#2"), "#2", n=2),
                       sent(derived("1:send", 1, "audit"), "audit", n=3)])
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


def _crash_loop_specs(starts: int) -> list[Spec]:
    specs: list[Spec] = [QUEUED, drive(1, 1), started("1:work")]
    for n in range(2, starts + 1):
        specs += [drive(n, n, f"w{n}-1", "sweep"), started("1:work", resumed=True)]
    error = f"step 1:work: attempt 1 was started {starts} times and never finished"
    return [*specs, drive(starts + 1, starts + 1, "w9-1", "sweep"),
            ("step_failed", "1:work", 1, {"error": error, "error_type": "StepCrashLoop"}),
            ("run_failed", None, None, {"error": f"step 1:work failed: {error}",
                                        "reason": "crash_loop"})]


def test_a_crash_loop_the_faults_caused_is_the_engines_policy_not_a_violation() -> None:
    ev = with_specs(_crash_loop_specs(5), runs={RUN: RunRow(RUN, "failed", "crash loop")},
                    receipts=[], arrivals=[], locks={RUN: LockRow(RUN, None, 6, 0.0)})
    assert check_all(ev).violations == []


def test_a_crash_loop_declared_too_early_is_a_violation() -> None:
    ev = with_specs(_crash_loop_specs(3), runs={RUN: RunRow(RUN, "failed", "crash loop")},
                    receipts=[], arrivals=[], locks={RUN: LockRow(RUN, None, 4, 0.0)})
    [violation] = check_all(ev).violations
    assert violation.check == "failure" and "after 3 starts" in violation.detail
