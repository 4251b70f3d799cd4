"""The runaway-loop streak: how many times in a row a drive's steps came with the same
name, arguments and output, counted from the journal as the drive goes.

A replayed step's arguments are built only when the streak is next looked at, and only
for the last ``runaway_repeats`` replayed steps: a replay of many steps builds a few
arguments, and the streak comes out as it would have (a streak at least
``runaway_repeats`` long never trips again, however much longer it is). The guard that
trips on it is :meth:`ratchet.engine.guards.run.RunGuards.after_step`.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

from ratchet.engine.guards.evidence import call_text

# A graph loop's node runs under its name and "#<iteration>": the same node every time.
_ITERATION = re.compile(r"#\d+")
# A replayed step: name, step id, output, and how to build its arguments.
_Deferred = tuple[str, str, Any, Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]]


class Streak:
    """One drive's runaway-loop streak."""

    def __init__(self) -> None:
        # The last step's (name, arguments, output), how many times in a row it came, and
        # the step id that began the streak.
        self._last: tuple[str, str, Any] | None = None
        self.length = 0
        self.first_step_id = ""
        # Replayed steps whose arguments are built only if the streak is looked at (see
        # defer); at most ``window`` of them, the only ones a streak needs.
        self._deferred: collections.deque[_Deferred] | None = None
        self._dropped = False

    def defer(
        self,
        window: int,
        name: str,
        step_id: str,
        output: Any,
        call: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> None:
        """Hold a replayed step, its arguments built by ``call`` at the next :meth:`settle`,
        keeping only the last ``window`` (``runaway_repeats``) held."""
        deferred = self._deferred
        if deferred is None or deferred.maxlen != window:
            self.settle()
            deferred = self._deferred = collections.deque(maxlen=window)
        if len(deferred) == window:
            self._dropped = True
        deferred.append((name, step_id, output, call))

    def settle(self) -> None:
        """Count the deferred replayed steps into the streak, in their order."""
        deferred = self._deferred
        if not deferred:
            return
        if self._dropped:  # the steps before the window do not reach a streak in it
            self._last, self.length, self._dropped = None, 0, False
        while deferred:
            name, step_id, output, call = deferred.popleft()
            try:
                args, kwargs = call()
                called = call_text(args, kwargs)
            except Exception:  # arguments that are not data, or cannot be built now
                self.reset()
                continue
            self.count(name, step_id, called, output)

    def count(self, name: str, step_id: str, called: str, output: Any) -> None:
        """A step ran (or replayed) with arguments ``called`` (their :func:`call_text`)."""
        if "#" in name:  # a graph loop's node: the same node in every iteration
            name = _ITERATION.sub("", name)
        current = (name, called, output)
        if current == self._last:
            self.length += 1
        else:
            self._last, self.length, self.first_step_id = current, 1, step_id

    def reset(self) -> None:
        """A step whose arguments are not data: no streak goes through it."""
        self._last, self.length = None, 0
