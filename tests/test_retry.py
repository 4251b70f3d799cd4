"""Retry policies: validation, the graph form, classes and backoff."""

from __future__ import annotations

from typing import Any

import pytest

import ratchet
from ratchet.engine.retry import Retry


def test_graph_form() -> None:
    r = Retry.from_json({"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]})
    assert (r.max_attempts, r.backoff_ms, r.retry_on) == (3, 500.0, ("llm",))
    with pytest.raises(ratchet.InvalidRetryPolicy, match="unknown field maxAttempt"):
        Retry.from_json({"maxAttempt": 3})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"max_attempts": 1.5}, "max_attempts must be an integer >= 1"),
        ({"backoff_ms": -1}, "backoff_ms must be a number >= 0"),
        ({"retry_on": ["network"]}, "unknown retry class 'network'"),
    ],
)
def test_invalid_policies_name_the_problem(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ratchet.InvalidRetryPolicy, match=message):
        Retry(**kwargs)


def test_classes_decide_what_is_retried() -> None:
    policy = Retry(max_attempts=3, retry_on=["connector", "timeout"])
    assert policy.retryable(ratchet.ConnectorError("x"))
    assert policy.retryable(ratchet.StepTimeout("x"))
    assert not policy.retryable(ratchet.LLMError("x"))
    assert not policy.retryable(ValueError("x"))
    assert Retry(max_attempts=3).retryable(ValueError("x"))  # default: any
    assert not Retry(max_attempts=3).retryable(ratchet.NotSerializable("x"))  # never


def test_backoff_grows_and_is_capped() -> None:
    policy = Retry(max_attempts=5, backoff_ms=100, backoff_factor=2, max_backoff_ms=300)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]


def test_step_decorator_refuses_a_bad_policy_at_definition(tmp_path: object) -> None:
    app = ratchet.Ratchet(f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(ratchet.InvalidRetryPolicy, match="unknown retry class 'gpu'"):

        @app.step(retry={"maxAttempts": 2, "retryableClasses": ["gpu"]})
        async def s() -> None: ...

    with pytest.raises(ratchet.InvalidInput, match="timeout_s must be a positive number"):

        @app.step(timeout_s=0)
        async def t() -> None: ...
