"""Replay: what the journal holds for each step the workflow calls again.

A drive re-executes the workflow from the top; each step call takes the next position
(ordinal) and asks the journal what it holds there. A journaled step of another name at a
position means the code changed under the run (non-determinism: fail, never guess). A step
with a journaled outcome (completed or failed) hands that outcome back
(:meth:`Replay.journaled_outcome`, the one place that decides it) without running (invariant
3 of ``docs/concepts/invariants.md``), in the order the journal holds them, so parallel
branches take the same positions on every replay.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections.abc import Iterable
from typing import Any

from ratchet.engine.journal_writer import JournalWriter
from ratchet.errors import (
    ApprovalRejected,
    ApprovalTimeout,
    ChildRunFailed,
    NonDeterminismError,
    SignalTimeout,
    StepFailed,
)
from ratchet.model import ABANDONED, EventKind, StepState

# How long a replay waits for a step call the journal says came before an outcome, with
# no step called meanwhile, before it calls the code changed (see Replay.replayed).
REPLAY_STALL_S = 10.0

_REPLAYED_ERRORS: dict[str, type[BaseException]] = {
    "SignalTimeout": SignalTimeout,
    "ApprovalTimeout": ApprovalTimeout,
    "ChildRunFailed": ChildRunFailed,
    # A step its workflow abandoned (asyncio.wait_for, asyncio.timeout) times out again on
    # replay, so the workflow takes the path it took then.
    ABANDONED: TimeoutError,
}


class Replay(JournalWriter):
    """Step positions and the journal's outcomes for them."""

    def next_step(self, name: str) -> tuple[str, StepState | None]:
        """Allocate the next ordinal; return its step id and what the journal holds for it.
        A journaled step of another name at this position means the code changed under the
        run: never guess, fail."""
        self.ordinal += 1
        ordinal = self.ordinal
        if self._turns:
            self._hand_turns()
        step = self.state.by_ordinal.get(ordinal)
        if step is not None and step.name != name:
            raise NonDeterminismError(
                f"non-deterministic workflow {self.record.workflow} version "
                f"{self.record.workflow_version}: at step position {ordinal} the journal "
                f"holds step {step.step_id!r} ({step.status}) but the code now calls step "
                f"'{ordinal}:{name}'. The code changed under this run: keep the old path for "
                f"runs that took it (ratchet.patched), or register the change as a new version"
            )
        return f"{ordinal}:{name}", step

    def patched(self, name: str, deprecated: bool = False) -> bool:
        """Whether the run takes patch ``name``'s new path: True when the journal holds its
        marker, or when the run reaches this point first under code that has the patch
        (the marker is journaled then; it takes no step position, so the ids of later steps
        stay what they were); False when the journal already holds steps past this point
        and no marker (the run went past it the old way: nothing is journaled, and every
        later replay finds the same). One answer per patch for the whole drive.
        ``deprecated`` (``ratchet.deprecate_patch``): the code has only the new path; the
        marker is journaled alike, so a worker still running the ``patched`` code takes
        the new path too, and the answer is not used."""
        marked = self.state.patches.get(name)
        if marked is not None:
            return bool(marked.get("taken", True))
        if name in self._old_patches:
            return False
        if self.journal_ordinals > self.ordinal:
            self._old_patches.add(name)
            return False
        payload: dict[str, Any] = {"patch": name, "taken": True, "after": self.ordinal}
        if deprecated:
            payload["deprecated"] = True
        self.emit(EventKind.PATCH_MARKED, payload=payload)  # folded into state.patches
        return True

    def upcoming(self) -> StepState | None:
        """What the journal holds at the next step position, without taking it."""
        return self.state.by_ordinal.get(self.ordinal + 1)

    async def journaled_outcome(self, step: StepState | None) -> StepState | None:
        """The one answer to "has this step a journaled outcome?" for a step about to run
        or wait: None when it has none (run it now); else, once its turn has come
        (:meth:`replayed`), the step if it completed, and its error raised again if it
        failed. (:meth:`take_completed_groups` answers the same for steps taken in bulk,
        without waiting for a turn.)"""
        if step is None or step.status not in ("completed", "failed"):
            return None
        await self.replayed(step)
        if step.status == "failed":
            raise self.replayed_failure(step)
        return step

    def take_completed(self, name: str) -> StepState | None:
        """The next step, its ordinal taken, when the journal holds it as step ``name``
        completed and :meth:`run_step` would hand its output back at once (no guard's pause
        to ask again, no earlier step to wait for); else None, and nothing is taken. For
        callers that need only a finished step's output: they skip building its call. The
        caller reports the step to the guards (``guards.replayed_step``)."""
        taken = self.take_completed_groups((name,), 1)
        return taken[0] if taken else None

    def take_completed_groups(self, names: Iterable[str], size: int) -> list[StepState]:
        """:meth:`take_completed` for the steps ``names`` in a row, by groups of ``size``:
        the steps of every whole group up to the first one with a step not there to take
        (of which nothing is taken)."""
        get, paused_at = self.state.by_ordinal.get, self.state.paused_at
        first_seqs, called_before = self._first_seqs, self._called_before
        bisect_left = bisect.bisect_left
        ordinal = self.ordinal
        steps: list[StepState] = []
        append = steps.append  # a resume may take tens of thousands of steps here
        for name in names:
            ordinal += 1
            step = get(ordinal)
            if (
                step is None
                or step.name != name
                or step.status != "completed"
                or step.step_id in paused_at
                or ordinal < called_before[bisect_left(first_seqs, step.finished_seq)]
            ):
                break
            append(step)
        taken = len(steps) - len(steps) % size  # steps in whole groups
        del steps[taken:]
        self.ordinal += taken
        if self._turns:
            self._hand_turns()
        return steps

    def take_step(self, step_id: str) -> StepState | None:
        """Take the next ordinal for a step whose id the journal already holds (a guard's
        pause, named by its anomaly); return what the journal holds for it. Branches that
        replay in another order than they first ran take the same ordinals between them."""
        self.ordinal += 1
        if self._turns:
            self._hand_turns()
        return self.state.steps.get(step_id)

    async def replayed(self, step: StepState) -> None:
        """Wait, before a journaled outcome goes back to the workflow, until every step the
        journal holds as begun before that outcome has been called again.

        Parallel branches call their next step when their last one returns; a replay, which
        returns journaled outcomes at once, would otherwise let a branch call its next step
        before another branch called the step it called first, and the two would swap
        ordinals. Handing outcomes back in the journal's order makes the calls come in the
        order they first came. Sequential code never waits here. A call that never comes is
        code that changed under the run."""
        need = self._called_before[bisect.bisect_left(self._first_seqs, step.finished_seq)]
        if self.ordinal >= need:
            return
        turn: asyncio.Future[None] = self.loop.create_future()
        heapq.heappush(self._turns, (need, id(turn), turn))
        seen = self.ordinal
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(turn), REPLAY_STALL_S)
                return
            except TimeoutError:
                if self.ordinal == seen:
                    raise NonDeterminismError(
                        f"non-deterministic workflow {self.record.workflow} version "
                        f"{self.record.workflow_version}: the journal holds step "
                        f"{step.step_id!r} as finished after step position {need} was begun, "
                        f"but the code has called only {self.ordinal} steps and calls no more"
                    ) from None
                seen = self.ordinal

    def _hand_turns(self) -> None:
        while self._turns and self._turns[0][0] <= self.ordinal:
            turn = heapq.heappop(self._turns)[2]
            if not turn.done():
                turn.set_result(None)

    def check_complete_replay(self) -> None:
        """The workflow returned: the journal must not hold steps the code no longer calls."""
        if self.journal_ordinals > self.ordinal:
            extra = self.state.by_ordinal[self.ordinal + 1]
            raise NonDeterminismError(
                f"non-deterministic workflow {self.record.workflow} version "
                f"{self.record.workflow_version}: the journal holds step {extra.step_id!r} "
                f"({extra.status}) at position {extra.ordinal}, but the code now returns "
                f"after {self.ordinal} steps"
            )

    @staticmethod
    def replayed_failure(step: StepState) -> BaseException:
        if step.error_type == ApprovalRejected.__name__:
            return ApprovalRejected(step.step_id, step.error or "rejected")
        cls = _REPLAYED_ERRORS.get(step.error_type or "")
        if cls is not None:
            return cls(step.error or "")
        return StepFailed(step.step_id, step.error or "failed")
