"""Per-step retry policies (docs/concepts/retries.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ratchet.errors import InvalidRetryPolicy, RetryClass

# What a policy may name: an error may also be of class never, which no policy retries.
RETRY_CLASSES = frozenset(RetryClass) - {RetryClass.NEVER}


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a step is tried and on which errors.

    ``max_attempts`` counts the first try. ``backoff_ms`` is the wait before the second
    attempt, multiplied by ``backoff_factor`` for each one after it, up to
    ``max_backoff_ms``. ``retry_on`` names the retry classes that are retried: ``any``,
    ``timeout``, ``llm``, ``connector``, ``tool``. An error's class is its ``retry_class``
    attribute (see :mod:`ratchet.errors`); an error without one is only retried on ``any``.
    """

    max_attempts: int = 1
    backoff_ms: float = 500.0
    retry_on: tuple[str, ...] = ("any",)
    backoff_factor: float = 2.0
    max_backoff_ms: float = 300_000.0

    def __init__(
        self,
        max_attempts: int = 1,
        backoff_ms: float = 500.0,
        retry_on: Iterable[str] = ("any",),
        backoff_factor: float = 2.0,
        max_backoff_ms: float = 300_000.0,
    ) -> None:
        if isinstance(retry_on, str):
            retry_on = (retry_on,)
        classes = tuple(retry_on)
        problems = []
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            problems.append(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        for name, value in (
            ("backoff_ms", backoff_ms),
            ("backoff_factor", backoff_factor),
            ("max_backoff_ms", max_backoff_ms),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                problems.append(f"{name} must be a number >= 0, got {value!r}")
        unknown = [c for c in classes if c not in RETRY_CLASSES]
        if unknown:
            problems.append(
                f"unknown retry class {', '.join(map(repr, unknown))}: "
                f"expected any of {', '.join(sorted(RETRY_CLASSES))}"
            )
        if problems:
            raise InvalidRetryPolicy("invalid retry policy: " + "; ".join(problems))
        object.__setattr__(self, "max_attempts", max_attempts)
        object.__setattr__(self, "backoff_ms", float(backoff_ms))
        object.__setattr__(self, "retry_on", classes)
        object.__setattr__(self, "backoff_factor", float(backoff_factor))
        object.__setattr__(self, "max_backoff_ms", float(max_backoff_ms))

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Retry:
        """The graph form: ``{"maxAttempts": 3, "backoffMs": 500, "retryableClasses": [...]}``."""
        known = {"maxAttempts", "backoffMs", "retryableClasses", "backoffFactor", "maxBackoffMs"}
        extra = sorted(set(data) - known)
        if extra:
            raise InvalidRetryPolicy(f"invalid retry policy: unknown field {', '.join(extra)}")
        return Retry(
            max_attempts=data.get("maxAttempts", 1),
            backoff_ms=data.get("backoffMs", 500.0),
            retry_on=data.get("retryableClasses", ("any",)),
            backoff_factor=data.get("backoffFactor", 2.0),
            max_backoff_ms=data.get("maxBackoffMs", 300_000.0),
        )

    def retryable(self, error: BaseException) -> bool:
        cls = getattr(error, "retry_class", RetryClass.ANY)
        if cls == RetryClass.NEVER:
            return False
        return RetryClass.ANY in self.retry_on or cls in self.retry_on

    def delay_s(self, failed_attempt: int) -> float:
        """Seconds to wait after the ``failed_attempt``-th attempt (1-based) failed."""
        ms = self.backoff_ms * self.backoff_factor ** max(0, failed_attempt - 1)
        return min(ms, self.max_backoff_ms) / 1000.0


NO_RETRY = Retry()


def as_policy(retry: Retry | Mapping[str, Any] | None, default: Retry = NO_RETRY) -> Retry:
    """A retry policy from what a decorator or wrapper was given: a :class:`Retry`, its
    graph form (a mapping), or None for ``default``."""
    if isinstance(retry, Mapping):
        return Retry.from_json(retry)
    if retry is None:
        return default
    if isinstance(retry, Retry):
        return retry
    raise InvalidRetryPolicy(f"retry must be a ratchet.Retry or a mapping, got {retry!r}")
