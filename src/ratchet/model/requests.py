"""Model requests in the journal: how an LLM step's ``step_started`` holds what it sent,
and how to read it back.

A conversation grows by a message or two a turn, so journaling each request whole would
grow the journal with the square of its length. Instead each distinct message is stored
once per run, content-addressed, and a request references earlier ones::

    "request": {
      "messages": {"from": <step id of an earlier LLM step, or null>, "keep": <int>,
                   "add": [<sha256 hex digest>, ...]},
      "bodies": {<digest>: <message as sent>, ...},
      "params": {<every other argument of the call: tools, temperature, ...>}
    }

The step's messages are the first ``keep`` messages of step ``from``'s, then the messages
whose digests ``add`` lists. ``bodies`` holds the messages whose digest no earlier
``step_started`` of the run journaled. A message's digest is the sha256 of its canonical
JSON (:func:`digest`).

:func:`requests_of` and :func:`request_of` read a journal back into whole requests;
:class:`RequestIndex` is what a writer keeps to journal the next request in that form.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ratchet.model.events import Event, dumps
from ratchet.model.states import EventKind

# How much of a message a drift report quotes.
EXCERPT_CHARS = 120


def canonical(value: Any) -> str:
    """The canonical JSON a message's digest is taken over: keys sorted, no spaces,
    non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(message: Any) -> str:
    """The sha256 (hex) of ``message``'s canonical JSON, UTF-8."""
    return hashlib.sha256(canonical(message).encode()).hexdigest()


def excerpt(message: Any, chars: int = EXCERPT_CHARS) -> str:
    """The start of ``message``'s canonical JSON, for people."""
    text = canonical(message)
    return text if len(text) <= chars else text[: chars - 1] + "…"


class _Node:
    """A node of the trie of journaled digest lists: the steps whose list passes through
    it, the latest first (two, so a step asking again can be pointed at another)."""

    __slots__ = ("children", "latest", "previous")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.latest: str | None = None
        self.previous: str | None = None


class RequestIndex:
    """What a run's journal holds of its model requests, for a writer: the digests it has
    journaled, each LLM step's digest list and params, and a trie of those lists, so the
    earlier request sharing the longest prefix with a new one is found in the new one's
    length."""

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.lists: dict[str, list[str]] = {}
        self.params: dict[str, dict[str, Any]] = {}
        # Short excerpts of the messages read back from the journal, by digest: what a
        # drift report quotes of the journaled side.
        self.excerpts: dict[str, str] = {}
        # Steps a fork copied from its source: taken as they were, never held to the
        # fork's code (a fork may change the input the requests were made from).
        self.copied: set[str] = set()
        self._root = _Node()

    @classmethod
    def of(cls, journaled: Iterable[tuple[str, Mapping[str, Any]]]) -> RequestIndex:
        """The index of the ``(step id, request)`` pairs a journal holds, in its order."""
        index = cls()
        for step_id, request in journaled:
            index.read(step_id, request)
        return index

    def read(self, step_id: str, request: Mapping[str, Any]) -> None:
        """Take in a journaled request (of a ``step_started`` of the run, in seq order)."""
        digests = resolve_digests(request, self.lists)
        if digests is None:
            return
        for key, body in (request.get("bodies") or {}).items():
            self.excerpts[key] = excerpt(body)
        if request.get("copied_from"):
            self.copied.add(step_id)
        self._record(step_id, digests, dict(request.get("params") or {}))

    def entry(
        self, step_id: str, messages: list[Any], params: dict[str, Any], *, whole: bool = False
    ) -> dict[str, Any]:
        """The ``request`` of step ``step_id``'s ``step_started``, recorded as journaled.
        ``messages`` and ``params`` are JSON values. ``whole``: every message in
        ``bodies`` and none referenced (the way this format replaces, for comparison)."""
        digests = [digest(m) for m in messages]
        source, keep = (None, 0) if whole else self._longest_prefix(step_id, digests)
        bodies: dict[str, Any] = {}
        for key, message in zip(digests, messages, strict=True):
            if (whole or key not in self.known) and key not in bodies:
                bodies[key] = message
        self._record(step_id, digests, params)
        return {
            "messages": {"from": source, "keep": keep, "add": digests[keep:]},
            "bodies": bodies,
            "params": params,
        }

    def _record(self, step_id: str, digests: list[str], params: dict[str, Any]) -> None:
        self.known.update(digests)
        self.lists[step_id] = digests
        self.params[step_id] = params
        node = self._root
        for key in digests:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node()
            node = child
            if node.latest != step_id:
                node.previous, node.latest = node.latest, step_id

    def _longest_prefix(self, step_id: str, digests: list[str]) -> tuple[str | None, int]:
        """The earlier step (never ``step_id`` itself) whose messages share the longest
        prefix with ``digests``, and that prefix's length; ``(None, 0)`` when none does."""
        path: list[_Node] = []
        node = self._root
        for key in digests:
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        for depth in range(len(path), 0, -1):
            here = path[depth - 1]
            for candidate in (here.latest, here.previous):
                if candidate is None or candidate == step_id:
                    continue
                # A step whose later request changed still tags the old path: check it.
                if self.lists.get(candidate, [])[:depth] == digests[:depth]:
                    return candidate, depth
        return None, 0


def resolve_digests(request: Mapping[str, Any], lists: Mapping[str, list[str]]) -> list[str] | None:
    """The whole digest list of a journaled ``request``, given the lists of the steps
    before it; None when the request is not in the journal's form."""
    refs = request.get("messages")
    if not isinstance(refs, Mapping):
        return None
    add = refs.get("add") or []
    keep = refs.get("keep") or 0
    source = refs.get("from")
    if not isinstance(add, list) or not isinstance(keep, int):
        return None
    head = lists.get(source, []) if isinstance(source, str) else []
    return [*head[:keep], *add]


def _llm_requests(events: Iterable[Event]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for ev in events:
        if ev.kind != EventKind.STEP_STARTED or ev.step_id is None:
            continue
        request = ev.payload.get("request")
        if isinstance(request, Mapping):
            yield ev.step_id, request


def requests_of(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """Each LLM step's request, resolved from a run's journal (its events in seq order):
    ``{step id: {"messages": [...every message...], **params}}``. A step started more than
    once (a retry, a re-drive) has the request of its latest ``step_started``. Steps
    journaled without a request (runs written before requests were journaled) are left
    out; a message whose body the journal lacks reads as ``None``."""
    lists: dict[str, list[str]] = {}
    bodies: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    for step_id, request in _llm_requests(events):
        digests = resolve_digests(request, lists)
        if digests is None:
            continue
        bodies.update(request.get("bodies") or {})
        lists[step_id] = digests
        params = request.get("params") or {}
        out[step_id] = {**params, "messages": [bodies.get(d) for d in digests]}
    return out


def request_of(events: Iterable[Event], step_id: str) -> dict[str, Any] | None:
    """The request of LLM step ``step_id`` (see :func:`requests_of`); None when the journal
    holds none for it."""
    return requests_of(events).get(step_id)


def first_difference(
    journaled: list[str],
    journaled_params: Mapping[str, Any],
    messages: list[Any],
    params: Mapping[str, Any],
    excerpts: Mapping[str, str],
) -> dict[str, Any] | None:
    """Where a request made now differs from the journaled one: the first differing
    message (``message``: its index, and excerpts of both sides) or else the first
    differing param (``param``: its name and both values); None when they are the same."""
    now = [digest(m) for m in messages]
    for i in range(max(len(now), len(journaled))):
        was = journaled[i] if i < len(journaled) else None
        is_ = now[i] if i < len(now) else None
        if was != is_:
            return {
                "message": i,
                "journaled": None if was is None else excerpts.get(was, f"sha256:{was[:12]}"),
                "now": None if is_ is None else excerpt(messages[i]),
            }
    for name in sorted(set(journaled_params) | set(params)):
        was_p, is_p = journaled_params.get(name), params.get(name)
        # Both as the journal writes them: the journaled side has been through it.
        if (name in journaled_params) != (name in params) or dumps(was_p) != dumps(is_p):
            return {
                "param": name,
                "journaled": None if name not in journaled_params else excerpt(was_p),
                "now": None if name not in params else excerpt(is_p),
            }
    return None


def describe(difference: Mapping[str, Any]) -> str:
    """A difference from :func:`first_difference`, in a sentence."""
    if "message" in difference:
        what = f"message {difference['message']}"
    else:
        what = f"param {difference['param']!r}"
    was, now = difference.get("journaled"), difference.get("now")
    return (
        f"{what} differs: the journal has "
        f"{'no such message' if was is None and 'message' in difference else was}, "
        f"the code now sends "
        f"{'none' if now is None else now}"
    )
