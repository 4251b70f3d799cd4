"""The worker's side of an isolated run: spawn its sandbox, own it through the run's
lease, and decide what follows when it ends.

The worker that holds a run's lease (by claim, by the sweep, by reclaiming its own) is the
only one that spawns its sandbox, and its lease is renewed like any drive's while the
sandbox lives. A sandbox lives no longer than its owner holds the lease: bubblewrap's
``--die-with-parent`` takes it down with a worker that dies, and a worker that loses the
lease, or cannot renew it, kills it. So the sweep never races an owner with a live
sandbox: it only takes runs whose lease expired, and then none of their sandboxes runs.

Each pass: if the journal holds the run's end, it is over. Otherwise the next sandbox is
opened in the store (under the lease; the rows a dead owner left are closed as orphaned),
unless three were already spawned for the run, in which case the run fails with
``{code: sandbox_resume_exhausted, attempts}``. The worker journals the drive's start
(``run_started`` / ``run_resumed``, naming the sandbox) and spawns it; from then on it
writes what the sandbox proposes, once checked (:mod:`ratchet.sandbox.host`). From the
second sandbox on it starts with ``RATCHET_RESUME=1``: the harness replays the completed
steps and runs the rest. A crash, an OOM kill or a timeout ends the sandbox without the
run's end, and the next pass spawns again. A cancel kills the sandbox and ends the run
as cancelled; a shutdown lets the sandbox run through the grace period, then kills it and
hands the run back (that sandbox is not counted against the three).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ratchet.engine.control import Control, DriveOutcome, StopReason
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.guards import DEFAULT as DEFAULT_GUARDS
from ratchet.engine.worker import Relet
from ratchet.errors import (
    LeaseLost,
    MissingExtra,
    RatchetError,
    RunFinished,
    SandboxUnavailable,
)
from ratchet.extras import require
from ratchet.graphs.walk import GraphWorkflow
from ratchet.model import (
    UNNAMED_CANCEL,
    ClaimedRun,
    Event,
    EventKind,
    Lease,
    RunState,
    RunStatus,
    dumps,
    fold,
)
from ratchet.receipts import Signer
from ratchet.receipts.service import receipt_for
from ratchet.sandbox import mounts
from ratchet.sandbox.backend import (
    REPORT_SOCKET,
    Exit,
    SandboxBackend,
    SandboxProcess,
    SpawnRequest,
)
from ratchet.sandbox.bwrap import default_backend
from ratchet.sandbox.channel import ReportChannel
from ratchet.sandbox.grants import Grant
from ratchet.sandbox.host import HostJournal
from ratchet.sandbox.spec import Sandbox
from ratchet.store import sandboxes as rows
from ratchet.store.base import Store

log = logging.getLogger("ratchet.sandbox")

MAX_SANDBOXES = 3
EXHAUSTED = "sandbox_resume_exhausted"
UNAVAILABLE = "sandbox_unavailable"
# The drive reason of a sandbox spawned again by the same drive after one ended unfinished.
RESPAWN = "resume"


# The harness module, run as ``python -m`` inside the sandbox.
HARNESS = "ratchet.sandbox.harness"
# The SDKs refuse to make a client without a key: a sandbox's clients get this one, which
# never leaves it (its model calls are made by the worker, with the worker's key).
PLACEHOLDER_KEYS = {
    "OPENAI_API_KEY": "ratchet-sandbox-no-key",
    "ANTHROPIC_API_KEY": "ratchet-sandbox-no-key",
}


class IsolatedRunner:
    """Drives isolated runs for one worker: its report channel and its backend."""

    def __init__(
        self,
        store: Store,
        backend: SandboxBackend | None = None,
        signer: Signer | None = None,
        private: Sequence[str] = (),
    ) -> None:
        self.store = store
        self._backend = backend
        # Ratchet's own files (the data directory, the database's), hidden from sandboxes.
        self.private = list(private)
        # Signs the receipt of each run that ends here, in the commit that ends it: by a
        # sandbox's report (its HostJournal) or by this worker (_finish, _settled).
        self.signer = signer
        self.channel = ReportChannel(store)
        # The sandbox alive per run on this worker: a drive that takes a run over from an
        # older drive here (a retake) waits for the older one's sandbox to be gone.
        self._live: dict[str, tuple[SandboxProcess, asyncio.Future[Exit]]] = {}

    async def backend(self) -> SandboxBackend:
        if self._backend is None:
            # Off the event loop: finding the cgroups touches the file system.
            self._backend = await asyncio.to_thread(default_backend)
        return self._backend

    async def unavailable(self) -> str | None:
        """Why this worker cannot make sandboxes (no bubblewrap, one that cannot make a
        namespace here, the server extra missing for the report channel), or None."""
        try:
            require("the isolated tier's report channel", "server")
            await (await self.backend()).probe()
        except (SandboxUnavailable, MissingExtra) as e:
            return str(e)
        return None

    async def close(self) -> None:
        await self.channel.close()
        close = getattr(self._backend, "close", None)
        if callable(close):
            close()

    async def drive(
        self, claimed: ClaimedRun, wd: WorkflowDef, control: Control, relet: Relet
    ) -> DriveOutcome:
        """Drive one claimed isolated run until it ends, stops or loses its lease."""
        try:
            return await self._drive(claimed, wd, control, relet)
        except LeaseLost:
            log.warning("action=lease_lost run_id=%s", claimed.record.run_id)
            return DriveOutcome.LEASE_LOST
        except RunFinished:
            return DriveOutcome.NOOP
        except RatchetError as e:
            log.warning("action=drive_aborted run_id=%s error=%s", claimed.record.run_id, e)
            return DriveOutcome.ABORTED

    async def _drive(
        self, claimed: ClaimedRun, wd: WorkflowDef, control: Control, relet: Relet
    ) -> DriveOutcome:
        run_id, lease = claimed.record.run_id, claimed.lease
        sandbox = sandbox_of(wd)
        reason = claimed.reason
        ready: tuple[SandboxBackend, str] | None = None
        while True:
            events = await self.store.load_events(run_id)
            state = fold(run_id, events)
            if state.status.terminal:
                return await self._settled(lease, events)
            if control.reason is not None:
                return await self._stopped(lease, events, reason, control.reason, control.cancel_by)
            if reason == RESPAWN:
                # Each sandbox writes under an epoch of its own: one the run has moved on
                # from is refused by the store's fence, whatever it still tries.
                again = await relet()
                if again is None:
                    stop = control.reason or StopReason.LEASE_LOST
                    return await self._stopped(lease, events, reason, stop, control.cancel_by)
                lease = again.lease
            if ready is None:
                # Ready before a sandbox's row is written, so that between the row (the
                # attempt counted) and the process there is no more than the spawn.
                try:
                    ready = (await self.backend(), await self.channel.start())
                except (SandboxUnavailable, MissingExtra) as e:
                    return await self._unavailable(lease, events, reason, str(e))
            backend, socket = ready
            sandbox_id = f"sbx-{uuid.uuid4().hex[:16]}"
            row, counted = await self.store.open_sandbox(
                lease, sandbox_id, backend.name, MAX_SANDBOXES, counted_since(events, claimed.lease)
            )
            if row is None:
                return await self._exhausted(lease, events, reason, counted)
            events = [*events, await self._mark(lease, state, reason, sandbox_id)]
            journal = HostJournal(
                self.store, lease, claimed.record, events, wd.guards or DEFAULT_GUARDS, self.signer
            )
            grant, token = self.channel.grants.issue(journal, sandbox_id, sandbox.timeout_s)
            try:
                exit, why = await self._run_sandbox(backend, socket, row, wd, token, control, grant)
            finally:
                self.channel.grants.revoke(grant)
            await self._ended(row, grant, exit, why)
            if why == "deadline" and await journal.time_out():
                log.info("action=run_timed_out run_id=%s sandbox_id=%s", run_id, sandbox_id)
                return DriveOutcome.FAILED
            if why.startswith("unavailable"):
                return await self._unavailable(lease, events, reason, why[13:])
            if grant.finished is not None:
                return (
                    DriveOutcome.SUCCEEDED if grant.finished == "succeeded" else DriveOutcome.FAILED
                )
            reason = RESPAWN

    async def _mark(self, lease: Lease, state: RunState, reason: str, sandbox_id: str) -> Event:
        """Journal the start of this drive, the sandbox's: the marker an in-process drive
        writes itself, written by the worker (a sandbox proposes step events only)."""
        kind = EventKind.RUN_RESUMED if state.started else EventKind.RUN_STARTED
        marker = Event.chain(
            lease.run_id,
            state.last_seq + 1,
            kind,
            None,
            None,
            {
                "worker_id": lease.worker_id,
                "epoch": lease.epoch,
                "reason": reason,
                "drive": state.drives + 1,
                "sandbox_id": sandbox_id,
            },
            time.time(),
            state.last_hash,
        )
        await self.store.append(lease, [marker])
        return marker

    def hidden(self) -> list[str]:
        """What no sandbox may see: Ratchet's files (the data directory, the database's),
        the signing key, and the files this worker logs to."""
        paths = [*self.private, *mounts.log_files()]
        if self.signer is not None:
            paths.append(str(self.signer.path))
        for name in ("RATCHET_SIGNING_KEY", "RATCHET_DATA_DIR"):
            if os.environ.get(name):
                paths.append(os.path.abspath(os.path.expanduser(os.environ[name])))
        return paths

    async def _run_sandbox(
        self,
        backend: SandboxBackend,
        socket: str,
        row: rows.SandboxRecord,
        wd: WorkflowDef,
        token: str,
        control: Control,
        grant: Grant,
    ) -> tuple[Exit, str]:
        """Spawn the sandbox and wait until it is gone: its exit, and why it ended
        (``exited``, ``timeout``, ``deadline`` at the run's deadline, ``ended`` when the
        worker ended the run itself, or the stop that killed it)."""
        sandbox = sandbox_of(wd)
        env = {
            "RATCHET_RUN_ID": row.run_id,
            "RATCHET_SANDBOX_ID": row.sandbox_id,
            "RATCHET_REPORT_TOKEN": token,
            "RATCHET_WORKER_ID": row.worker_id,
            "RATCHET_LEASE_EPOCH": str(row.epoch),
            "RATCHET_REPORT_SOCKET": REPORT_SOCKET,
            "RATCHET_NETWORK": sandbox.network,
            "PYTHONPATH": os.pathsep.join(mounts.import_path()),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            **PLACEHOLDER_KEYS,
        }
        if row.attempt > 1:
            env["RATCHET_RESUME"] = "1"
        began = time.monotonic()
        try:
            args, more = harness_args(wd)
            env.update(more)
            argv = [sys.executable, "-m", HARNESS, *args]
            request = SpawnRequest(row.sandbox_id, sandbox, argv, env, socket, hidden=self.hidden())
            previous = self._live.get(row.run_id)
            if previous is not None:
                previous[0].kill()
                await asyncio.shield(previous[1])
            proc = await backend.spawn(request)
        except SandboxUnavailable as e:
            return Exit(None, None), f"unavailable: {e}"
        try:
            await self.store.sandbox_running(row.sandbox_id)
        except RatchetError as e:  # the row's status only: the sandbox runs on, owned
            log.warning("action=sandbox_status_failed sandbox_id=%s error=%s", row.sandbox_id, e)
        log.info(
            "action=sandbox_started run_id=%s sandbox_id=%s attempt=%s pid=%s",
            row.run_id,
            row.sandbox_id,
            row.attempt,
            proc.pid,
        )
        stopped = asyncio.Event()

        def on_stop() -> None:
            # A shutdown lets the sandbox run through the grace period.
            if control.reason is not StopReason.SHUTDOWN or control.interrupt_steps:
                stopped.set()

        control.listen(on_stop)
        waiting = asyncio.ensure_future(proc.wait())
        self._live[row.run_id] = (proc, waiting)
        stopping = asyncio.ensure_future(stopped.wait())
        # The worker ended the run itself (a guard failed it): the sandbox has nothing
        # left to do that would land.
        ended = asyncio.ensure_future(grant.journal.ended.wait())
        why = "exited"
        try:
            # The sandbox's own time limit, or the run's deadline where that comes first.
            timeout, at_deadline = sandbox.timeout_s, False
            deadline = grant.journal.deadline
            if deadline is not None and (timeout is None or deadline[0] - time.time() < timeout):
                timeout, at_deadline = max(0.0, deadline[0] - time.time()), True
            done, _ = await asyncio.wait(
                {waiting, stopping, ended}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if waiting not in done:
                why = (
                    str(control.reason)
                    if stopping in done
                    else "ended"
                    if ended in done
                    else "deadline"
                    if at_deadline
                    else "timeout"
                )
                proc.kill()
            exit = await asyncio.shield(waiting)
        finally:
            control.listen(None)
            stopping.cancel()
            ended.cancel()
            if self._live.get(row.run_id, (None, None))[1] is waiting:
                del self._live[row.run_id]
            if not waiting.done():  # the drive itself is being cancelled
                proc.kill()
        log.info(
            "action=sandbox_ended run_id=%s sandbox_id=%s why=%s exit=%s signal=%s "
            "oom=%s seconds=%.3f",
            row.run_id,
            row.sandbox_id,
            why,
            exit.exit_code,
            exit.signal,
            exit.oom,
            time.monotonic() - began,
        )
        return exit, why

    async def _ended(self, row: rows.SandboxRecord, grant: Grant, exit: Exit, why: str) -> None:
        if grant.finished is not None:
            reason = rows.FINISHED
        elif why == str(StopReason.SHUTDOWN):
            reason = rows.SHUTDOWN
        elif why in (str(StopReason.CANCEL), str(StopReason.LEASE_LOST)):
            reason = rows.KILLED
        elif exit.oom:
            reason = rows.OOM
        elif why in ("timeout", "deadline"):
            reason = rows.TIMEOUT
        else:
            reason = rows.CRASHED
        await self.store.end_sandbox(
            row.sandbox_id,
            reason=reason,
            exit_code=exit.exit_code,
            signal=exit.signal,
            peak_memory=exit.peak_memory,
        )

    # -- ends the worker writes itself -----------------------------------------------------

    async def _finish(
        self,
        lease: Lease,
        events: list[Event],
        reason: str,
        status: RunStatus,
        payload: dict[str, Any],
        error: str | None,
        dead_letter: str | None = None,
    ) -> None:
        """End the run from the worker (no sandbox of this epoch reported a drive marker,
        or none could): a drive marker of its own first, unless a sandbox wrote one under
        this very lease, so the journal's drives read as any run's do."""
        markers = [e for e in events if e.kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED)]
        ended: list[Event] = []
        last = events[-1]
        if not markers or markers[-1].payload.get("epoch") != lease.epoch:
            kind = EventKind.RUN_RESUMED if markers else EventKind.RUN_STARTED
            last = Event.chain(
                lease.run_id,
                last.seq + 1,
                kind,
                None,
                None,
                {
                    "worker_id": lease.worker_id,
                    "epoch": lease.epoch,
                    "reason": reason,
                    "drive": len(markers) + 1,
                },
                time.time(),
                last.hash,
            )
            ended.append(last)
        terminal = {
            RunStatus.FAILED: EventKind.RUN_FAILED,
            RunStatus.CANCELLED: EventKind.RUN_CANCELLED,
        }[status]
        ended.append(
            Event.chain(
                lease.run_id, last.seq + 1, terminal, None, None, payload, time.time(), last.hash
            )
        )
        await self.store.finish(
            lease,
            ended,
            status,
            None,
            error,
            dead_letter,
            await self._receipt(lease.run_id, [*events, *ended]),
        )

    async def _receipt(self, run_id: str, journal: list[Event]) -> dict[str, Any] | None:
        """The signed receipt over ``journal``, a run's whole journal with its end (None
        without a key). These ends are rare (a cancel, a run out of sandboxes): reading
        the run's record here costs the common path nothing."""
        if self.signer is None:
            return None
        record = await self.store.get_run(run_id)
        if record is None:
            return None
        return receipt_for(self.signer, record, fold(run_id, journal))

    async def _unavailable(
        self, lease: Lease, events: list[Event], reason: str, why: str
    ) -> DriveOutcome:
        """No sandbox can be made here (bubblewrap or the server extra missing, a workflow
        the sandbox cannot import): fail the run saying so; another attempt would fare
        no better."""
        error = f"run {lease.run_id}: no sandbox could be started: {why}"
        log.error("action=sandbox_unavailable run_id=%s error=%s", lease.run_id, why)
        await self._finish(
            lease,
            events,
            reason,
            RunStatus.FAILED,
            {"error": error, "reason": UNAVAILABLE},
            error,
            UNAVAILABLE,
        )
        return DriveOutcome.FAILED

    async def _exhausted(
        self, lease: Lease, events: list[Event], reason: str, attempts: int
    ) -> DriveOutcome:
        error = (
            f"run {lease.run_id}: {attempts} sandboxes ended without finishing it "
            f"(crashes, out-of-memory kills or timeouts); not spawning another"
        )
        await self._finish(
            lease,
            events,
            reason,
            RunStatus.FAILED,
            {"error": error, "reason": EXHAUSTED, "code": EXHAUSTED, "attempts": attempts},
            error,
            EXHAUSTED,
        )
        log.info(
            "action=run_failed run_id=%s reason=%s attempts=%s", lease.run_id, EXHAUSTED, attempts
        )
        return DriveOutcome.FAILED

    async def _stopped(
        self, lease: Lease, events: list[Event], reason: str, stop: StopReason, by: str | None
    ) -> DriveOutcome:
        """A cancel ends the run as cancelled ``by`` whoever asked (None: nobody named)."""
        if stop is StopReason.LEASE_LOST:
            return DriveOutcome.LEASE_LOST
        if stop is StopReason.CANCEL:
            ended = {"error": "cancelled", "by": by or UNNAMED_CANCEL}
            await self._finish(lease, events, reason, RunStatus.CANCELLED, ended, "cancelled")
            return DriveOutcome.CANCELLED
        await self.store.hand_back(lease, [])
        return DriveOutcome.HANDED_BACK

    async def _settled(self, lease: Lease, events: list[Event]) -> DriveOutcome:
        """Claimed with its end already journaled: give the run's row that end."""
        state, last = fold(lease.run_id, events), events[-1]
        reason = last.payload.get("reason") if last.kind == EventKind.RUN_FAILED else None
        try:
            await self.store.finish(
                lease,
                [],
                state.status,
                state.output,
                state.error,
                reason,
                await self._receipt(lease.run_id, events),
            )
        except RunFinished:
            pass
        return DriveOutcome.NOOP


def counted_since(events: list[Event], claimed: Lease) -> int:
    """The lowest lease epoch whose sandboxes count against the limit: after a manual
    retry of the run (``run_queued {reason: retry}``), only those of the drives since."""
    retried = [
        i
        for i, e in enumerate(events)
        if e.kind == EventKind.RUN_QUEUED and e.payload.get("reason") == "retry"
    ]
    if not retried:
        return 0
    markers = [
        e for e in events[retried[-1] :] if e.kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED)
    ]
    # No drive since the retry has reported yet: count from this drive's claim, newer
    # than any lease before the retry.
    return int(markers[0].payload.get("epoch", 0)) if markers else claimed.epoch


def harness_args(wd: WorkflowDef) -> tuple[list[str], dict[str, str]]:
    """The harness's arguments and the environment it needs besides the run's: a code
    workflow's reference, or for a graph its definition and its tools' references."""
    if not isinstance(wd, GraphWorkflow) or wd.graph is None:
        return [module_ref(wd, wd.fn.__module__, f"workflow {wd.name}")], {}
    tools = wd.tools or {}
    refs = {}
    for node in wd.graph.nodes.values():
        if node.type == "tool":
            call = tools.get(node.data.tool)
            if call is None:
                raise SandboxUnavailable(
                    f"graph {wd.name}: node {node.id!r} calls tool "
                    f"{node.data.tool!r}, which this worker's app lacks"
                )
            refs[node.data.tool] = module_ref(
                call, call.__module__, f"tool {node.data.tool} of graph {wd.name}"
            )
    # The harness (and the HTTP client it reports with) loads only when a sandbox is
    # spawned: a worker that never spawns one does not pay for it at start.
    from ratchet.sandbox import harness

    return [harness.GRAPH_ARG], {
        harness.GRAPH_ENV: dumps(wd.graph.definition),
        harness.TOOLS_ENV: dumps(refs),
    }


def sandbox_of(wd: WorkflowDef) -> Sandbox:
    """The sandbox an isolated workflow's attempts run in (the engine's definition holds
    it as an object: the engine knows nothing of sandboxes)."""
    assert isinstance(wd.sandbox, Sandbox), wd.name  # the worker isolates only these
    return wd.sandbox


def module_ref(obj: object, module_name: str, what: str) -> str:
    """``module:name`` of ``obj``, for the harness to import it inside the sandbox; for
    one of the script being run (``__main__``), ``/path/of/script.py:name``."""
    module = sys.modules.get(module_name)
    name = next((k for k, v in vars(module).items() if v is obj), None) if module else None
    if module is None or name is None:
        raise SandboxUnavailable(
            f"{what}: an isolated run's code must be a module-level name, so its sandbox "
            f"can import it"
        )
    if module_name == "__main__":
        path = getattr(module, "__file__", None)
        if path is None:
            raise SandboxUnavailable(
                f"{what}: an isolated run's code cannot be defined in an interactive session"
            )
        return f"{os.path.abspath(path)}:{name}"
    return f"{module_name}:{name}"
