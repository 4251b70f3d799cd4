"""Pydantic AI on Ratchet: ``Agent(model, capabilities=[RatchetDurability()])``.

Inside a Ratchet workflow (outside any step) each model request of the agent is a journaled
step of kind ``llm`` and each tool call a step of kind ``tool``, so a crash mid-run resumes
at the last completed request or tool call and never sends a completed model request again.
Anywhere else the agent runs as it would without the capability.

Needs the ``pydantic-ai`` extra: ``pip install 'ratchet-engine[pydantic-ai]'``.
"""

from __future__ import annotations

from ratchet.extras import require

require("ratchet.integrations.pydantic_ai", "pydantic-ai")

from ratchet.integrations.pydantic_ai.capability import RatchetDurability  # noqa: E402
from ratchet.integrations.pydantic_ai.errors import as_ratchet_error  # noqa: E402

__all__ = ["RatchetDurability", "as_ratchet_error"]
