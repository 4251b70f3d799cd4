"""A drive's model requests: journaled content-addressed in each LLM step's
``step_started`` (the format: :mod:`ratchet.model.requests`), and checked against the
journal when a completed call is replayed.

What the drive knows of the run's requests (a :class:`~ratchet.model.requests.RequestIndex`)
is built the first time the drive makes a model call, never before: a run without model
calls pays nothing for it. A drive whose journal already holds model calls (a re-drive)
reads their requests back then, in one query.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ratchet.errors import NonDeterminismError
from ratchet.model import EventKind
from ratchet.model.requests import RequestIndex, describe, first_difference

if TYPE_CHECKING:
    from ratchet.engine.journal_writer import JournalWriter

WHOLE = False
"""Journal every request whole, each message in it again (the way content addressing
replaces): for measuring the difference only (``bench/journal_size.py``)."""

Request = tuple[list[Any], dict[str, Any]]


class DriveRequests:
    """One drive's model requests (see the module docstring)."""

    __slots__ = ("_drifted", "_index", "_lock", "_writer")

    def __init__(self, writer: JournalWriter) -> None:
        self._writer = writer
        self._index: RequestIndex | None = None
        self._lock: asyncio.Lock | None = None
        self._drifted: dict[str, str] = {}  # step id -> the drift journaled last

    async def index(self) -> RequestIndex:
        """What the run's journal holds of its requests, read back once per drive."""
        if self._index is not None:
            return self._index
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # parallel calls wait for the one read
            if self._index is None:
                self._index = await self._load()
        return self._index

    async def _load(self) -> RequestIndex:
        w = self._writer
        # Only a journal with model calls from before this drive has requests to read.
        if not any(
            s.kind == "llm" and s.first_seq <= w.journal_start for s in w.state.steps.values()
        ):
            return RequestIndex()
        index = RequestIndex()
        for kind, step_id, data in await w.store.load_requests(w.run_id):
            if kind == EventKind.STEP_STARTED:
                index.read(step_id, data)
            else:
                self._drifted[step_id] = str(data.get("message"))
        return index

    def entry(self, index: RequestIndex, step_id: str, request: Request) -> dict[str, Any]:
        """The ``request`` field of the step's ``step_started``, journaled now."""
        messages, params = request
        return index.entry(step_id, messages, params, whole=WHOLE)

    async def check_replayed(self, step_id: str, request: Request) -> None:
        """A completed model call is replayed: the request the code makes now must be the
        journaled one. One that differs raises :class:`NonDeterminismError` naming the step
        and the first difference, or, where the workflow opted in
        (``request_drift="warn"``), is journaled as ``request_drifted`` and the journaled
        answer goes back as usual. A step journaled without a request (an older run) and a
        step a fork copied from its source are not checked."""
        index = await self.index()
        journaled = index.lists.get(step_id)
        if journaled is None or step_id in index.copied:
            return
        messages, params = request
        difference = first_difference(
            journaled, index.params.get(step_id, {}), messages, params, index.excerpts
        )
        if difference is None:
            return
        w = self._writer
        message = (
            f"step {step_id!r}: the model request differs from the journaled one: "
            f"{describe(difference)}"
        )
        if w.request_drift == "warn":
            if self._drifted.get(step_id) != message:  # once per drift, not per drive
                self._drifted[step_id] = message
                w.journal(
                    EventKind.REQUEST_DRIFTED,
                    step_id,
                    None,
                    {"difference": difference, "message": message},
                )
            return
        raise NonDeterminismError(
            f"non-deterministic workflow {w.record.workflow}: {message} (a prompt changed "
            "under a running run; declare the workflow with request_drift='warn' to go on "
            "with the journaled answer and journal the difference)"
        )
