"""The blocking twin of each client call: the coroutine run on the app's own loop
(``tests/test_public_api.py`` holds each twin to its coroutine's signature)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ratchet.app.base import UNSET, check_status
from ratchet.app.client import Client
from ratchet.app.forking import Forking
from ratchet.app.starting import Starting
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.retention import DEFAULT_STATUSES, PruneReport
from ratchet.engine.start_options import Debounce
from ratchet.model import (
    Approval,
    DeadLetter,
    Decision,
    DeliveryReceipt,
    Event,
    LLMTotals,
    RunDiff,
    RunRecord,
    RunStatus,
)
from ratchet.store import WorkerInfo
from ratchet.store.sandboxes import SandboxRecord


class Blocking(Starting, Forking, Client):
    """The blocking client calls of :class:`ratchet.Ratchet`."""

    def start(
        self,
        wf: WorkflowDef | str,
        /,
        *args: Any,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tags: Mapping[str, str] | None = None,
        dedup_id: str | None = None,
        debounce: Debounce | None = None,
        start_at: datetime | None = None,
        delay_s: float | None = None,
        concurrency_key: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Blocking :meth:`start_async`."""
        return self._portal.call(
            self.start_async(
                wf,
                *args,
                run_id=run_id,
                queue=queue,
                priority=priority,
                guards=guards,
                timeout_s=timeout_s,
                tags=tags,
                dedup_id=dedup_id,
                debounce=debounce,
                start_at=start_at,
                delay_s=delay_s,
                concurrency_key=concurrency_key,
                **kwargs,
            )
        )

    def start_many(
        self,
        wf: WorkflowDef | str,
        items: Iterable[Any],
        /,
        *,
        queue: str | None = None,
        priority: int = 0,
        guards: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        concurrency_key: str | None = None,
    ) -> list[str]:
        """Blocking :meth:`start_many_async`."""
        return self._portal.call(
            self.start_many_async(
                wf,
                items,
                queue=queue,
                priority=priority,
                guards=guards,
                tags=tags,
                concurrency_key=concurrency_key,
            )
        )

    def get(self, run_id: str) -> RunRecord:
        """Blocking :meth:`get_async`."""
        return self._portal.call(self.get_async(run_id))

    def result(self, run_id: str, timeout_s: float | None = None) -> Any:
        """Blocking :meth:`result_async`."""
        return self._portal.call(self.result_async(run_id, timeout_s))

    def signal(self, run_id: str, name: str, data: Any = None) -> None:
        """Blocking :meth:`signal_async`."""
        self._portal.call(self.signal_async(run_id, name, data))

    def approve(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
        grant: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Blocking :meth:`approve_async`."""
        return self._portal.call(
            self.approve_async(run_id, step, by=by, comment=comment, note=note, grant=grant)
        )

    def reject(
        self,
        run_id: str,
        step: str,
        *,
        by: str,
        comment: str | None = None,
        note: str | None = None,
    ) -> Decision:
        """Blocking :meth:`reject_async`."""
        return self._portal.call(self.reject_async(run_id, step, by=by, comment=comment, note=note))

    def approvals(self, run_id: str | None = None, limit: int = 100) -> list[Approval]:
        """Blocking :meth:`approvals_async`."""
        return self._portal.call(self.approvals_async(run_id, limit))

    def cancel(self, run_id: str, *, by: str | None = None) -> RunStatus:
        """Blocking :meth:`cancel_async`."""
        return self._portal.call(self.cancel_async(run_id, by=by))

    def retry(
        self, run_id: str, *, grant: Mapping[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Blocking :meth:`retry_async`."""
        return self._portal.call(self.retry_async(run_id, grant=grant, by=by))

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        """Blocking :meth:`events_async`."""
        return self._portal.call(self.events_async(run_id, after))

    def runs(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        workflow: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> list[RunRecord]:
        """Blocking :meth:`runs_async`."""
        check_status(status)
        return self._portal.call(self.runs_async(status, limit, workflow=workflow, tags=tags))

    def count_runs(
        self,
        status: str | None = None,
        *,
        workflow: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> int:
        """Blocking :meth:`count_runs_async`."""
        check_status(status)
        return self._portal.call(self.count_runs_async(status, workflow=workflow, tags=tags))

    def llm_totals(self, run_ids: list[str]) -> dict[str, LLMTotals]:
        """Blocking :meth:`llm_totals_async`."""
        return self._portal.call(self.llm_totals_async(run_ids))

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Blocking :meth:`dead_letters_async`."""
        return self._portal.call(self.dead_letters_async(limit))

    def count_dead_letters(self) -> int:
        """Blocking :meth:`count_dead_letters_async`."""
        return self._portal.call(self.count_dead_letters_async())

    def receipts(self, run_id: str) -> list[DeliveryReceipt]:
        """Blocking :meth:`receipts_async`."""
        return self._portal.call(self.receipts_async(run_id))

    def run_receipt(self, run_id: str) -> dict[str, Any]:
        """Blocking :meth:`run_receipt_async`."""
        return self._portal.call(self.run_receipt_async(run_id))

    def prune(
        self,
        finished_before_s: float,
        *,
        statuses: Sequence[str] = DEFAULT_STATUSES,
        dry_run: bool = False,
    ) -> PruneReport:
        """Blocking :meth:`prune_async`."""
        return self._portal.call(
            self.prune_async(finished_before_s, statuses=statuses, dry_run=dry_run)
        )

    def sandboxes(self, run_id: str | None = None, limit: int = 100) -> list[SandboxRecord]:
        """Blocking :meth:`sandboxes_async`."""
        return self._portal.call(self.sandboxes_async(run_id, limit))

    def live_workers(self) -> list[WorkerInfo]:
        """Blocking :meth:`live_workers_async`."""
        return self._portal.call(self.live_workers_async())

    def settle_receipt(
        self, key: str, *, response: Any = UNSET, failed: bool = False
    ) -> DeliveryReceipt:
        """Blocking :meth:`settle_receipt_async`."""
        return self._portal.call(self.settle_receipt_async(key, response=response, failed=failed))

    def fork(
        self,
        run_id: str,
        at: str,
        *,
        input: Any = UNSET,
        edit: Mapping[str, Any] | None = None,
        by: str | None = None,
    ) -> str:
        """Blocking :meth:`fork_async`."""
        return self._portal.call(self.fork_async(run_id, at, input=input, edit=edit, by=by))

    def resume(self, run_id: str, *, by: str | None = None) -> str:
        """Blocking :meth:`resume_async`."""
        return self._portal.call(self.resume_async(run_id, by=by))

    def diff(self, a: str, b: str) -> RunDiff:
        """Blocking :meth:`diff_async`."""
        return self._portal.call(self.diff_async(a, b))
