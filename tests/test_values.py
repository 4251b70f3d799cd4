"""Values on SQLite and PostgreSQL: what pydantic can serialise, Ratchet can journal.

A value with an annotation is written through that annotation's pydantic adapter and read
back as the annotated type, the same on the first drive and on replay; a value without
one is written in pydantic's JSON form and read back as that JSON. What cannot be encoded
(an open file, a lambda, a socket, a generator, a set of objects) is a NotSerializable
naming the step (the workflow, the signal) and the type, and nothing is journaled for it
but the failure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import io
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from serving import serving
from waiting import wait_for

import ratchet
from ratchet.model import EventKind, RunStatus
from ratchet.store import tokens

WHEN = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


class Tier(enum.Enum):
    GOLD = "gold"


@dataclasses.dataclass(frozen=True)
class Invoice:
    number: int
    issued: dt.datetime
    total: decimal.Decimal
    tier: Tier


class Ticket(BaseModel):
    id: uuid.UUID
    opened: dt.date


class Hex(BaseModel):  # a model with pydantic's default config: bytes as UTF-8 text
    raw: bytes


INVOICE = Invoice(7, WHEN, decimal.Decimal("9.90"), Tier.GOLD)
INVOICE_JSON = {"number": 7, "issued": "2024-05-06T07:08:09Z", "total": "9.90", "tier": "gold"}


def kinds(app: ratchet.Ratchet, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in app.events(run_id)]


# -- the JSON form is canonical ---------------------------------------------------------


def test_the_json_form_of_a_value_is_the_same_in_every_process() -> None:
    """What the journal's hashes and an idempotent start's comparison rest on: keys
    sorted, sets sorted, the same text whatever the process's string hashes."""
    code = """
import dataclasses, datetime as dt
from ratchet.engine.values import to_json

@dataclasses.dataclass
class Line:
    sku: str
    at: dt.datetime

print(to_json({"tags": {"b", "a", "c", "dd"}, "blob": b"\\xff", "days": {dt.date(2024, 1, 2)},
               "line": Line("x-1", dt.datetime(2024, 5, 6, tzinfo=dt.UTC))}, "x"))
"""
    texts = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2, 3)
    }
    assert texts == {
        '{"blob":"_w==","days":["2024-01-02"],'
        '"line":{"at":"2024-05-06T00:00:00Z","sku":"x-1"},'
        '"tags":["a","b","c","dd"]}\n'
    }


# -- without an annotation: the JSON form ----------------------------------------------


def test_unannotated_values_are_written_in_pydantics_json_form_and_read_back_as_json(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    seen: list[Any] = []

    @app.step
    async def loose():  # type: ignore[no-untyped-def]  # no annotation on purpose
        return {
            "at": WHEN,
            "invoice": INVOICE,
            "ids": {3},
            "blob": b"\x00\xff",
            "ticket": Ticket(id=uuid.UUID(int=1), opened=dt.date(2024, 1, 2)),
            "span": dt.timedelta(minutes=90),
            "tier": Tier.GOLD,
            "counts": {Tier.GOLD: 1, dt.date(2024, 1, 1): 2, 3: "int beside str keys"},
        }

    @app.workflow()
    async def wf(when, invoice):  # type: ignore[no-untyped-def]
        seen.append((when, invoice, await loose()))  # type: ignore[no-untyped-call]
        await ratchet.wait_for_signal("again")  # parks: the next drive replays the step
        return INVOICE

    expected = {
        "at": "2024-05-06T07:08:09Z",
        "invoice": INVOICE_JSON,
        "ids": [3],
        "blob": "AP8=",
        "ticket": {"id": "00000000-0000-0000-0000-000000000001", "opened": "2024-01-02"},
        "span": "PT1H30M",
        "tier": "gold",
        "counts": {"gold": 1, "2024-01-01": 2, "3": "int beside str keys"},
    }
    app.launch()
    run_id = app.start(wf, WHEN, INVOICE)
    assert app.get(run_id).input == {"args": ["2024-05-06T07:08:09Z", INVOICE_JSON], "kwargs": {}}
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "again")
    assert app.result(run_id, timeout_s=30) == INVOICE_JSON
    assert seen == [("2024-05-06T07:08:09Z", INVOICE_JSON, expected)] * 2
    [done] = [
        e
        for e in app.events(run_id)
        if e.kind == EventKind.STEP_COMPLETED and e.step_id == "1:loose"
    ]
    assert done.payload == {"output": expected}
    assert all(e.verify() for e in app.events(run_id))


# -- annotated: the annotated type, on the first drive and on replay ----------------------


def test_annotated_outputs_come_back_as_their_types_on_the_first_drive_and_on_replay(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    drives: list[dict[str, Any]] = []

    @app.step
    async def when() -> dt.datetime:
        return WHEN

    @app.step
    async def invoice() -> Invoice:
        return INVOICE

    @app.step
    async def tickets() -> dict[str, list[Ticket]]:
        return {"open": [Ticket(id=uuid.UUID(int=2), opened=dt.date(2024, 3, 4))]}

    @app.step
    async def blob() -> bytes:
        return bytes(range(256))

    @app.step
    async def tally() -> dict[Tier, int]:
        return {Tier.GOLD: 3}

    @app.workflow()
    async def wf(first: Invoice, at: dt.datetime) -> Invoice:
        drives.append(
            {
                "first": first,
                "at": at,
                "when": await when(),
                "invoice": await invoice(),
                "tickets": await tickets(),
                "blob": await blob(),
                "tally": await tally(),
            }
        )
        await ratchet.wait_for_signal("again")  # parks: the next drive replays everything
        return await invoice()

    app.launch()
    run_id = app.start(wf, INVOICE, at=WHEN)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "again")
    result = app.result(run_id, timeout_s=30)
    assert result == INVOICE and type(result) is Invoice
    first, replay = drives
    assert (
        first
        == replay
        == {
            "first": INVOICE,
            "at": WHEN,
            "when": WHEN,
            "invoice": INVOICE,
            "tickets": {"open": [Ticket(id=uuid.UUID(int=2), opened=dt.date(2024, 3, 4))]},
            "blob": bytes(range(256)),
            "tally": {Tier.GOLD: 3},
        }
    )
    assert type(replay["invoice"].total) is decimal.Decimal
    assert type(replay["tickets"]["open"][0]) is Ticket
    assert repr(first) == repr(replay)
    assert all(e.verify() for e in app.events(run_id))


def test_app_result_is_the_annotated_type_and_json_without_the_definition_or_over_http(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def billing() -> Invoice:
        return INVOICE

    app.launch()
    run_id = app.start(billing)
    assert app.result(run_id, timeout_s=30) == INVOICE
    # A client that does not know the workflow (another process, another app) gets JSON.
    client = make_app()
    assert client.result(run_id, timeout_s=30) == INVOICE_JSON
    _, secret = client.portal.call(tokens.create_token(client.store, "default", ("runs:read",)))
    with serving(client) as base:
        r = httpx.get(
            f"{base}/v1/runs/{run_id}/result",
            timeout=30,
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert r.status_code == 200 and r.json()["output"] == INVOICE_JSON


# -- signals and approvals --------------------------------------------------------------


def test_a_signal_comes_back_as_the_type_the_workflow_waits_for(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()
    drives: list[list[Any]] = []

    @app.workflow()
    async def gate() -> list[Any]:
        got: list[Any] = []
        drives.append(got)
        try:
            await ratchet.wait_for_signal("invoice", type=Invoice)
        except ratchet.NotSerializable as e:  # the first one sent does not fit
            got.append(str(e))
        got.append(await ratchet.wait_for_signal("invoice", type=Invoice))
        got.append(await ratchet.wait_for_signal("decision", type=ratchet.Decision))
        got.append(await ratchet.wait_for_signal("tickets", type=list[Ticket]))
        return ["done"]

    decision = ratchet.Decision(True, "ana", None, WHEN)
    app.launch()
    run_id = app.start(gate)
    app.signal(run_id, "invoice", {"number": "not a number"})
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "invoice", INVOICE)  # sent as the dataclass: stored as its JSON
    app.signal(run_id, "decision", decision)
    app.signal(run_id, "tickets", [{"id": str(uuid.UUID(int=3)), "opened": "2024-06-07"}])
    assert app.result(run_id, timeout_s=30) == ["done"]
    refused = (
        "the data of signal 'invoice' does not fit Invoice: Input should be a valid "
        "integer, unable to parse string as an integer at number (and 3 more)"
    )
    expected = [
        refused,
        INVOICE,
        decision,
        [Ticket(id=uuid.UUID(int=3), opened=dt.date(2024, 6, 7))],
    ]
    # Each drive got what the journal held by then, the bad one refused every time; the
    # last replayed every signal.
    assert all(got == expected[: len(got)] for got in drives) and len(drives) >= 2
    assert drives[-1] == expected
    assert type(drives[-1][2]) is ratchet.Decision
    [sent] = [
        e
        for e in app.events(run_id)
        if e.kind == EventKind.STEP_COMPLETED and e.step_id == "2:signal:invoice"
    ]
    assert sent.payload == {"output": INVOICE_JSON}


def test_approval_data_is_written_in_its_json_form(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def refund() -> bool:
        decision = await ratchet.approval("refund", data={"invoice": INVOICE, "at": WHEN})
        return decision.approved

    app.launch()
    run_id = app.start(refund)
    wait_for(lambda: app.approvals(run_id) != [])
    [asked] = app.approvals(run_id)
    assert asked.data == {"invoice": INVOICE_JSON, "at": "2024-05-06T07:08:09Z"}
    app.approve(run_id, "refund", by="ana")
    assert app.result(run_id, timeout_s=30) is True


# -- what cannot be encoded ---------------------------------------------------------------


@pytest.fixture
def resources() -> Iterator[list[Any]]:
    """Files and sockets a test's steps open, closed after the test."""
    opened: list[Any] = []
    yield opened
    for r in opened:
        r.close()


def _open_file(opened: list[Any]) -> Any:
    f = open(__file__)  # noqa: SIM115  (closed by the fixture)
    opened.append(f)
    return f


def _socket(opened: list[Any]) -> Any:
    s = socket.socket()
    opened.append(s)
    return s


def _lines() -> Iterator[int]:
    yield 1


# What a step returns, the return annotation it has when annotated (a type pydantic
# cannot describe leaves it to pydantic's JSON encoding), and what the error says.
UNENCODABLE: dict[str, tuple[Callable[[list[Any]], Any], Any, str]] = {
    "file": (_open_file, io.TextIOWrapper, "a TextIOWrapper is an iterator"),
    "lambda": (lambda _: lambda: 1, dt.datetime, "cannot encode a function"),
    "socket": (_socket, socket.socket, "cannot encode a socket"),
    "generator": (lambda _: _lines(), Iterator[int], "a generator is an iterator"),
    "set of objects": (lambda _: {object()}, set[Any], "unknown type: <class 'object'>"),
    "binary bytes in a model": (
        lambda _: Hex(raw=b"\xff"),
        Hex,
        "cannot encode a Hex .*UTF-8 text.*ser_json_bytes",
    ),
}


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "unannotated"])
@pytest.mark.parametrize("kind", list(UNENCODABLE))
def test_an_unencodable_output_fails_its_step_naming_the_step_and_the_type(
    make_app: Callable[..., ratchet.Ratchet], resources: list[Any], kind: str, annotated: bool
) -> None:
    make, annotation, named = UNENCODABLE[kind]
    app = make_app()

    async def leaky() -> Any:
        return make(resources)

    leaky.__annotations__ = {"return": annotation if annotated else Any}
    step = app.step(leaky)

    @app.workflow()
    async def wf() -> None:
        await step()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(
        ratchet.RunFailed, match=f"output of step 1:leaky is not JSON-serialisable.*{named}"
    ):
        app.result(run_id, timeout_s=30)
    assert (EventKind.STEP_COMPLETED, "1:leaky") not in kinds(app, run_id)
    [error] = [e for e in app.events(run_id) if e.kind == EventKind.STEP_FAILED]
    assert error.payload["error_type"] == "NotSerializable"
    assert all(e.verify() for e in app.events(run_id))


def test_an_output_that_does_not_fit_its_annotation_fails_its_step_unjournaled(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.step
    async def stamp() -> dt.datetime:
        return "not a time"  # type: ignore[return-value]

    @app.workflow()
    async def wf() -> None:
        await stamp()

    app.launch()
    run_id = app.start(wf)
    with pytest.raises(
        ratchet.RunFailed,
        match=r"the output of step stamp does not fit its "
        r"return annotation .*datetime",
    ):
        app.result(run_id, timeout_s=30)
    assert (EventKind.STEP_COMPLETED, "1:stamp") not in kinds(app, run_id)


def test_an_unencodable_result_input_or_signal_is_refused_naming_it(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app = make_app()

    @app.workflow()
    async def opener(x: Any = None) -> Invoice:
        return lambda: 1  # type: ignore[return-value]

    @app.workflow()
    async def misfit() -> Invoice:
        return {"number": 1}  # type: ignore[return-value]

    with pytest.raises(ratchet.NotSerializable, match=r"input of workflow opener .*function"):
        app.start(opener, lambda: 2)
    with pytest.raises(ratchet.NotSerializable, match=r"input of workflow opener .*iterator"):
        app.start(opener, io.StringIO("text"))
    assert app.runs() == []
    app.launch()
    run_id = app.start(opener)
    with pytest.raises(
        ratchet.RunFailed,
        match=r"the result of workflow opener is not "
        r"JSON-serialisable as Invoice: .*function",
    ):
        app.result(run_id, timeout_s=30)
    assert app.dead_letters()[0].reason == "not_serializable"
    with (
        socket.socket() as s,
        pytest.raises(ratchet.NotSerializable, match=r"the data of signal 'go' .*socket"),
    ):
        app.signal(run_id, "go", {"conn": s})
    other = app.start(misfit)
    with pytest.raises(
        ratchet.RunFailed,
        match=r"the result of workflow misfit does not fit "
        r"its return annotation",
    ):
        app.result(other, timeout_s=30)
    assert EventKind.RUN_SUCCEEDED not in [k for k, _ in kinds(app, other)]


@pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="typing.TypedDict is pydantic's from Python 3.12 on"
)
def test_a_typing_typed_dict_on_python_3_11_is_refused_with_what_to_use(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    from typing import TypedDict

    class Row(TypedDict):
        at: dt.datetime

    app = make_app()

    async def row() -> Any:
        return {"at": WHEN}

    row.__annotations__ = {"return": Row}
    step = app.step(row)

    @app.workflow()
    async def wf() -> None:
        await step()

    app.launch()
    with pytest.raises(
        ratchet.RunFailed,
        match=r"values of Row cannot be journaled: .*"
        r"typing_extensions.TypedDict",
    ):
        app.result(app.start(wf), timeout_s=30)


# -- Pydantic AI ------------------------------------------------------------------------


@dataclasses.dataclass
class Forecast:
    city: str
    at: dt.datetime
    celsius: decimal.Decimal


def test_a_pydantic_ai_dataclass_output_is_a_workflow_result(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from ratchet.integrations.pydantic_ai import RatchetDurability

    app = make_app()
    answer = {"city": "Porto", "at": "2024-05-06T07:08:09Z", "celsius": "21.5"}
    agent = Agent(
        TestModel(custom_output_args=answer),
        name="forecaster",
        output_type=Forecast,
        capabilities=[RatchetDurability()],
    )
    drives: list[Any] = []

    @app.workflow()
    async def forecast() -> Forecast:
        output = (await agent.run("the weather in Porto")).output
        drives.append(output)
        await ratchet.wait_for_signal("again")  # parks: the next drive replays the agent
        return output

    @app.workflow()
    async def loose():  # type: ignore[no-untyped-def]
        return (await agent.run("the weather in Porto")).output

    app.launch()
    run_id = app.start(forecast)
    wait_for(lambda: app.get(run_id).status == RunStatus.WAITING)
    app.signal(run_id, "again")
    result = app.result(run_id, timeout_s=30)
    assert result == Forecast("Porto", WHEN, decimal.Decimal("21.5"))
    assert type(result.celsius) is decimal.Decimal
    assert drives == [result, result]
    assert app.get(run_id).output == answer
    assert app.result(app.start(loose), timeout_s=30) == answer  # no annotation: the JSON
