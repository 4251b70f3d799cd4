"""Batch start (``app.start_many``): many runs in one transaction, ids in order, each item
idempotent as ``app.start``; a bad item is named by its index and nothing is written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import ratchet
from ratchet.model import NewRun
from ratchet.store import Store


def _app(make_app: Callable[..., ratchet.Ratchet]) -> tuple[ratchet.Ratchet, ratchet.WorkflowDef]:
    app = make_app()

    @app.step
    async def double(x: int) -> int:
        return 2 * x

    @app.workflow(name="doubler")
    async def doubler(x: int, label: str = "") -> str:
        return f"{label}{await double(x)}"

    return app, doubler


def test_start_many_returns_ids_in_order_and_a_worker_drives_them_all(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, wf = _app(make_app)
    items: list[object] = [{"x": i} for i in range(50)]
    items += [(7,), ratchet.Start(8, label="n=", run_id="explicit-8", priority=3)]
    ids = app.start_many(wf, items)
    assert len(ids) == 52 and len(set(ids)) == 52 and ids[-1] == "explicit-8"
    assert app.count_runs("queued") == 52
    rec = app.get("explicit-8")
    assert rec.priority == 3 and rec.input == {"args": [8], "kwargs": {"label": "n="}}
    assert [e.kind for e in app.events(ids[0])] == ["run_queued"]
    app.launch(concurrency=64)
    assert [app.result(i, timeout_s=30) for i in ids] == [
        *(str(2 * i) for i in range(50)),
        "14",
        "n=16",
    ]


def test_explicit_ids_are_idempotent_within_and_across_batches(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, wf = _app(make_app)
    assert app.start(wf, 1, run_id="a") == "a"
    ids = app.start_many(
        wf,
        [ratchet.Start(1, run_id="a"), ratchet.Start(2, run_id="b"), ratchet.Start(2, run_id="b")],
    )
    assert ids == ["a", "b", "b"]
    assert app.start_many(wf, [ratchet.Start(2, run_id="b"), ratchet.Start(1, run_id="a")]) == [
        "b",
        "a",
    ]
    assert sorted(r.run_id for r in app.runs()) == ["a", "b"]
    assert [e.kind for e in app.events("b")] == ["run_queued"]


@pytest.mark.parametrize(
    ("bad", "field", "message"),
    [
        ({"x": "not a number"}, "input", "invalid argument 'x'"),
        ({"y": 1}, "input", "arguments do not fit"),
        (ratchet.Start(1, run_id="bad id!"), "run_id", "invalid run id"),
        (ratchet.Start(1, queue=""), "queue", "queue"),
        (ratchet.Start(1, priority=2**40), "priority", "32-bit"),
        (ratchet.Start(1, guards={"nope": 1}), "guards", "unknown field 'nope'"),
        (
            ratchet.Start(1, run_id="taken"),
            "run_id",
            r"already exists with input .*\[5\].*not .*\[1\]",
        ),
        (ratchet.Start(9, run_id="item-0"), "run_id", "repeats item 0"),
        ("a string", "input", "expected a ratchet.Start"),
    ],
)
def test_a_bad_item_is_named_by_index_and_nothing_is_written(
    make_app: Callable[..., ratchet.Ratchet], bad: object, field: str, message: str
) -> None:
    app, wf = _app(make_app)
    app.start(wf, 5, run_id="taken")
    items = [ratchet.Start(0, run_id="item-0"), {"x": 1}, {"x": 2}, bad, {"x": 4}]
    with pytest.raises(ratchet.BatchItemInvalid, match=message) as caught:
        app.start_many(wf, items)
    assert caught.value.index == 3 and caught.value.field == field
    assert str(caught.value).startswith(f"item 3 ({field}): ")
    assert [r.run_id for r in app.runs()] == ["taken"]  # nothing of the batch landed


def test_an_unknown_workflow_is_refused_before_anything_is_written(
    make_app: Callable[..., ratchet.Ratchet],
) -> None:
    app, _ = _app(make_app)
    with pytest.raises(ratchet.BatchItemInvalid, match=r"item 0 \(workflow\): unknown workflow"):
        app.start_many("nope", [{"x": 1}])
    assert app.start_many("doubler", []) == []
    assert app.count_runs() == 0


async def test_tenants_are_kept_apart_and_a_taken_id_fails_the_batch(store: Store) -> None:
    def new(run_id: str, tenant: str, x: int = 1) -> NewRun:
        return NewRun(run_id, "wf", "1", {"args": [x], "kwargs": {}}, tenant_id=tenant)

    got = await store.create_runs([new("t-1", "acme"), new("t-2", "acme")])
    assert [(run_id, created) for run_id, _, created in got] == [("t-1", True), ("t-2", True)]
    with pytest.raises(ratchet.BatchItemInvalid, match=r"item 1 \(run_id\): .*taken") as caught:
        await store.create_runs([new("u-1", "globex"), new("t-2", "globex")])
    assert caught.value.taken
    assert await store.get_run("u-1") is None
    again = await store.create_runs([new("t-2", "acme"), new("t-3", "acme")])
    assert [(run_id, str(status), created) for run_id, status, created in again] == [
        ("t-2", "queued", False),
        ("t-3", "queued", True),
    ]
    runs = [await store.get_run(i) for i in ("t-1", "t-2", "t-3")]
    assert {r.tenant_id if r else None for r in runs} == {"acme"}


async def test_concurrent_batches_with_overlapping_ids_create_each_run_once(store: Store) -> None:
    # Overlapping, and in opposite orders: the inserts must neither deadlock nor duplicate.
    batches = [
        [NewRun(f"o-{i}", "wf", "1", {"args": [i], "kwargs": {}}) for i in range(k, k + 200)][
            ::step
        ]
        for k, step in ((0, 1), (100, -1), (50, -1), (150, 1))
    ]
    answers = await asyncio.gather(*(store.create_runs(b) for b in batches))
    created = [run_id for answer in answers for run_id, _, fresh in answer if fresh]
    assert sorted(created) == sorted({f"o-{i}" for i in range(350)})
    for i in (0, 120, 349):
        assert [e.kind for e in await store.load_events(f"o-{i}")] == ["run_queued"]
