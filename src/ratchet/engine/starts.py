"""Batch starts: the items of :meth:`ratchet.Ratchet.start_many`, and the check that turns
each into the run to create, naming the item and the field at fault."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.start_options import Debounce
from ratchet.errors import BatchItemInvalid, InvalidInput
from ratchet.model.starts import StartPlan


class Start:
    """One run of a batch start: its workflow's arguments as in ``app.start`` and,
    optionally, its own ``run_id`` (idempotent), ``queue``, ``priority``, ``guards``,
    ``tags`` and ``concurrency_key`` (each defaulting to the batch's), and its own
    ``dedup_id``, ``debounce``, ``start_at`` or ``delay_s`` (as in ``app.start``; a batch
    has no default for these)."""

    __slots__ = (
        "args",
        "concurrency_key",
        "debounce",
        "dedup_id",
        "delay_s",
        "guards",
        "kwargs",
        "priority",
        "queue",
        "run_id",
        "start_at",
        "tags",
    )

    def __init__(
        self,
        *args: Any,
        run_id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        guards: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        dedup_id: str | None = None,
        debounce: Debounce | None = None,
        start_at: datetime | None = None,
        delay_s: float | None = None,
        concurrency_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.dedup_id = dedup_id
        self.debounce = debounce
        self.start_at = start_at
        self.delay_s = delay_s
        self.args = args
        self.concurrency_key = concurrency_key
        self.kwargs = kwargs
        self.run_id = run_id
        self.queue = queue
        self.priority = priority
        self.guards = guards
        self.tags = tags

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        parts += [
            f"{k}={getattr(self, k)!r}"
            for k in (
                "run_id",
                "queue",
                "priority",
                "guards",
                "tags",
                "concurrency_key",
                "dedup_id",
                "debounce",
                "start_at",
                "delay_s",
            )
            if getattr(self, k) is not None
        ]
        return f"Start({', '.join(parts)})"


def as_start(item: Any, index: int) -> Start:
    """An item of ``start_many``: a :class:`Start`, a mapping of keyword arguments, or a
    tuple of positional arguments."""
    if isinstance(item, Start):
        return item
    if isinstance(item, Mapping):
        if not all(isinstance(k, str) for k in item):
            raise BatchItemInvalid(index, "input", "keyword argument names must be strings")
        return Start(**item)
    if isinstance(item, tuple):
        return Start(*item)
    raise BatchItemInvalid(
        index,
        "input",
        f"expected a ratchet.Start, a mapping of keyword "
        f"arguments or a tuple of positional arguments, got {item!r}",
    )


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One run to start, as the caller gave it (checked by the app)."""

    workflow: WorkflowDef | str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    run_id: str | None = None
    queue: str | None = "default"  # None: the workflow's queue (@app.workflow(queue=...))
    priority: int = 0
    guards: Mapping[str, Any] | None = None
    tags: Mapping[str, str] | None = None
    # A dedup id, debounce or time to begin at, checked (ratchet.engine.start_options).
    plan: StartPlan | None = None
    # Its queue's per_key_concurrency counts the runs in flight sharing it.
    concurrency_key: str | None = None


@contextlib.contextmanager
def at_item(index: int) -> Iterator[None]:
    """An :class:`InvalidInput` raised inside, as item ``index``'s."""
    try:
        yield
    except BatchItemInvalid:
        raise
    except InvalidInput as e:
        raise BatchItemInvalid(index, e.field or "input", str(e)) from e
