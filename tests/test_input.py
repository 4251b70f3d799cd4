"""Input at the door, on SQLite and PostgreSQL: what cannot be stored faithfully is refused
before anything is written, with one clear error; arguments are checked against the
workflow's annotations; annotated outputs come back as the annotated types."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel
from waiting import wait_for

import ratchet
from ratchet.model import RunStatus


def echo_app(make_app: Callable[..., ratchet.Ratchet]) -> tuple[ratchet.Ratchet, Any]:
    app = make_app()

    @app.workflow()
    async def echo(x: Any = None) -> Any:
        return x

    return app, echo


# -- ids, priorities, names --------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["order-1\n", "order-1\n\n", "\norder-1", "order 1", ""])
def test_a_malformed_run_id_is_refused(
    make_app: Callable[..., ratchet.Ratchet], run_id: str
) -> None:
    app, echo = echo_app(make_app)
    with pytest.raises(ratchet.InvalidInput, match="invalid run id"):
        app.start(echo, 1, run_id=run_id)
    assert app.runs() == []


@pytest.mark.parametrize("priority", [2**31, 2**40, 2**70, -(2**31) - 1, -(2**70)])
def test_a_priority_outside_32_bits_is_refused_on_both_backends(
    make_app: Callable[..., ratchet.Ratchet], priority: int
) -> None:
    app, echo = echo_app(make_app)
    with pytest.raises(ratchet.InvalidInput, match=r"invalid priority .*32-bit signed"):
        app.start(echo, 1, priority=priority)
    assert app.runs() == []


def test_the_extreme_32_bit_priorities_are_stored(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app, echo = echo_app(make_app)
    high = app.start(echo, 1, priority=2**31 - 1)
    low = app.start(echo, 2, priority=-(2**31))
    assert app.get(high).priority == 2**31 - 1
    assert app.get(low).priority == -(2**31)


def test_a_nul_in_a_queue_or_signal_name_is_refused_and_nothing_is_written(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def gate() -> Any:
        return await ratchet.wait_for_signal("go")

    with pytest.raises(ratchet.InvalidInput, match="invalid queue .*NUL"):
        app.start(gate, queue="fast\x00lane")
    assert app.runs() == []
    app.launch()
    run_id = app.start(gate)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    before = app.events(run_id)
    with pytest.raises(ratchet.InvalidInput, match="invalid signal name .*NUL"):
        app.signal(run_id, "go\x00", {"by": "ada"})
    with pytest.raises(ratchet.InvalidInput, match="invalid signal name .*lone surrogate"):
        app.signal(run_id, "go\ud800")
    assert app.events(run_id) == before and app.get(run_id).status == RunStatus.WAITING
    # NUL inside JSON data too: PostgreSQL's jsonb cannot store it, on either backend.
    with pytest.raises(ratchet.NotSerializable, match="data of signal 'go'.*NUL"):
        app.signal(run_id, "go", {"note": "a\x00b"})
    assert app.events(run_id) == before and app.get(run_id).status == RunStatus.WAITING
    app.signal(run_id, "go", {"note": "a\\u0000b"})  # a backslash and "u0000" is text
    assert app.result(run_id, timeout_s=30) == {"note": "a\\u0000b"}


def test_a_nul_in_a_workflow_or_step_name_is_refused_at_definition(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    with pytest.raises(ratchet.InvalidInput, match="invalid workflow name .*NUL"):

        @app.workflow(name="wf\x00")
        async def wf() -> None: ...

    with pytest.raises(ratchet.InvalidInput, match="invalid step name .*NUL"):

        @app.step(name="step\x00")
        async def step() -> None: ...

    assert app.workflows == {}


def test_a_nul_in_a_signal_name_inside_a_workflow_fails_the_run_clearly(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def gate() -> Any:
        return await ratchet.wait_for_signal("go\x00now")

    app.launch()
    run_id = app.start(gate)
    with pytest.raises(ratchet.RunFailed, match="invalid signal name 'go\\\\x00now'.*NUL"):
        app.result(run_id, timeout_s=30)


# -- lone surrogates ---------------------------------------------------------------------


def test_a_lone_surrogate_in_arguments_or_signal_data_is_refused(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, echo = echo_app(make_app)
    with pytest.raises(ratchet.NotSerializable, match=r"input of workflow echo.*surrogate"):
        app.start(echo, {"text": "caf\ud800"})
    assert app.runs() == []
    run_id = app.start(echo, 1)
    with pytest.raises(ratchet.NotSerializable, match=r"data of signal 'go'.*surrogate"):
        app.signal(run_id, "go", ["\udfff"])
    assert [e.kind for e in app.events(run_id)] == ["run_queued"]


def test_a_lone_surrogate_in_a_step_output_fails_that_step_naming_it(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step
    async def broken_text() -> str:
        return "half a pair: \ud83d"

    @app.workflow()
    async def wf() -> str:
        return await broken_text()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(
        ratchet.RunFailed,
        match=r"step 1:broken_text failed: NotSerializable: "
        r"the output of step 1:broken_text .*surrogate",
    ):
        app.result(run_id, timeout_s=30)
    [failed] = [e for e in app.events(run_id) if e.kind == "step_failed"]
    assert failed.step_id == "1:broken_text"
    assert failed.payload["error_type"] == "NotSerializable"


# -- annotations -------------------------------------------------------------------------


def test_arguments_are_validated_against_the_annotations(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def add(x: int, y: int, *, user: User | None = None) -> int:
        return x + y

    with pytest.raises(
        ratchet.InvalidInput,
        match=r"invalid argument 'y' of workflow add: "
        r'expected int, got "notint"',
    ):
        app.start(add, 1, y="notint")
    with pytest.raises(ratchet.InvalidInput, match=r"invalid argument 'user' of workflow add"):
        app.start(add, 1, 2, user={"name": "ada"})  # no age
    with pytest.raises(ratchet.InvalidInput, match=r"invalid argument 'x'"):
        app.start(add, [1], 2)
    assert app.runs() == []


def test_models_come_back_as_models_for_any_annotation(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    seen: dict[str, Any] = {}

    @app.step
    async def maybe_user(name: str) -> User | None:
        return User(name=name, age=36) if name else None

    @app.step
    async def team() -> list[User]:
        return [User(name="ada", age=36), User(name="alan", age=41)]

    @app.step
    async def later() -> Later:  # a class defined below the step, at module level
        return Later(note="defined after the step")

    @app.workflow()
    async def wf(owner: User, members: list[User], since: int = 0) -> dict[str, Team]:
        seen["owner"] = owner
        seen["members"] = members
        found, nobody = await maybe_user("ada"), await maybe_user("")
        seen["found"], seen["nobody"] = found, nobody
        seen["team"] = await team()
        seen["later"] = await later()
        return {"t": Team(owner=owner, members=seen["team"])}

    app.launch()
    run_id = app.start(wf, {"name": "grace", "age": "85"}, [User(name="kay", age=1)])
    # Stored in the annotation's JSON form: the string "85" was validated into an int.
    assert app.get(run_id).input == {
        "args": [{"name": "grace", "age": 85}, [{"name": "kay", "age": 1}]],
        "kwargs": {},
    }
    result = app.result(run_id, timeout_s=30)
    assert seen["owner"] == User(name="grace", age=85)
    assert seen["members"] == [User(name="kay", age=1)]
    assert seen["found"] == User(name="ada", age=36) and seen["nobody"] is None
    assert seen["team"] == [User(name="ada", age=36), User(name="alan", age=41)]
    assert all(isinstance(u, User) for u in seen["team"])
    assert seen["later"] == Later(note="defined after the step")
    assert isinstance(result["t"], Team) and result["t"].owner == User(name="grace", age=85)


def test_a_bare_workflow_decorator_is_accepted(make_app: Callable[..., ratchet.Ratchet]) -> None:
    app = make_app()

    @app.workflow
    async def plain(x: int) -> int:
        return x + 1

    assert isinstance(plain, ratchet.WorkflowDef) and app.workflows["plain"] is plain
    app.launch()
    assert app.result(app.start(plain, 41), timeout_s=30) == 42


class User(BaseModel):
    name: str
    age: int


class Team(BaseModel):
    owner: User
    members: list[User]


class Later(BaseModel):
    note: str
