"""Forking a run from one of its steps, resuming a cancelled run, and diffing two runs.

A fork is a new run of the same workflow whose journal starts with copies of the source
run's completed steps before the fork point (``at``): a drive of the fork replays them
(invariant 3 in docs/concepts/invariants.md), so they cost nothing, no model call, no
tool, no delivery, and it runs from the fork point on. ``edit`` replaces the output of
the fork point or of a copied step; an edited fork point is journaled completed, so the
fork goes on after it with the edited value. The source is only read, and the fork is
written in one transaction (:func:`ratchet.store.forks.create_fork`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from ratchet.app.base import UNSET, AppBase
from ratchet.engine.definitions import check_name, to_json
from ratchet.errors import (
    InvalidInput,
    JournalPruned,
    UnknownRun,
    UnknownStep,
    UnknownWorkflow,
)
from ratchet.model import (
    Event,
    NewRun,
    RunDiff,
    RunRecord,
    StepState,
    StepStatus,
    diff_states,
    fold,
    split_step_id,
)
from ratchet.names import MAX_DECIDER, MAX_STEP, check_length
from ratchet.store import Store, tenants
from ratchet.store.forks import fork_journal


def _check_step_id(step_id: Any, what: str) -> str:
    if not isinstance(step_id, str) or not step_id:
        raise InvalidInput(f"invalid {what} {step_id!r}: expected a step id such as '3:summarize'")
    check_length(check_name(step_id, what), what, MAX_STEP)
    try:
        split_step_id(step_id)
    except ValueError:
        raise InvalidInput(
            f"invalid {what} {step_id!r}: a step id is its position and name, such as '3:summarize'"
        ) from None
    return step_id


class Forking(AppBase):
    """The fork, resume and diff calls of :class:`ratchet.Ratchet`."""

    async def fork_async(
        self,
        run_id: str,
        at: str,
        *,
        input: Any = UNSET,
        edit: Mapping[str, Any] | None = None,
        by: str | None = None,
    ) -> str:
        """Fork run ``run_id`` at its step ``at`` (a step id, ``"3:summarize"``) and return
        the new run's id; a worker drives it like any run.

        The fork's journal starts with copies of the source's completed steps before
        ``at`` (steps in flight are not copied): they replay at no cost, and the fork runs
        from ``at`` on. ``edit={STEP_ID: output}`` replaces the output of ``at`` itself
        (journaled completed: the fork goes on after it with that value) or of a copied
        step. ``input`` gives the fork other arguments (a code workflow's by name, a
        graph's one value); by default the source's. ``by``: who forked it, journaled.
        The fork keeps the source's tenant, queue, tags and guard overrides, and its copied
        model calls count toward its budgets; ``app.get(fork).forked_from`` and
        ``.forked_at`` name its source. The source is never changed.

        Refused, with nothing written: an unknown run (:class:`UnknownRun`), a step not in
        the run (:class:`UnknownStep`), an edit of a step after ``at``, input that does
        not fit, a run whose workflow (at its version) this app does not know."""
        return (await self.fork_run_async(run_id, at, input=input, edit=edit, by=by)).run_id

    async def fork_run_async(
        self,
        run_id: str,
        at: str,
        *,
        input: Any = UNSET,
        edit: Mapping[str, Any] | None = None,
        by: str | None = None,
        strict: bool = False,
    ) -> RunRecord:
        """:meth:`fork_async` for callers that need the fork's record. ``strict``: the
        input came as JSON (the HTTP API, the CLI) and is checked as a start's is."""
        check_name(run_id, "run id")
        at = _check_step_id(at, "fork point (at)")
        if by is not None:
            check_length(check_name(by, "forked by (by)"), "forked by (by)", MAX_DECIDER)
        if edit is not None and not isinstance(edit, Mapping):
            raise InvalidInput(f"edit must map step ids to outputs, got {type(edit).__name__}")
        store = await self._astore()
        source = await store.get_run(run_id)
        if source is None:
            raise UnknownRun(f"unknown run id {run_id!r}")
        try:
            await self._check_forkable(store, source)
        except UnknownWorkflow as e:
            e.field = "workflow"
            raise
        events = await store.load_events(run_id)
        if not events:
            raise JournalPruned(f"run {run_id}'s journal was pruned: there is nothing to fork")
        state = fold(run_id, events)
        point = state.steps.get(at)
        if point is None:
            raise UnknownStep(_no_step(run_id, at, state.steps))
        try:
            edits = _check_edits(run_id, point, dict(edit or {}), state.steps)
        except InvalidInput as e:
            e.field = "edit"
            raise
        data = (
            source.input if input is UNSET else await self._fork_input(store, source, input, strict)
        )
        copied = {
            sid: s
            for sid, s in state.steps.items()
            if s.ordinal < point.ordinal and s.status == StepStatus.COMPLETED and sid not in edits
        }
        new = NewRun(
            tenants.scoped_id(source.tenant_id, uuid.uuid4().hex),
            source.workflow,
            source.workflow_version,
            data,
            source.queue,
            source.priority,
            tenant_id=source.tenant_id,
            guards=state.guards,
            tags=dict(source.tags),
            concurrency_key=source.concurrency_key,
            forked_from=source.run_id,
            forked_at=at,
        )
        return await store.create_fork(new, fork_journal(new, events, copied, edits, by))

    async def _check_forkable(self, store: Store, source: RunRecord) -> None:
        """A fork replays the source's journal under the workflow's code: refuse a run
        whose workflow, at the source's version, this app cannot drive."""
        if source.workflow in self.workflows:
            if self.workflows.version_of(source.workflow, source.workflow_version):
                return
            have = [wd.version for wd in self.workflows.versions(source.workflow)]
            raise UnknownWorkflow(
                f"cannot fork run {source.run_id}: it ran workflow {source.workflow!r} "
                f"version {source.workflow_version}, and this app has version "
                f"{', '.join(have)}"
            )
        if await store.get_graph(source.workflow, source.workflow_version) is None:
            raise UnknownWorkflow(
                f"cannot fork run {source.run_id}: its workflow {source.workflow!r} "
                f"(version {source.workflow_version}) is neither a code workflow of this "
                "app nor a registered graph"
            )

    async def _fork_input(self, store: Store, source: RunRecord, given: Any, strict: bool) -> Any:
        """The fork's stored input from ``given``, checked as a start checks it."""
        wd = self.workflows.version_of(source.workflow, source.workflow_version)
        try:
            if wd is not None:
                if isinstance(given, Mapping):
                    if strict:
                        wd.check_json(dict(given))
                    return wd.bind((), dict(given))
                if isinstance(given, list | tuple) and not strict:
                    return wd.bind(tuple(given), {})
                example = json.dumps(dict.fromkeys(wd.signature.parameters, "..."))
                raise InvalidInput(
                    f"the input of a fork of workflow {source.workflow} is its arguments by "
                    f"name, a mapping such as {example}"
                )
            from ratchet.graphs.schema_check import schema_errors

            graph = await store.get_graph(source.workflow, source.workflow_version)
            assert graph is not None  # _check_forkable found it
            value = json.loads(to_json(given, f"the input of graph {source.workflow}"))
            problems = schema_errors(graph.definition.get("inputs") or {"type": "object"}, value)
            if problems:
                raise InvalidInput(
                    f"invalid input for graph {source.workflow}: " + "; ".join(problems)
                )
            return {"args": [value], "kwargs": {}}
        except InvalidInput as e:
            e.field = e.field or "input"
            raise

    async def resume_async(self, run_id: str, *, by: str | None = None) -> str:
        """Queue the cancelled run ``run_id`` again, under its own id: it goes on from its
        last completed step (a step in flight when it was cancelled runs again under the
        same idempotency key). ``by``, who resumed it, is journaled in its ``run_queued``
        (reason ``resume``). Any other status is :class:`NotCancelled`; nothing is
        written. Children cancelled with it stay cancelled: a step that waited for one
        gets its end."""
        check_name(run_id, "run id")
        if by is not None:
            check_length(check_name(by, "resumed by (by)"), "resumed by (by)", MAX_DECIDER)
        return (await (await self._astore()).resume(run_id, by)).run_id

    async def diff_async(self, a: str, b: str) -> RunDiff:
        """Runs ``a`` and ``b`` step by step (matched by step id): each step ``same``,
        ``changed`` (outputs differ, or one failed), ``only_a`` or ``only_b``, with both
        sides' status, output, tokens, cost and duration."""
        check_name(a, "run id")
        check_name(b, "run id")
        store = await self._astore()
        states = []
        for run_id in (a, b):
            if await store.get_run(run_id) is None:
                raise UnknownRun(f"unknown run id {run_id!r}")
            events: list[Event] = await store.load_events(run_id)
            if not events:
                raise JournalPruned(f"run {run_id}'s journal was pruned: nothing to compare")
            states.append(fold(run_id, events))
        return diff_states(states[0], states[1])


def _no_step(run_id: str, at: str, steps: Mapping[str, StepState]) -> str:
    known = ", ".join(list(steps)[:20]) or "none"
    more = f" (and {len(steps) - 20} more)" if len(steps) > 20 else ""
    return f"run {run_id} has no step {at!r}; its steps: {known}{more}"


def _check_edits(
    run_id: str, point: StepState, edit: dict[str, Any], steps: Mapping[str, StepState]
) -> dict[str, Any]:
    """The edits as JSON values, each of a step of the run at or before the fork point."""
    out: dict[str, Any] = {}
    for sid, value in edit.items():
        _check_step_id(sid, "edited step")
        step = steps.get(sid)
        if step is None:
            raise UnknownStep(_no_step(run_id, sid, steps))
        if step.ordinal > point.ordinal:
            raise InvalidInput(
                f"cannot edit step {sid!r}: it comes after the fork point {point.step_id!r}, "
                "and a fork runs every step after it afresh"
            )
        out[sid] = json.loads(to_json(value, f"the edited output of step {sid}"))
    return out
