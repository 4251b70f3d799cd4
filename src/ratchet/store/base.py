"""The Store: every read and write the engine makes, as one transaction each.

:class:`Store` is a facade. Its verbs are written once, over named queries, in modules by
concern: ``runs``, ``workers`` and ``leases``, ``journal``, ``waits``, ``endings``,
``deliveries`` (side effects' receipts), ``approvals``, ``graphs``, ``sandboxes``,
``history`` (what guards read), and, called with a store, ``retention``, ``tokens``,
``tenants``, ``sessions``, ``dashboard``. Each takes the store as its
:class:`ratchet.store.dialect.Dialect`: the hooks a dialect subclass (``sqlite.py``,
``postgres.py``) supplies, which are the queries, the connection, how and where a
transaction runs (and which ones it may commit together), and how waiters are woken. Each
public method is one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from ratchet.errors import RatchetError, StoreNotReady
from ratchet.model import (
    Approval,
    ClaimedRun,
    DeadLetter,
    DeliveryReceipt,
    Event,
    Lease,
    LLMTotals,
    NewRun,
    RunRecord,
    RunStatus,
)
from ratchet.model.starts import StartPlan
from ratchet.store import (
    approvals,
    deliveries,
    endings,
    forks,
    graphs,
    history,
    journal,
    leases,
    runs,
    sandboxes,
    start_options,
    workers,
)
from ratchet.store import queues as queue_limits
from ratchet.store import waits as run_waits
from ratchet.store.bus import CANCEL, DONE, EVENTS, READY
from ratchet.store.graphs import StoredGraph
from ratchet.store.hooks import StoreHooks
from ratchet.store.idempotency import check_same_run
from ratchet.store.leases import HeldLease, LeaseState
from ratchet.store.queries import load_migrations
from ratchet.store.runs import RunFilters
from ratchet.store.transaction import Clock, Tx, settled
from ratchet.store.workers import WorkerInfo

__all__ = [
    "CANCEL",
    "DONE",
    "EVENTS",
    "READY",
    "Clock",
    "HeldLease",
    "LeaseState",
    "Store",
    "StoredGraph",
    "Tx",
    "WorkerInfo",
    "settled",
]

T = TypeVar("T")


class Store(StoreHooks):
    """One schema, two backends. Every method is one transaction."""

    # -- the database itself -----------------------------------------------------------------

    async def now(self) -> float:
        """The database's clock (plus the store's offset), in Unix seconds."""
        return float(await self._read(lambda tx: tx.one("now", {})["now"]))

    async def check_ready(self) -> None:
        """Raise :class:`StoreNotReady`, naming what is wrong, unless the database answers
        and has every migration this code knows applied (``/readyz``)."""
        try:
            rows = await self._read(lambda tx: tx.all("migrations_applied", {}))
        except RatchetError as e:
            raise StoreNotReady(f"cannot read the applied migrations ({type(e).__name__})") from e
        done = {int(r["version"]) for r in rows}
        missing = [v for v, _, _ in load_migrations(self.sql_dialect) if v not in done]
        if missing:
            raise StoreNotReady("migrations not applied: " + ", ".join(map(str, missing)))

    # -- runs (ratchet.store.runs) -----------------------------------------------------------

    async def create_run(self, new: NewRun, *, redact: bool = False) -> tuple[RunRecord, bool]:
        """Write the run (``queued``) and its ``run_queued`` event; idempotent on run_id:
        an existing run with the same workflow, input, queue and priority is returned with
        ``created=False``; one that differs raises :class:`RunIdConflict` naming what
        (``redact``: without quoting the stored run's values)."""
        rec, created = await self._create(new)
        if not created:
            check_same_run(rec, new, redact)
        return rec, created

    async def create_runs(
        self, news: Sequence[NewRun], *, redact: bool = False
    ) -> list[tuple[str, RunStatus, bool]]:
        """Write many runs (``queued``) and their ``run_queued`` events in one transaction,
        with one wake-up: ``(run_id, status, created)`` per item, in order. Each item is
        idempotent on its run id as in :meth:`create_run`; an item whose id exists with a
        different workflow, input, queue, priority or tenant raises
        :class:`BatchItemInvalid` naming its index, and nothing of the batch is written
        (``redact``: without quoting the stored runs' values). Top-level runs only (no
        parent)."""
        return await runs.create_runs(self, news, redact)

    async def create_planned_run(
        self, new: NewRun, plan: StartPlan, *, redact: bool = False
    ) -> tuple[RunRecord, bool]:
        """:meth:`create_run` with a dedup id, a debounce or a time to begin at (see
        :mod:`ratchet.store.start_options`). A debounced start that finds its key's run
        not begun yet gives it its input and a new window, and returns it with
        ``created=False``; a dedup id held by a run not terminal raises
        :class:`DuplicateStart` naming it, and nothing is written."""
        return await start_options.create_planned_run(self, new, plan, redact)

    async def create_planned_runs(
        self, items: Sequence[tuple[NewRun, StartPlan | None]], *, redact: bool = False
    ) -> list[tuple[str, RunStatus, bool]]:
        """:meth:`create_runs` for a batch some of whose runs have a plan, each item as in
        :meth:`create_planned_run`; one transaction: a duplicate start or a conflict of
        any item writes nothing of the batch."""
        return await start_options.create_planned_runs(self, items, redact)

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""
        return await runs.get_run(self, run_id)

    async def list_runs(
        self, status: str | None = None, limit: int = 100, **filters: Unpack[RunFilters]
    ) -> list[RunRecord]:
        """The most recent runs (with ``status`` and ``filters``, if given)."""
        return await runs.list_runs(self, status, limit, **filters)

    async def count_runs(self, status: str | None = None, **filters: Unpack[RunFilters]) -> int:
        """How many runs there are (with ``status`` and ``filters``, if given)."""
        return await runs.count_runs(self, status, **filters)

    async def finished_among(self, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` that have reached a terminal status."""
        return await runs.finished_among(self, run_ids)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The dead-letter queue, most recent first."""
        return await runs.dead_letters(self, limit)

    async def count_dead_letters(self) -> int:
        """How many runs are in the dead-letter queue."""
        return await runs.count_dead_letters(self)

    async def start_child(self, lease: Lease, events: Sequence[Event], child: NewRun) -> RunRecord:
        """Append the parent's events and create the child run, in one transaction."""
        return await runs.start_child(self, lease, events, child)

    # -- the journal (ratchet.store.journal) ------------------------------------------------

    async def load_events(self, run_id: str, after: int = 0, limit: int = -1) -> list[Event]:
        """A run's journal after ``after``, in one query."""
        return await journal.load_events(self, run_id, after, limit)

    async def load_requests(self, run_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The model requests the run journaled (``step_started``'s ``request``) and the
        ``request_drifted`` events, in seq order, in one query: ``(kind, step id, the
        request or the event's payload)``."""
        return await journal.load_requests(self, run_id)

    async def journal_heads(self, run_ids: Sequence[str]) -> dict[str, int]:
        """The seq of the last event of each run's journal, by run id (runs with no
        journal are left out). A tail reads it to know where the journal ends now."""
        return await journal.heads(self, run_ids)

    async def journal_head(self, run_id: str) -> int:
        """The seq of the last event of the run's journal; 0 if it has none."""
        return (await journal.heads(self, [run_id])).get(run_id, 0)

    async def append(self, lease: Lease, events: Sequence[Event]) -> None:
        """Append events under the lease: all land, or LeaseLost and none do."""
        return await journal.append(self, lease, events)

    # -- workers and leases (ratchet.store.workers, ratchet.store.leases) -------------------

    async def hold_worker_id(self, worker_id: str) -> None:
        """Take the worker id's liveness lock, held until :meth:`drop_worker_id` or until
        the process dies; :class:`WorkerIdInUse` when a live worker holds it."""
        await workers.hold(self, worker_id)
        self._held.add(worker_id)

    async def drop_worker_id(self, worker_id: str) -> None:
        """Let go of the worker id's liveness lock (a clean stop)."""
        self._held.discard(worker_id)
        await self._release(worker_id)

    async def register_worker(
        self,
        worker_id: str,
        host: str,
        pid: int,
        *,
        serves: Collection[tuple[str, str]] = (),
        queues: Sequence[str] = (),
        lease_ttl: float = 15.0,
    ) -> None:
        """Record a worker, what it serves (``(workflow, version)`` pairs and queues) and
        its lease TTL, by which its liveness is judged (:meth:`live_workers`)."""
        params = self._registration(worker_id, host, pid, serves, queues, lease_ttl)
        await workers.register(self, params)

    def _registration(
        self,
        worker_id: str,
        host: str,
        pid: int,
        serves: Collection[tuple[str, str]],
        queues: Sequence[str],
        lease_ttl: float,
    ) -> dict[str, Any]:
        params = workers.registration(
            worker_id, host, pid, serves, queues, lease_ttl, worker_id in self._held
        )
        self._registrations[worker_id] = params
        return params

    async def live_workers(self) -> list[WorkerInfo]:
        """The workers seen within their lease TTL, with what they serve."""
        return await workers.live_workers(self)

    async def lease(self, run_id: str) -> LeaseState | None:
        """Who holds the run's lease now, at which epoch, and whether it is still live by
        the database's clock; None if the run was never claimed."""
        return await leases.lease_state(self, run_id)

    async def claim(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        """Take up to ``limit`` ready runs (queued, or waiting past ``not_before``) of the
        ``(workflow, version)`` pairs in ``served``; others stay queued for a worker that
        serves them."""
        return await leases.claim(self, worker_id, ttl, limit, queues, served)

    async def declare_queues(self, declared: Iterable[queue_limits.QueueLimits]) -> None:
        """Write the queues an app declares (see :mod:`ratchet.store.queues`); limits last
        changed through the API stand."""
        await queue_limits.declare(self, declared)

    async def set_queue_limits(
        self, name: str, changes: Mapping[str, Any]
    ) -> queue_limits.QueueLimits:
        """Change a declared queue's limits at run time (every worker's next claim obeys
        them); the fields in ``changes``, checked before anything is written."""
        return await queue_limits.set_limits(self, name, changes)

    async def list_queues(self) -> list[queue_limits.QueueView]:
        """Every declared queue with its limits, depth and runs in flight."""
        return await queue_limits.list_queues(self)

    async def steal_expired(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> list[ClaimedRun]:
        """The recovery sweep: take running runs (of the pairs in ``served``) whose lease
        is missing or expired; and forget workers long gone."""
        return await leases.steal_expired(self, worker_id, ttl, limit, queues, served)

    async def take_over(
        self,
        worker_id: str,
        ttl: float,
        limit: int,
        queues: Sequence[str],
        served: Collection[tuple[str, str]],
    ) -> tuple[list[ClaimedRun], bool]:
        """Take up to ``limit`` running runs (of the pairs in ``served``) whose holder
        died, its lease live or not, and whether more wait; forget the dead workers left
        with no run."""
        return await leases.take_over(self, worker_id, ttl, limit, queues, served)

    async def reclaim_own(
        self, worker_id: str, ttl: float, served: Collection[tuple[str, str]]
    ) -> list[ClaimedRun]:
        """On restart: take back, at once, the running runs still under this worker id
        (those of the pairs in ``served``; the sweep hands the others on)."""
        return await leases.reclaim_own(self, worker_id, ttl, served)

    async def start_worker(
        self,
        worker_id: str,
        host: str,
        pid: int,
        *,
        serves: Collection[tuple[str, str]] = (),
        queues: Sequence[str] = (),
        lease_ttl: float = 15.0,
    ) -> list[ClaimedRun]:
        """:meth:`register_worker`, then :meth:`reclaim_own`, in one commit: a restarted
        worker's interrupted runs are its own again one commit after it starts."""
        params = self._registration(worker_id, host, pid, serves, queues, lease_ttl)
        return await leases.start_worker(self, params, serves)

    async def renew(self, worker_id: str, ttl: float, run_ids: Sequence[str]) -> list[HeldLease]:
        """Extend the leases of the runs this worker drives, in one statement, and report
        which it still holds (a run missing from the answer was taken from it)."""
        return await leases.renew(self, worker_id, ttl, run_ids, self._registrations)

    async def retake_lease(self, lease: Lease, ttl: float) -> Lease | None:
        """The holder's lease again under a new epoch, for a new drive by the same worker;
        None if the lease moved on meanwhile."""
        return await leases.retake_lease(self, lease, ttl)

    async def release_worker(self, worker_id: str) -> None:
        """A clean shutdown: hand this worker's running runs back to the queue at once,
        and remove its ``workers`` row."""
        await leases.release_worker(self, worker_id)

    # -- waits and signals (ratchet.store.waits) ---------------------------------------------

    async def park(
        self, lease: Lease, events: Sequence[Event], waits: Sequence[str], not_before: float | None
    ) -> tuple[str, list[str]]:
        """Append ``events``, set the run ``waiting`` and release the lease, unless some of
        ``waits`` (``signal:NAME``, ``child:RUN``, ``approval:STEP``, or timers) is already
        satisfied. Returns ``("parked", [])``, ``("ready", satisfied)`` (keep driving;
        events still appended) or ``("cancel", [who])`` (a cancel is pending; who asked
        for it, an empty list where nobody was named). Several waits park the run as
        ``any:[...]``: whichever arrives first wakes it."""
        return await run_waits.park(self, lease, events, waits, not_before)

    async def hand_back(self, lease: Lease, events: Sequence[Event]) -> None:
        """A drive stopped for a shutdown: append its last events, queue the run again and
        release the lease, so any worker can take it at once."""
        await run_waits.hand_back(self, lease, events)

    async def send_signal(self, run_id: str, name: str, payload: Any) -> RunRecord:
        """Deliver a signal; wakes the run if it waits for this signal."""
        return await run_waits.send_signal(self, run_id, name, payload)

    async def pending_signal(self, run_id: str, name: str) -> tuple[int, Any] | None:
        """The oldest unconsumed signal ``name`` for the run: ``(signal_id, payload)``."""
        return await run_waits.pending_signal(self, run_id, name)

    async def consume_signal(self, lease: Lease, events: Sequence[Event], signal_id: int) -> None:
        """Append ``events`` and mark the signal consumed by the last of them, together.
        Only the lease holder consumes a run's signals, so the peek before cannot race."""
        await run_waits.consume_signal(self, lease, events, signal_id)

    # -- how runs end (ratchet.store.endings) ------------------------------------------------

    async def finish(
        self,
        lease: Lease,
        events: Sequence[Event],
        status: RunStatus,
        output: Any = None,
        error: str | None = None,
        dead_letter: str | None = None,
        receipt: dict[str, Any] | None = None,
    ) -> None:
        """Append the terminal events and set the terminal status, once: the guarded
        update lets exactly one finisher through; any other gets RunFinished and its
        events roll back. A child's end wakes its waiting parent in the same commit.
        ``receipt`` (:func:`ratchet.store.retention.receipt_params`): the run's signed
        receipt, stored in the same commit, so a run never ends without one."""
        await endings.finish(self, lease, events, status, output, error, dead_letter, receipt)

    async def cancel(self, run_id: str, by: str | None = None) -> RunStatus:
        """Cancel a run and its unfinished children. Unowned (queued, waiting): cancelled
        here and now, fencing any expired holder. Owned by a live worker: flagged with
        ``by``, and that worker finishes it. Either way ``by``, who asked, is journaled in
        the ``run_cancelled`` of the run and of its children ("request" where None)."""
        return await endings.cancel(self, run_id, by)

    async def retry_dead(
        self, run_id: str, grant: dict[str, Any] | None = None, by: str | None = None
    ) -> RunRecord:
        """Re-queue a dead-lettered run; it resumes after its last completed step, with its
        limits as they were unless ``grant`` (checked by the caller) moves some; ``by``,
        who retried it, is journaled in the ``run_queued`` event with the grant."""
        return await endings.retry_dead(self, run_id, grant, by)

    # -- forks and resumes (ratchet.store.forks) ---------------------------------------------

    async def create_fork(self, new: NewRun, events: Sequence[Event]) -> RunRecord:
        """Write a fork: its run row (queued, with its lineage) and the journal it starts
        with (:func:`ratchet.store.forks.fork_journal`), in one transaction."""
        return await forks.create_fork(self, new, events)

    async def resume(self, run_id: str, by: str | None = None) -> RunRecord:
        """Queue a cancelled run again under its own id; it goes on after its last
        completed step. :class:`NotCancelled` for any other status, writing nothing."""
        return await forks.resume(self, run_id, by)

    # -- deliveries' receipts (ratchet.store.deliveries) -------------------------------------

    async def claim_receipt(
        self, lease: Lease, key: str, step_id: str, *, delivery: str, attempt: int
    ) -> DeliveryReceipt | None:
        """Claim delivery ``delivery`` of the step before dispatch, under ``key`` (the one
        ``attempt`` derives for it). None: newly claimed, dispatch. Otherwise the receipt an
        earlier attempt or drive left for this delivery, with the key it was sent under
        (settled: reuse its response; failed: settled by hand as not delivered; claimed: a
        crash or a failed dispatch left it, and the delivery's policy decides)."""
        return await deliveries.claim(self, lease, key, step_id, delivery=delivery, attempt=attempt)

    async def reclaim_receipt(self, lease: Lease, key: str) -> None:
        """Re-claim a receipt left claimed, for a resend under the same key."""
        await deliveries.reclaim(self, lease, key)

    async def settle_receipt(self, lease: Lease, key: str, response: Any) -> None:
        """Record the delivery's response, under the lease that dispatched it."""
        await deliveries.settle(self, lease, key, response)

    async def resolve_receipt(
        self, key: str, response: Any = None, failed: bool = False
    ) -> DeliveryReceipt:
        """Settle a claimed receipt by hand (a person who found out what happened): with
        the receiver's ``response``, or as ``failed`` (it did not happen). Refused for an
        unknown key, a receipt already settled, and while a worker holds the run's lease
        (its drive may be dispatching this very delivery)."""
        return await deliveries.resolve(self, key, response, failed)

    async def receipts(self, run_id: str) -> list[DeliveryReceipt]:
        """A run's receipts, in the order they were (last) claimed."""
        return await deliveries.receipts(self, run_id)

    # -- approvals (ratchet.store.approvals) -------------------------------------------------

    async def ask_approval(
        self,
        lease: Lease,
        events: Sequence[Event],
        step_id: str,
        attempt: int,
        name: str,
        data: Any,
        deadline: float | None,
    ) -> None:
        """Append ``events`` (the ``step_waiting`` that asks) and write the approval's row,
        together: from then on it is listed and may be decided."""
        await self._run(
            lambda tx: approvals.ask(
                self, tx, lease, events, step_id, attempt, name, data, deadline
            )
        )

    async def get_approval(self, run_id: str, step_id: str) -> Approval | None:
        """The approval asked by step ``step_id`` of the run."""
        return await self._read(lambda tx: approvals.get(tx, run_id, step_id))

    async def expire_approval(self, lease: Lease, step_id: str, attempt: int) -> Approval:
        """The holder found the approval's deadline past: mark it expired, unless a
        decision landed first. Returns the row as it ends (expired, or decided)."""
        return await self._run(lambda tx: approvals.expire(tx, lease, step_id, attempt))

    async def decide_approval(
        self,
        run_id: str,
        step: str,
        approved: bool,
        by: str,
        comment: str | None,
        note: str | None = None,
        grant: dict[str, Any] | None = None,
    ) -> Approval:
        """Record a person's decision on a pending approval (``step``: its step id, or its
        name when that picks one) and wake the run; ``note``: a name the client gave
        beside the decider ``by``. Refused, with nothing written, for an unknown run or
        approval, one already decided (:class:`ApprovalAlreadyDecided`), timed out, or of
        a finished run (:class:`ApprovalNotPending`). ``grant`` (checked by the caller):
        for a guard's pause of a limit, the limits approving it moves (see
        :func:`ratchet.store.approvals.granting`)."""
        return await self._run(
            lambda tx: approvals.decide(self, tx, run_id, step, approved, by, comment, note, grant)
        )

    async def pending_approvals(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[Approval]:
        """Pending approvals of unfinished runs, oldest first; with ``run_id``, those of
        that run and of the runs under it."""
        return await approvals.pending(self, run_id, limit)

    # -- graphs (ratchet.store.graphs) -------------------------------------------------------

    async def register_graph(self, name: str, version: str, definition: Any) -> StoredGraph:
        """Store a graph version (a no-op when that content is registered already); the row
        as stored, with its first registration time."""
        return await graphs.register_graph(self, name, version, definition)

    async def get_graph(self, name: str, version: str | None = None) -> StoredGraph | None:
        """A registered graph version, or its latest registered version."""
        return await graphs.get_graph(self, name, version)

    async def list_graphs(self) -> list[StoredGraph]:
        """Every registered version of every graph, newest first within a name."""
        return await graphs.list_graphs(self)

    async def graph_versions_tiers(
        self,
    ) -> tuple[frozenset[tuple[str, str]], frozenset[tuple[str, str]]]:
        """Every registered ``(graph name, version)`` pair (what a worker serves besides
        its code workflows), and those of ``tier: isolated`` among them."""
        return await graphs.versions_and_tiers(self)

    # -- what guards read (ratchet.store.history) --------------------------------------------

    async def recent_retries(self, workflow: str, window_s: float) -> int:
        """How many retries the runs of ``workflow`` journaled within the last ``window_s``
        seconds, whichever worker drove them."""
        return await history.recent_retries(self, workflow, window_s)

    async def llm_history(
        self, workflow: str, limit: int
    ) -> list[tuple[str, str | None, dict[str, Any] | None]]:
        """The LLM calls (run, step, usage and cost) of the last ``limit`` finished runs of
        ``workflow``; a run without any has one row with step and call None."""
        return await history.llm_history(self, workflow, limit)

    async def llm_totals(self, run_ids: Sequence[str]) -> dict[str, LLMTotals]:
        """The model calls of each run, summed from their journals (runs without any are
        left out)."""
        return await history.llm_totals(self, run_ids)

    # -- sandboxes (ratchet.store.sandboxes) -------------------------------------------------

    async def open_sandbox(
        self, lease: Lease, sandbox_id: str, backend: str, limit: int, since_epoch: int = 0
    ) -> tuple[sandboxes.SandboxRecord | None, int]:
        """Under the lease: the row of the run's next sandbox, or None once ``limit``
        attempts (of epoch ``since_epoch`` on) were counted; and how many were."""
        return await sandboxes.open_sandbox(self, lease, sandbox_id, backend, limit, since_epoch)

    async def sandbox_running(self, sandbox_id: str) -> None:
        """The sandbox's process started."""
        await sandboxes.running(self, sandbox_id)

    async def end_sandbox(
        self,
        sandbox_id: str,
        *,
        reason: str,
        exit_code: int | None,
        signal: int | None,
        peak_memory: int | None,
    ) -> None:
        """The sandbox's process is gone: how it ended."""
        await sandboxes.end(
            self,
            sandbox_id,
            reason=reason,
            exit_code=exit_code,
            signal=signal,
            peak_memory=peak_memory,
        )

    async def list_sandboxes(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[sandboxes.SandboxRecord]:
        """A run's sandboxes by attempt, or the most recent ones of every run."""
        return await sandboxes.list_sandboxes(self, run_id, limit)
