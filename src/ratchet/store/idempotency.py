"""Starting a run twice under one run id: the same request again, or a conflict.

A start is idempotent on its run id. These checks compare the run found under the id with
the one asked for and name, field by field, what differs.
"""

from __future__ import annotations

from typing import Any

from ratchet.errors import BatchItemInvalid, RunIdConflict
from ratchet.model import NewRun, RunRecord, dumps

__all__ = ["check_in_batch", "check_repeat", "check_same_run"]


def _short(value: Any, limit: int = 60) -> str:
    text = dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_same_run(rec: RunRecord, new: NewRun, redact: bool = False) -> None:
    """An idempotent start found ``rec`` under ``new``'s id: the same request, or a
    conflict named field by field (a different workflow, input, queue, priority or tags).
    ``redact``: name the fields that differ but quote none of the stored values (the HTTP
    API, whose caller may not be allowed to read the run)."""
    if redact:
        fields = [
            name
            for name, same in (
                ("workflow", rec.workflow == new.workflow),
                ("input", dumps(rec.input) == dumps(new.input)),
                ("queue", rec.queue == new.queue),
                ("priority", rec.priority == new.priority),
                ("tags", rec.tags == new.tags),
            )
            if not same
        ]
        if fields:
            raise RunIdConflict(
                f"run id {rec.run_id!r} already exists with another "
                f"{', '.join(fields)}: use another run id"
            )
        return
    if rec.workflow != new.workflow:
        raise RunIdConflict(
            f"run id {rec.run_id!r} already belongs to workflow "
            f"{rec.workflow!r}, not {new.workflow!r}"
        )
    diffs = []
    if dumps(rec.input) != dumps(new.input):
        diffs.append(f"input {_short(rec.input)} (not {_short(new.input)})")
    if rec.queue != new.queue:
        diffs.append(f"queue {rec.queue!r} (not {new.queue!r})")
    if rec.priority != new.priority:
        diffs.append(f"priority {rec.priority} (not {new.priority})")
    if rec.tags != new.tags:
        diffs.append(f"tags {_short(rec.tags)} (not {_short(new.tags)})")
    if diffs:
        raise RunIdConflict(
            f"run id {rec.run_id!r} already exists with {'; '.join(diffs)}: use another run id"
        )


def check_in_batch(rec: RunRecord, new: NewRun, index: int, redact: bool = False) -> None:
    """:func:`check_same_run` for item ``index`` of a batch, and the same tenant too."""
    if rec.tenant_id != new.tenant_id:
        raise BatchItemInvalid(
            index, "run_id", f"run id {rec.run_id!r} is taken; choose another", taken=True
        )
    try:
        check_same_run(rec, new, redact)
    except RunIdConflict as e:
        raise BatchItemInvalid(index, "run_id", str(e)) from None


def check_repeat(earlier: NewRun, new: NewRun, j: int, i: int) -> None:
    """Item ``i`` of a batch repeats item ``j``'s run id: the same run, or a conflict."""
    same = (
        earlier.workflow,
        earlier.workflow_version,
        dumps(earlier.input),
        earlier.queue,
        earlier.priority,
        earlier.tenant_id,
        earlier.guards,
        earlier.tags,
    ) == (
        new.workflow,
        new.workflow_version,
        dumps(new.input),
        new.queue,
        new.priority,
        new.tenant_id,
        new.guards,
        new.tags,
    )
    if not same:
        raise BatchItemInvalid(
            i,
            "run_id",
            f"run id {new.run_id!r} repeats item {j} with a "
            "different workflow, input, queue, priority, guards or tags",
        )
