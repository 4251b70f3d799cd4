"""The drive's waits as steps: durable sleep, signals, child runs and approvals.

Each is a step of the workflow (its position taken like any step's) whose outcome comes
from outside: the clock, a signal, a child run's end, a person's decision. It journals
``step_waiting`` and waits on the drive's waits (:mod:`ratchet.engine.waits`): in memory
while other branches move, parked once every branch waits. Its journaled outcome is handed
back on replay like any step's.
"""

from __future__ import annotations

from typing import Any

from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.steps import Steps
from ratchet.engine.values import Codec, Invalid
from ratchet.errors import (
    ApprovalTimeout,
    ChildRunFailed,
    NotSerializable,
    RatchetError,
    SignalTimeout,
)
from ratchet.model import Decision, EventKind, NewRun, RunStatus, StepState, WaitKey


def child_run_id(parent_run_id: str, ordinal: int, attempt: int) -> str:
    """A child's id, derived from its parent and step so a re-driven parent finds it again.
    ``/`` cannot appear in an id a user chooses, so no user run can take a child's id."""
    suffix = f"/{ordinal}" if attempt == 1 else f"/{ordinal}.{attempt}"
    return parent_run_id + suffix


class Primitives(Steps):
    """Sleep, signals, child runs and approvals."""

    async def sleep(self, seconds: float) -> None:
        if self._held:
            await self.close_held()
        step_id, step = self.next_step("sleep")
        if await self.journaled_outcome(step) is not None:
            return
        self.check_stop()
        if step is not None and step.waiting is not None:
            until = float(step.waiting["until"])
        else:
            until = await self.store.now() + seconds
            self.emit(
                EventKind.STEP_WAITING,
                step_id,
                None,
                {"reason": "sleep", "seconds": seconds, "until": until},
            )
        await self._wait_until(str(WaitKey.sleep(step_id)), until)
        self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": None})

    async def wait_for_signal(
        self, name: str, timeout_s: float | None, codec: Codec | None = None
    ) -> Any:
        """The data of signal ``name``, once it arrives, read as ``codec`` says (the type
        the workflow waits for; None: the JSON data)."""
        if self._held:
            await self.close_held()
        step_id, step = self.next_step(f"signal:{name}")
        done = await self.journaled_outcome(step)
        if done is not None:
            return _signal_data(codec, name, done.output)
        self.check_stop()
        while True:
            found = await self.store.pending_signal(self.run_id, name)
            if found is not None:
                signal_id, payload = found
                self.emit(
                    EventKind.SIGNAL_RECEIVED, step_id, None, {"name": name, "signal_id": signal_id}
                )
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": payload})
                await self._consume_signal(signal_id)
                return _signal_data(codec, name, payload)
            now = await self.store.now()
            step = self.state.steps.get(step_id)
            if step is not None and step.waiting is not None:
                deadline = step.waiting.get("deadline")
            else:
                deadline = now + timeout_s if timeout_s is not None else None
                self.emit(
                    EventKind.STEP_WAITING,
                    step_id,
                    None,
                    {"reason": "signal", "name": name, "deadline": deadline},
                )
            if deadline is not None and now >= deadline:
                error = f"no signal {name!r} arrived within {timeout_s or 0:g}s"
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    None,
                    {"error": error, "error_type": "SignalTimeout"},
                )
                raise SignalTimeout(error)
            await self.waits.wait(str(WaitKey.signal(name)), deadline, now)

    async def _consume_signal(self, signal_id: int) -> None:
        await self._write(lambda events: self.store.consume_signal(self.lease, events, signal_id))

    async def child(
        self, wf: WorkflowDef, args: tuple[Any, ...], kwargs: dict[str, Any], queue: str | None
    ) -> Any:
        if self._held:
            await self.close_held()
        step_id, step = self.next_step(f"child:{wf.name}")
        done = await self.journaled_outcome(step)
        if done is not None:
            return wf.revive(done.output)
        self.check_stop()

        def new_child(child_id: str) -> NewRun:
            return NewRun(
                child_id,
                wf.name,
                wf.version,
                wf.bind(args, kwargs),
                # Its workflow's own queue (@app.workflow(queue=...)) before its parent's.
                queue=queue or wf.queue or self.record.queue,
                priority=self.record.priority,
                parent_run_id=self.run_id,
                parent_step_id=step_id,
                # A child does its parent's work: found by the same tags.
                tags=self.record.tags,
            )

        if step is None or step.status == "pending":
            # Never started, or started afresh by a retry of the run: a new child, whose id
            # carries the attempt so the failed one is not found again.
            attempt = step.attempt + 1 if step is not None else 1
            child_id = child_run_id(self.run_id, int(step_id.split(":", 1)[0]), attempt)
            new = new_child(child_id)
            self.emit(EventKind.STEP_STARTED, step_id, attempt, {"child_run_id": child_id})
            created = await self._write(
                lambda events: self.store.start_child(self.lease, events, new)
            )
            self._check_child(created.parent_run_id, child_id, step_id)
        else:
            # Journaled by an earlier drive; runs journaled before child ids carried "/"
            # named their child "<parent>-<ordinal>".
            child_id = step.child_run_id or f"{self.run_id}-{step.ordinal}"
            if step.child_run_id is not None and await self.store.get_run(child_id) is None:
                # Journaled as started, never created: branches starting children together
                # share a commit for their step_started events, each child is created by its
                # own, and the drive ended between them. The journal came first (invariant
                # 1), so create the child now, as a step in flight is run again.
                new = new_child(child_id)
                await self._write(lambda events: self.store.start_child(self.lease, events, new))
        while True:
            rec = await self.store.get_run(child_id)
            if rec is None:
                raise RatchetError(f"child run {child_id} of step {step_id} is missing")
            self._check_child(rec.parent_run_id, child_id, step_id)
            if rec.status == RunStatus.SUCCEEDED:
                self.emit(EventKind.STEP_COMPLETED, step_id, None, {"output": rec.output})
                return wf.revive(rec.output)
            if rec.status.terminal:
                error = f"child run {child_id} {rec.status}: {rec.error}"
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    None,
                    {"error": error, "error_type": "ChildRunFailed"},
                )
                raise ChildRunFailed(error)
            current = self.state.steps.get(step_id)
            if current is None or current.status != "waiting":
                self.emit(
                    EventKind.STEP_WAITING,
                    step_id,
                    None,
                    {"reason": "child", "child_run_id": child_id},
                )
            await self.waits.wait(str(WaitKey.child(child_id)))

    async def await_approval(
        self,
        step_id: str,
        step: StepState | None,
        name: str,
        data: Any,
        timeout_s: float | None,
    ) -> Decision:
        """Ask approval ``name`` at the position ``step_id`` (see
        :mod:`ratchet.engine.approvals`) and wait for the decision."""
        await self.close_held()
        done = await self.journaled_outcome(step)
        if done is not None:
            return Decision.from_dict(done.output)
        self.check_stop()
        if step is None or step.status == "pending" or step.waiting is None:
            # Not asked yet, or asked afresh after a retry of the run: a new attempt, whose row
            # replaces the expired one.
            attempt = step.attempt + 1 if step is not None else 1
            deadline = await self.store.now() + timeout_s if timeout_s is not None else None
            asked = {
                "reason": "approval",
                "name": name,
                "data": data,
                "timeout_s": timeout_s,
                "deadline": deadline,
            }
            self.emit(EventKind.STEP_WAITING, step_id, attempt, asked)
            await self._write(
                lambda events: self.store.ask_approval(
                    self.lease, events, step_id, attempt, name, data, deadline
                )
            )
        else:
            attempt = step.attempt
            deadline = step.waiting.get("deadline")
            timeout_s = step.waiting.get("timeout_s")
        while True:
            found = await self.store.get_approval(self.run_id, step_id)
            if found is None or found.attempt != attempt:
                raise RatchetError(
                    f"run {self.run_id}: approval {step_id} (attempt {attempt}) "
                    "is journaled as asked but has no row"
                )
            decision = found.decision
            if decision is not None:
                decided = {"name": name, **decision.as_dict()}
                if found.note is not None:
                    decided["note"] = found.note  # the name the client gave, beside the decider
                self.emit(EventKind.APPROVAL_DECIDED, step_id, attempt, decided)
                self.emit(
                    EventKind.STEP_COMPLETED, step_id, attempt, {"output": decision.as_dict()}
                )
                return decision
            if found.status == "expired":
                error = f"no decision on approval {name!r} arrived within {timeout_s or 0:g}s"
                self.emit(
                    EventKind.STEP_FAILED,
                    step_id,
                    attempt,
                    {"error": error, "error_type": ApprovalTimeout.__name__},
                )
                raise ApprovalTimeout(error)
            now = await self.store.now()
            if deadline is not None and now >= deadline:
                # Claimed in the database, so a decision racing the deadline either lands
                # first (and is taken) or is refused: never both a decision and a timeout.
                await self.store.expire_approval(self.lease, step_id, attempt)
                continue
            await self.waits.wait(str(WaitKey.approval(step_id)), deadline, now)

    def _check_child(self, parent: str | None, child_id: str, step_id: str) -> None:
        if parent != self.run_id:
            raise RatchetError(
                f"run {child_id} is not the child of run {self.run_id} started "
                f"by step {step_id} (its parent is {parent!r})"
            )


def _signal_data(codec: Codec | None, name: str, payload: Any) -> Any:
    """A signal's data as the type its workflow waits for. The journal keeps what was
    sent, so data that does not fit raises here on the first drive and on every replay."""
    if codec is None:
        return payload
    try:
        return codec.revive(payload)
    except Invalid as e:
        raise NotSerializable(
            f"the data of signal {name!r} does not fit {codec.name}: {e}"
        ) from None
