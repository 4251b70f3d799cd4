"""Guards at work in a drive: each step boundary checks the run's guards
(:mod:`ratchet.engine.guards.policy`) against what the journal says of the run, and a guard that
trips journals ``anomaly_detected`` and applies its action.

Once per occurrence, whatever crashes and re-drives happen: every anomaly has a key naming
its occurrence (``excessive_steps``, ``runaway_loop:<first step of the streak>``,
``token_spike:<step>``...), the fold collects the keys journaled, and a key already in the
journal is never raised again. An anomaly is journaled in the same commit as the step
boundary it was found at (with the step's ``step_completed``, the next ``step_started``, the
approval that asks, or the run's failure), so it lands with the facts it was found from.
Facts that change with time (the medians of other runs, the clock) are only read for steps
that run now; a replayed step takes what the journal holds: a pause is asked again through
the approval step its anomaly names, which returns the journaled decision, so branches of a
gather that replay in another order than they tripped each get their own decision. A pause
waits at most ``pause_timeout_s``, then fails the run as ``fail`` would.

Limits (the budgets and ``max_steps``) are held, not noted once: a call over one is stopped
each time (``fail`` raises at every call over it, ``pause`` asks for each), and a retried
run keeps them, until a person moves one (a grant: approving the pause, or retrying the run
with one; journaled with who, folded into ``RunState.grants``). Their occurrences are
numbered (``budget_exceeded:tokens``, then ``budget_exceeded:tokens@2``...); ``record`` and
``fail`` journal one per limit until the next grant or retry (``RunState.limit_epoch``).
Budgets count calls in flight: each model call's worst case is reserved in its
``step_started`` (``reserve``) before it is sent and released by its outcome, so parallel
branches together stay within the budget, and a re-drive after a crash counts the calls that
were in flight from the journal alone (no query). A call whose outcome is unknown keeps its
reservation: the provider may have billed it.

The run's deadline (``timeout_s``, and ``budget_wall_s`` under ``fail``) is armed as a timer
on the drive and carried into every park as its wake-up time, so the run fails with
``RunTimeout`` at the deadline wherever it is (see ``GuardedDrive.arm_deadline``).

Costs on the hot path: a few comparisons per step, and the JSON form of a step's arguments
(the runaway-loop check) when ``runaway_repeats`` is on. The spike guards query the
database after LLM steps only, and once per :data:`HISTORY_TTL_S` per workflow (or when a run
of it finishes here, while its history is still short); the workflow-wide retry-storm guard
after retries only.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ratchet.engine import approvals
from ratchet.engine.control import Stopped, StopReason
from ratchet.engine.definitions import StepDef
from ratchet.engine.drive import Drive
from ratchet.engine.guards.evidence import HISTORIES, History, call_text, describe
from ratchet.engine.guards.policy import BUDGET, BUDGET_FIELDS, DEFAULT, Guards
from ratchet.engine.guards.streak import Streak
from ratchet.engine.stats import STATS
from ratchet.errors import ApprovalTimeout, GuardTripped
from ratchet.model import AnomalyKind, Decision, EventKind, GuardAction

if TYPE_CHECKING:
    from ratchet.engine.drive_store import DriveStore
    from ratchet.model import Event, StepState

log = logging.getLogger("ratchet.guards")

# How long a workflow's run history (for the spike medians) is reused before it is read
# again: the medians of the last 50 runs hardly move in that time.
HISTORY_TTL_S = 30.0
# A workflow-wide retry storm is counted per minute.
STORM_WINDOW_S = 60.0
# The approval a pause asks: "guard:<kind>".
PAUSE_PREFIX = "guard:"


class GuardedDrive(Drive, Protocol):
    """What the guards use of a drive beyond the :class:`Drive` verbs: its store (for the
    workflow's history), the journal's own ``emit``, the position of a pause journaled
    earlier (``take_step``), and the timer of the run's deadline."""

    @property
    def store(self) -> DriveStore: ...

    def emit(
        self,
        kind: str,
        step_id: str | None = None,
        attempt: int | None = None,
        payload: dict[str, Any] | None = None,
        payload_json: str | None = None,
    ) -> Event: ...

    def take_step(self, step_id: str) -> StepState | None: ...

    def arm_deadline(self) -> None: ...


class RunGuards:
    """One drive's guards."""

    def __init__(self, ctx: GuardedDrive, guards: Guards = DEFAULT) -> None:
        self.ctx = ctx
        self.g = guards
        self._configured = guards  # the workflow's guards and the run's overrides
        # When the run must end (time.time()), and the field that says so.
        self.deadline: tuple[float, str] | None = None
        self.streak = Streak()  # the runaway-loop streak

    def configure(self, guards: Guards, overrides: Mapping[str, Any] | None) -> None:
        """Apply the workflow's guards, the run's journaled overrides and the limits people
        granted it, and arm its deadline (a drive past it stops at once)."""
        self._configured = guards.override(overrides)
        self._regrant()
        self.ctx.arm_deadline()

    def _regrant(self) -> None:
        grants = self.ctx.state.grants
        self.g = self._configured.override(grants) if grants else self._configured
        self.deadline = self._deadline()

    def _deadline(self) -> tuple[float, str] | None:
        started, g = self.ctx.state.started_at, self.g
        if started is None:
            return None
        found = []
        if g.timeout_s is not None:
            found.append((started + g.timeout_s, "timeout_s"))
        if g.budget_wall_s is not None and g.action(BUDGET) == GuardAction.FAIL:
            found.append((started + g.budget_wall_s, "budget_wall_s"))
        return min(found) if found else None

    def due(self) -> tuple[float, str] | None:
        """When the run must end (``time.time()``) and the guard field that says so, or
        None: for a host that judges the guards of a drive it does not run (an isolated
        run's sandbox), and arms the deadline itself."""
        return self._deadline()

    def timed_out(self, due: tuple[float, str] | None = None) -> str:
        """The run's error at its deadline (this drive's, or ``due``); a ``budget_wall_s``
        deadline journals its anomaly (once) too."""
        due = due or self.deadline
        assert due is not None
        at, field = due
        started = self.ctx.state.started_at or at
        limit = getattr(self.g, field)
        if field == "budget_wall_s":
            self._journal_limit(
                BUDGET,
                f"{BUDGET}:wall_s",
                None,
                {
                    "budget": "wall_s",
                    "used": round(time.time() - started, 3),
                    "limit": limit,
                    "limit_field": field,
                },
                GuardAction.FAIL,
            )
        return (
            f"RunTimeout: run {self.ctx.run_id} passed its deadline ({field} "
            f"{limit:g}s from its first start)"
        )

    # -- tripping ------------------------------------------------------------------------

    async def trip(
        self,
        kind: str,
        key: str,
        step_id: str | None,
        evidence: dict[str, Any],
        action: str | None = None,
    ) -> None:
        """Journal anomaly ``key`` (unless the journal has it) and apply its action."""
        ctx = self.ctx
        if key in ctx.state.anomalies:
            return
        action = action or self.g.action(kind)
        payload = {"kind": kind, "key": key, "action": action, **evidence}
        if action == GuardAction.PAUSE:
            # The approval that asks is named in the anomaly: branches of a gather may trip
            # in any order, and a replay must hand each decision back to its own anomaly.
            payload["approval_step_id"], _ = ctx.next_step(
                approvals.STEP_PREFIX + PAUSE_PREFIX + kind
            )
        ctx.emit(EventKind.ANOMALY_DETECTED, step_id, None, payload)
        STATS.anomaly(kind)
        log.warning(
            "action=anomaly_detected run_id=%s kind=%s key=%s guard_action=%s",
            ctx.run_id,
            kind,
            key,
            action,
        )
        await self._act(payload, fresh=True)

    def _journal_limit(
        self, kind: str, limit: str, step_id: str | None, evidence: dict[str, Any], action: str
    ) -> dict[str, Any] | None:
        """Journal the next occurrence of ``limit`` crossed (the payload), or None when
        ``record`` or ``fail`` journaled it already since the last grant or retry."""
        state = self.ctx.state
        count, epoch = state.limit_trips.get(limit, (0, -1))
        if action != GuardAction.PAUSE and count and epoch == state.limit_epoch:
            return None
        n = count + 1
        key = limit if n == 1 else f"{limit}@{n}"
        while key in state.anomalies:  # journaled before limits numbered their trips
            n += 1
            key = f"{limit}@{n}"
        payload = {"kind": kind, "key": key, "action": action, **evidence, "limit_key": limit}
        if action == GuardAction.PAUSE:
            payload["approval_step_id"], _ = self.ctx.next_step(
                approvals.STEP_PREFIX + PAUSE_PREFIX + kind
            )
        self.ctx.emit(EventKind.ANOMALY_DETECTED, step_id, None, payload)
        STATS.anomaly(kind)
        log.warning(
            "action=anomaly_detected run_id=%s kind=%s key=%s guard_action=%s",
            self.ctx.run_id,
            kind,
            key,
            action,
        )
        return payload

    async def _limit(self, kind: str, limit: str, step_id: str, evidence: dict[str, Any]) -> bool:
        """``limit`` would be crossed by this step: journal it and apply its action. True
        when a person approved going over (the limits moved: check again)."""
        action = self.g.action(kind)
        payload = self._journal_limit(kind, limit, step_id, evidence, action)
        if payload is None:
            if action == GuardAction.FAIL:  # stopped already; every call over it is stopped too
                what = describe({"kind": kind, **evidence})
                raise GuardTripped(kind, f"guard {kind}: {what}")
            return False
        await self._act(payload, fresh=True)
        return action == GuardAction.PAUSE

    async def _act(self, payload: dict[str, Any], fresh: bool) -> None:
        kind, action = payload["kind"], payload["action"]
        what = describe(payload)
        if action == GuardAction.FAIL:
            raise GuardTripped(kind, f"guard {kind}: {what}")
        if action == GuardAction.PAUSE:
            try:
                decision = await self._ask(payload, fresh)
            except ApprovalTimeout as e:  # past pause_timeout_s: the fallback is fail
                raise GuardTripped(kind, f"guard {kind} ({payload['key']}): {what}; {e}") from None
            if not decision.approved:
                comment = f": {decision.comment}" if decision.comment else ""
                raise GuardTripped(
                    kind,
                    f"guard {kind} ({payload['key']}): {what}; "
                    f"{decision.by} declined to continue{comment}",
                )
            if decision.grant is not None:  # folded into the state as it was journaled
                self._regrant()
                self.ctx.arm_deadline()  # a grant may have moved the deadline

    def _ask(self, payload: dict[str, Any], fresh: bool) -> Coroutine[Any, Any, Decision]:
        """The approval "continue?" of a pause: the one its anomaly names, else (a journal
        written before anomalies named their approval) the workflow's next step."""
        ctx, name = self.ctx, PAUSE_PREFIX + payload["kind"]
        question = {"question": "continue?", "anomaly": payload}
        timeout_s = self.g.pause_timeout_s
        ask_id = payload.get("approval_step_id")
        if ask_id is None:
            return approvals.approval(ctx, name, question, timeout_s)
        # A replay takes up the ordinal the pause took, whichever branch took it first.
        step = ctx.take_step(ask_id) if not fresh else ctx.state.steps.get(ask_id)
        return ctx.await_approval(ask_id, step, name, question, timeout_s)

    async def replay_pauses(self, step_id: str) -> None:
        """Ask again the pauses journaled at this step: each approval step returns its
        journaled decision (or waits on, if none came yet)."""
        for payload in self.ctx.state.paused_at.get(step_id, ()):
            await self._act(payload, fresh=False)

    # -- step boundaries -----------------------------------------------------------------

    async def before_attempt(
        self, sd: StepDef, step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Before an attempt of a step runs: the deadline, the step count, the wall time
        and, before an LLM call, the token and money budgets with the call's worst case
        plus that of every call in flight. Returns what the call reserves (its worst case,
        for its ``step_started``), or None. Nothing here awaits unless a limit trips, so
        the check and the ``step_started`` that reserves are one step of the event loop:
        parallel branches cannot both pass on the same room."""
        state = self.ctx.state
        if self.deadline is not None and time.time() >= self.deadline[0]:
            raise Stopped(StopReason.TIMEOUT)
        count = len(state.steps) + (step_id not in state.steps)
        while (limit := self.g.max_steps) is not None and count > limit:
            if not await self._limit(
                AnomalyKind.EXCESSIVE_STEPS,
                "excessive_steps",
                step_id,
                {"steps": count, "max_steps": limit},
            ):
                break
        while (limit := self.g.budget_steps) is not None and count > limit:
            if not await self._over("steps", step_id, count, limit, count):
                break
        # Under fail, the wall-time budget is the run's deadline (checked above, and armed).
        while (
            (wall := self.g.budget_wall_s) is not None
            and state.started_at is not None
            and self.g.action(BUDGET) != GuardAction.FAIL
        ):
            elapsed = round(time.time() - state.started_at, 3)
            if elapsed <= wall or not await self._over("wall_s", step_id, elapsed, wall, elapsed):
                break
        g = self.g
        if sd.worst_case is None or (g.budget_tokens is None and g.budget_usd is None):
            return None
        tokens, usd = sd.worst_case(args, kwargs)
        while await self._spend_over(step_id, tokens, usd):
            pass  # a person approved going over: the limits moved, check again
        return {"tokens": tokens} if usd is None else {"tokens": tokens, "usd": usd}

    async def _spend_over(self, step_id: str, tokens: int, usd: float | None) -> bool:
        """Check the call's worst case, with the calls in flight, against the token and
        money budgets; True when one tripped and a person approved going over."""
        g, spent = self.g, self.ctx.state.llm
        held_tokens, held_usd = self._in_flight(step_id)
        need = spent.tokens + held_tokens + tokens
        if (
            g.budget_tokens is not None
            and need > g.budget_tokens
            and await self._over(
                "tokens",
                step_id,
                spent.tokens,
                g.budget_tokens,
                need,
                worst_case=tokens,
                in_flight=held_tokens,
            )
        ):
            return True
        if usd is None or g.budget_usd is None:
            return False
        cost = spent.cost_usd + held_usd + usd
        return cost > g.budget_usd and await self._over(
            "usd",
            step_id,
            round(spent.cost_usd, 6),
            g.budget_usd,
            round(cost, 6),
            worst_case=round(usd, 6),
            in_flight=round(held_usd, 6),
        )

    def nested_call(
        self, step_id: str, tokens: int, usd: float | None, held_tokens: int, held_usd: float
    ) -> None:
        """A model call inside step ``step_id`` (:mod:`ratchet.engine.nested_spend`), whose
        worst case is ``tokens``/``usd``, with ``held_*`` for the other calls inside steps
        of this drive: check it, with the journal's spend and reservations, against the
        token and money budgets. Over one, ``record`` journals it (once) and lets the call
        go; ``fail`` and ``pause`` (a step cannot wait for a person) raise
        :class:`GuardTripped`. Nothing here awaits: the check and the hold are one step of
        the event loop, so parallel steps cannot both pass on the same room."""
        g, spent = self.g, self.ctx.state.llm
        journaled_tokens, journaled_usd = self._in_flight(step_id)
        checks: list[tuple[str, float, float, float, float]] = []
        if g.budget_tokens is not None:
            held = journaled_tokens + held_tokens
            checks.append(("tokens", spent.tokens, g.budget_tokens, held, tokens))
        if usd is not None and g.budget_usd is not None:
            in_flight_usd = round(journaled_usd + held_usd, 6)
            used = round(spent.cost_usd, 6)
            checks.append(("usd", used, g.budget_usd, in_flight_usd, round(usd, 6)))
        for budget, used, limit, in_flight, worst in checks:
            needed = used + in_flight + worst
            if budget == "usd":
                needed = round(needed, 6)
            if needed <= limit:
                continue
            action = "record" if g.action(BUDGET) == "record" else "fail"
            evidence: dict[str, Any] = {"budget": budget, "used": used, "limit": limit}
            evidence["worst_case"] = worst
            if in_flight:
                evidence["in_flight"] = in_flight
            evidence.update(needed=needed, limit_field=BUDGET_FIELDS[budget], in_step=True)
            self._journal_limit(BUDGET, f"{BUDGET}:{budget}", step_id, evidence, action)
            if action == "fail":
                what = describe({"kind": BUDGET, **evidence})
                raise GuardTripped(BUDGET, f"guard {BUDGET}: {what}")

    def _in_flight(self, step_id: str) -> tuple[int, float]:
        """What the calls in flight other than ``step_id`` (whose attempt this replaces)
        hold reserved: tokens and USD."""
        tokens, usd = 0, 0.0
        for other, held in self.ctx.state.reserved.items():
            if other != step_id:
                tokens += int(held.get("tokens") or 0)
                usd += float(held.get("usd") or 0.0)
        return tokens, usd

    async def _over(
        self,
        budget: str,
        step_id: str,
        used: float,
        limit: float,
        needed: float,
        worst_case: float | None = None,
        in_flight: float | None = None,
    ) -> bool:
        """A budget would be crossed; True when a person approved going over."""
        evidence: dict[str, Any] = {"budget": budget, "used": used, "limit": limit}
        if worst_case is not None:
            evidence["worst_case"] = worst_case
        if in_flight:
            evidence["in_flight"] = in_flight
        evidence.update(needed=needed, limit_field=BUDGET_FIELDS[budget])
        return await self._limit(BUDGET, f"{BUDGET}:{budget}", step_id, evidence)

    async def after_step(
        self,
        sd: StepDef,
        step_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        meta: dict[str, Any] | None,
        fresh: bool,
    ) -> None:
        """After a step completed (``fresh``) or was replayed: the runaway-loop streak and,
        for an LLM call that ran now, the token and cost spikes. A replayed step only
        counts in the streak: what it tripped was committed with it, and is in the journal."""
        if self.g.runaway_repeats is not None:
            await self._streak_check(sd.name, step_id, args, kwargs, output, fresh)
        if fresh and meta is not None and self.g.spike_factor is not None:
            await self._spikes(step_id, meta)

    def replayed_step(
        self,
        name: str,
        step_id: str,
        output: Any,
        call: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> None:
        """What :meth:`after_step` does for a replayed step, with its arguments built by
        ``call`` only when the streak is next looked at, and only for the last
        ``runaway_repeats`` replayed steps: a replay of many steps builds a few arguments,
        and the streak comes out as it would have (a streak at least ``runaway_repeats``
        long never trips again, however much longer it is)."""
        limit = self.g.runaway_repeats
        if limit is not None:
            self.streak.defer(limit, name, step_id, output, call)

    async def _streak_check(
        self,
        name: str,
        step_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        fresh: bool,
    ) -> None:
        streak = self.streak
        streak.settle()
        try:
            called = call_text(args, kwargs)
        except (TypeError, ValueError):
            streak.reset()  # arguments that are not data: no streak
            return
        streak.count(name, step_id, called, output)
        limit = self.g.runaway_repeats
        if fresh and limit is not None and streak.length == limit:
            digest = hashlib.sha256(called.encode()).hexdigest()[:16]
            await self.trip(
                AnomalyKind.RUNAWAY_LOOP,
                f"runaway_loop:{streak.first_step_id}",
                step_id,
                {
                    "step": name,
                    "repeats": limit,
                    "first_step_id": streak.first_step_id,
                    "arguments_sha256": digest,
                },
            )

    async def _spikes(self, step_id: str, meta: dict[str, Any]) -> None:
        g = self.g
        assert g.spike_factor is not None
        history = await self._history()
        usage = meta.get("usage") or {}
        tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
        samples = history.step_tokens.get(step_id, [])
        if len(samples) >= g.spike_history:
            median = statistics.median(samples)
            if median > 0 and tokens > g.spike_factor * median:
                await self.trip(
                    AnomalyKind.TOKEN_SPIKE,
                    f"token_spike:{step_id}",
                    step_id,
                    {
                        "tokens": tokens,
                        "median": median,
                        "factor": g.spike_factor,
                        "runs": len(samples),
                    },
                )
        if len(history.run_costs) >= g.spike_history:
            median = statistics.median(history.run_costs)
            cost = self.ctx.state.llm.cost_usd
            if median > 0 and cost > g.spike_factor * median:
                await self.trip(
                    AnomalyKind.COST_SPIKE,
                    "cost_spike",
                    step_id,
                    {
                        "cost_usd": round(cost, 6),
                        "median": median,
                        "factor": g.spike_factor,
                        "runs": len(history.run_costs),
                    },
                )

    async def _history(self) -> History:
        store = self.ctx.store.raw
        cache = HISTORIES.setdefault(store, {})
        key = (self.ctx.record.workflow, self.g.spike_history)
        cached = cache.get(key)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1]
        history = History(
            await self.ctx.store.llm_history(self.ctx.record.workflow, self.g.spike_history)
        )
        # A short history (fewer than M finished runs) trips nothing, and only a run of the
        # workflow finishing can lengthen it: one finished here drops it from the cache at
        # once (run_finished), one finished by another process counts within the TTL. So
        # an LLM call does not read the database every time while the history is short.
        cache[key] = (now + HISTORY_TTL_S, history)
        return history

    def run_finished(self) -> None:
        """The run ended succeeded or failed (a run the spike medians count): the workflow's
        short histories no longer hold, read them again at the next LLM step."""
        cache = HISTORIES.get(self.ctx.store.raw)
        if not cache:
            return
        workflow = self.ctx.record.workflow
        for key in [
            k for k, (_, h) in cache.items() if k[0] == workflow and len(h.run_costs) < k[1]
        ]:
            del cache[key]

    async def after_retry(self, step_id: str) -> None:
        """A step's attempt failed and will be retried (its step_retrying is emitted)."""
        g, ctx = self.g, self.ctx
        if g.retry_storm_run is not None:
            since = time.time() - g.retry_window_s
            recent = sum(1 for at in ctx.state.retried_at if at >= since)
            if recent > g.retry_storm_run:
                await self.trip(
                    AnomalyKind.RETRY_STORM,
                    "retry_storm:run",
                    step_id,
                    {
                        "scope": "run",
                        "retries": recent,
                        "limit": g.retry_storm_run,
                        "window_s": g.retry_window_s,
                    },
                )
        if g.retry_storm_workflow is not None and "retry_storm:workflow" not in (
            ctx.state.anomalies
        ):
            # This retry is not committed yet: the database counts the others.
            recent = await ctx.store.recent_retries(ctx.record.workflow, STORM_WINDOW_S) + 1
            if recent > g.retry_storm_workflow:
                await self.trip(
                    AnomalyKind.RETRY_STORM,
                    "retry_storm:workflow",
                    step_id,
                    {
                        "scope": "workflow",
                        "workflow": ctx.record.workflow,
                        "retries": recent,
                        "limit": g.retry_storm_workflow,
                        "window_s": STORM_WINDOW_S,
                    },
                )
