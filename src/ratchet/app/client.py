"""The client calls on runs, approvals, receipts and the journal, as coroutines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ratchet.app.base import UNSET, AppBase, check_filters, check_status
from ratchet.engine.definitions import check_name, to_json
from ratchet.engine.guards import check_grant
from ratchet.engine.retention import DEFAULT_STATUSES, PruneReport, prune
from ratchet.errors import (
    InvalidInput,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunTimeout,
    UnknownRun,
)
from ratchet.model import (
    Approval,
    DeadLetter,
    Decision,
    DeliveryReceipt,
    Event,
    LLMTotals,
    RunRecord,
    RunStatus,
)
from ratchet.names import MAX_COMMENT, MAX_DECIDER, MAX_SIGNAL, MAX_STEP, check_length
from ratchet.receipts.service import ensure_receipt
from ratchet.store import WorkerInfo
from ratchet.store.base import DONE
from ratchet.store.sandboxes import SandboxRecord


class Client(AppBase):
    """The asynchronous client calls of :class:`ratchet.Ratchet`."""

    async def get_async(self, run_id: str) -> RunRecord:
        """The run's record, or :class:`UnknownRun`."""
        rec = await (await self._astore()).get_run(run_id)
        if rec is None:
            raise UnknownRun(f"unknown run id {run_id!r}")
        return rec

    async def result_async(self, run_id: str, timeout_s: float | None = None) -> Any:
        """Wait for the run to finish; return its result, or raise RunFailed/RunCancelled."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        store = await self._astore()
        while True:
            with store.watching(DONE, run_id) as finished:
                rec = await self.get_async(run_id)
                if not rec.status.terminal:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ResultTimeout(
                            f"run {run_id} is still {rec.status} after {timeout_s:g}s"
                        )
                    # Woken when the run finishes, wherever its worker is; the timeout is
                    # a backstop for a notification lost with a dropped connection.
                    wait = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished.wait(), max(wait, 0))
                    continue
            if rec.status == RunStatus.SUCCEEDED:
                # Through the run's own version: another version may return another type.
                wd = self.workflows.version_of(rec.workflow, rec.workflow_version)
                return wd.revive(rec.output) if wd else rec.output
            if rec.status == RunStatus.FAILED:
                cls = RunTimeout if (rec.error or "").startswith("RunTimeout:") else RunFailed
                raise cls(f"run {run_id} failed: {rec.error}")
            raise RunCancelled(f"run {run_id} was cancelled")

    async def signal_async(self, run_id: str, name: str, data: Any = None) -> None:
        """Send signal ``name`` with ``data``; a run waiting for it wakes up and gets it
        as the type it waits for (``wait_for_signal(name, type=...)``). Stored in its JSON
        form: pydantic's for what json cannot write (a datetime, a dataclass)."""
        check_length(check_name(name, "signal name"), "signal name", MAX_SIGNAL)
        data = json.loads(to_json(data, f"the data of signal {name!r}"))
        await (await self._astore()).send_signal(run_id, name, data)

    async def approve_async(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Approve the run's pending approval ``step`` (its step id, or its name when that
        picks one) as ``by``; the run wakes and ``ratchet.approval`` returns the decision.
        ``note``: a name given beside the decider, journaled with the decision (the HTTP
        API journals the deciding token's name as ``by`` and keeps the body's ``by`` so).
        A decision is recorded once: a second one raises :class:`ApprovalAlreadyDecided`
        (naming who decided what and when), and an approval of a finished run, or timed
        out, :class:`ApprovalNotPending`; nothing is written then.

        On a guard's pause of a limit (``guard:budget_exceeded``, ``guard:excessive_steps``)
        the approval says how far the run may go over: ``grant`` moves limits to new values
        (``{"budget_tokens": 5000}``; the fields of :data:`ratchet.engine.guards.LIMITS`,
        null for off). Without it, a budget rises to what the paused call needed (the next
        call over it pauses again) and ``max_steps`` is lifted. The grant is journaled with
        the decision (``approval_decided``: who, and the grant)."""
        return await self._decide(run_id, step, True, by, comment, note, grant)

    async def reject_async(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
    ) -> Decision:
        """Reject the run's pending approval ``step``; see :meth:`approve_async`."""
        return await self._decide(run_id, step, False, by, comment, note)

    async def _decide(
        self,
        run_id: str,
        step: str,
        approved: bool,
        by: str,
        comment: str | None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        check_name(run_id, "run id")
        check_length(check_name(step, "approval step"), "approval step", MAX_STEP)
        check_length(check_name(by, "decider (by)"), "decider (by)", MAX_DECIDER)
        if comment is not None:
            check_length(check_name(comment, "comment"), "comment", MAX_COMMENT)
        if note is not None:
            check_length(check_name(note, "note"), "note", MAX_DECIDER)
        granted = check_grant(grant) if grant is not None else None
        found = await (await self._astore()).decide_approval(
            run_id, step, approved, by, comment, note, granted
        )
        assert found.decision is not None
        return found.decision

    async def approvals_async(self, run_id: str | None = None, limit: int = 100) -> list[Approval]:
        """Pending approvals of unfinished runs, oldest first: run, step, name, data, when
        asked, and the top-level run (``root_run_id``; a child run's approval carries its
        parent's). With ``run_id``, only that run's and those of the runs under it."""
        if run_id is not None:
            check_name(run_id, "run id")
        return await (await self._astore()).pending_approvals(run_id, limit)

    async def cancel_async(self, run_id: str, *, by: str | None = None) -> RunStatus:
        """Cancel a run and its unfinished children; returns its status after the request
        (a running run is cancelled by its worker as soon as the request reaches it). ``by``,
        who asked, is journaled in the ``run_cancelled`` of the run and of its children,
        whether cancelled here and now (queued or waiting) or by the worker that held it
        ("request" where nobody was named)."""
        if by is not None:
            check_name(by, "cancelled by (by)")
        return await (await self._astore()).cancel(run_id, by)

    async def retry_async(
        self, run_id: str, *, grant: Mapping[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Re-queue a dead-lettered run; it resumes after its last completed step. It keeps
        its limits: a budget it crossed stops it again at the next call over it. ``grant``
        moves limits for the rest of the run (``{"budget_tokens": 5000}``, the fields of
        :data:`ratchet.engine.guards.LIMITS`, null for off) and needs ``by``, who granted
        it; both are journaled in the run's ``run_queued`` event."""
        check_name(run_id, "run id")
        granted = check_grant(grant) if grant is not None else None
        if by is not None:
            check_name(by, "retried by (by)")
        elif granted is not None:
            raise InvalidInput("a grant needs by=: who let the run go over its limits")
        return await (await self._astore()).retry_dead(run_id, granted, by)

    async def receipts_async(self, run_id: str) -> list[DeliveryReceipt]:
        """The run's delivery receipts: key, step, delivery, status, response, times."""
        await self.get_async(run_id)
        return await (await self._astore()).receipts(run_id)

    async def settle_receipt_async(
        self, key: str, *, response: Any = UNSET, failed: bool = False
    ) -> DeliveryReceipt:
        """Resolve a receipt left ``claimed`` by hand, once a person knows what happened:
        ``response=`` what the receiver answered (the step then returns it, without
        dispatching), or ``failed=True``: it did not happen (the step's ``deliver`` then
        raises :class:`DeliveryFailed`). A dead-lettered run goes on after ``retry``."""
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"invalid receipt key {key!r}")
        if not isinstance(failed, bool):
            raise InvalidInput(f"failed must be True or False, got {failed!r}")
        if failed == (response is not UNSET):
            raise InvalidInput(
                "settle a receipt with either response=... (what the receiver "
                "answered) or failed=True (it did not happen), not "
                + ("both" if failed else "neither")
            )
        if not failed:
            response = json.loads(to_json(response, f"the response for receipt {key}"))
        return await (await self._astore()).resolve_receipt(
            key, None if failed else response, failed
        )

    async def run_receipt_async(self, run_id: str) -> dict[str, Any]:
        """The finished run's signed receipt (a DSSE envelope), signed now if it has none
        over its whole journal. Not to be confused with :meth:`receipts_async`, the
        delivery receipts of its side effects."""
        return (await ensure_receipt(await self._astore(), self.signer, run_id)).envelope

    async def prune_async(
        self,
        finished_before_s: float,
        *,
        statuses: Sequence[str] = DEFAULT_STATUSES,
        dry_run: bool = False,
    ) -> PruneReport:
        """Delete the journals (keeping the signed receipts) of runs that finished more than
        ``finished_before_s`` seconds ago, with one of ``statuses``."""
        if not isinstance(finished_before_s, int | float) or finished_before_s <= 0:
            raise InvalidInput(
                f"finished_before_s must be a positive number of seconds, got {finished_before_s!r}"
            )
        store = await self._astore()
        before = await store.now() - finished_before_s
        return await prune(store, self.signer, before, statuses, dry_run=dry_run)

    async def events_async(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's journal after sequence number ``after``."""
        await self.get_async(run_id)
        return await (await self._astore()).load_events(run_id, after)

    async def runs_async(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        workflow: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first, at most ``limit``; only those with ``status``, of
        ``workflow`` (its name), with every one of ``tags`` (``{"customer": "acme"}``),
        when given."""
        check_status(status)
        check_filters(workflow, tags)
        store = await self._astore()
        return await store.list_runs(status, limit, workflow=workflow, tags=tags)

    async def sandboxes_async(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[SandboxRecord]:
        """The sandboxes of an isolated run, by attempt (with ``run_id``), else the most
        recent ones of every run: status, times, exit code or signal, peak memory, and
        why each ended."""
        if run_id is not None:
            await self.get_async(run_id)
        return await (await self._astore()).list_sandboxes(run_id, limit)

    async def live_workers_async(self) -> list[WorkerInfo]:
        """The workers seen within their lease TTL, with the workflows and queues each
        serves."""
        return await (await self._astore()).live_workers()

    async def count_runs_async(
        self,
        status: str | None = None,
        *,
        workflow: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> int:
        """How many runs there are (with ``status``, of ``workflow``, with every one of
        ``tags``, if given)."""
        check_status(status)
        check_filters(workflow, tags)
        return await (await self._astore()).count_runs(status, workflow=workflow, tags=tags)

    async def llm_totals_async(self, run_ids: list[str]) -> dict[str, LLMTotals]:
        """Each run's model calls, tokens and cost, summed from its journal."""
        return await (await self._astore()).llm_totals(run_ids)

    async def dead_letters_async(self, limit: int = 100) -> list[DeadLetter]:
        """Dead-lettered runs, newest first, at most ``limit``."""
        return await (await self._astore()).dead_letters(limit)

    async def count_dead_letters_async(self) -> int:
        """How many runs are dead-lettered."""
        return await (await self._astore()).count_dead_letters()
