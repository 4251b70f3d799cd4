"""A dynamic toolset evaluated inside a workflow as often as outside: once per run step.

Outside a workflow a ``DynamicToolset`` (``@agent.toolset``, ``DynamicToolset(func)``)
calls its function once per run step, when the step lists its tools, and that step's tool
calls go to the toolset the function returned (entered once, left when the next step swaps
it). Pydantic AI's durable toolset has each unit (the tool listing, every tool call) call the
function again, since on engines that run units elsewhere nothing else can. Ratchet's steps
run in the workflow's own process, so the run holds one per-run copy of the toolset and
each step's units share its evaluation: the listing evaluates the function, the calls of the
same run step reuse what it returned. A re-drive that replays the listing evaluates it in
the first tool call that runs again, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.durable_exec._toolset import DurableDynamicToolset, RunHeldToolset
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset


@dataclass
class _OncePerRunStep(WrapperToolset[Any]):
    """A run's copy of a dynamic toolset, evaluated at most once per run step."""

    _step: int | None = field(default=None, init=False)

    async def for_run_step(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        if ctx.run_step != self._step:
            await self.wrapped.for_run_step(ctx)  # swaps the toolset in place
            self._step = ctx.run_step  # (a function that raised is tried again by a retry)
        return self


class StepHeldDynamicToolset(DurableDynamicToolset[Any]):
    """Pydantic AI's durable dynamic toolset whose run holds one evaluation per run step."""

    async def for_run(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        run_copy = await super().for_run(ctx)
        dynamic = self._dynamic_toolset
        if (
            isinstance(run_copy, DurableDynamicToolset)
            and run_copy._run_held is None
            and dynamic.per_run_step
            and dynamic.id is not None
        ):
            run_copy._run_held = RunHeldToolset(
                dynamic.id, _OncePerRunStep(await dynamic.for_run(ctx))
            )
        return run_copy


def holding_per_run_step(toolset: DurableDynamicToolset[Any]) -> DurableDynamicToolset[Any]:
    """``toolset`` (as Pydantic AI built it) as a :class:`StepHeldDynamicToolset`."""
    toolset.__class__ = StepHeldDynamicToolset
    return toolset
