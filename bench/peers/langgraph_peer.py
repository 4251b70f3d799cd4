"""LangGraph as a benchmark peer, with SqliteSaver or PostgresSaver checkpoints.

A "step" is a graph node. Graphs run with ``durability="sync"``: the checkpoint of each
super-step is written before the next node runs. SQLite: the saver's connection gets
``PRAGMA journal_mode=WAL`` (the saver's own setup sets it too) and ``PRAGMA
synchronous=FULL`` (fsync on every commit). Postgres: the saver runs in autocommit under
the server's ``fsync=on`` and ``synchronous_commit=on``. Effective settings are reported
under ``durability``.

Graphs: ``line(K)`` is K identity nodes in a row; ``loop`` is one identity node that runs
``steps`` times (a super-step each), whose run number ``kill_at`` blocks on its first
execution. Resuming is LangGraph's own: invoking the graph again with the same
``thread_id`` and ``None`` input continues after the last checkpoint. ``concurrent`` runs
the graphs as asyncio tasks on the async saver. LangGraph has no queue, worker or lease,
so ``pickup`` and ``takeover`` are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

from bench.peers import common
from bench.peers.common import Probe, Result, clock, ms

PROBE = Probe()
DURABILITY: dict[str, Any] = {"durability_mode": "sync"}


class State(TypedDict):
    x: int
    i: int


def identity(state: State) -> dict[str, int]:
    return {"x": state["x"]}


async def aidentity(state: State) -> dict[str, int]:
    return {"x": state["x"]}


def line(k: int, saver: BaseCheckpointSaver[Any], is_async: bool = False) -> Any:
    graph = StateGraph(State)
    previous = START
    for i in range(1, k + 1):
        graph.add_node(f"s{i}", aidentity if is_async else identity)
        graph.add_edge(previous, f"s{i}")
        previous = f"s{i}"
    graph.add_edge(previous, END)
    return graph.compile(checkpointer=saver)


def loop(steps: int, kill_at: int, marker: str, saver: BaseCheckpointSaver[Any]) -> Any:
    def step(state: State) -> dict[str, int]:
        i = state["i"] + 1
        if i == kill_at:
            if not os.path.exists(marker):
                common.write_marker(marker)
                common.block_forever()
            PROBE.mark("kill_step")
        return {"x": state["x"], "i": i}

    graph = StateGraph(State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda s: "step" if s["i"] < steps else END)
    return graph.compile(checkpointer=saver)


def _thread(thread_id: str, steps: int = 0) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + 10}


@contextlib.contextmanager
def saver_for(args: argparse.Namespace) -> Iterator[BaseCheckpointSaver[Any]]:
    if args.variant != "default":
        raise ValueError(f"unknown variant {args.variant!r} (default)")
    if args.backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(args.db, check_same_thread=False)
        try:
            _sqlite_pragmas(conn)
            lite = SqliteSaver(conn)
            lite.setup()
            yield lite
        finally:
            conn.close()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        DURABILITY.update(common.pg_durability(args.db))
        with PostgresSaver.from_conn_string(args.db) as pg:
            pg.setup()
            yield pg


def _sqlite_pragmas(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    DURABILITY.update(
        common.sqlite_durability(mode, conn.execute("PRAGMA synchronous").fetchone()[0])
    )


def sequential(args: argparse.Namespace) -> Result:
    with saver_for(args) as saver:
        graph = line(args.steps, saver)

        def run_one() -> None:
            config = _thread(str(uuid.uuid4()), args.steps)
            graph.invoke({"x": 1, "i": 0}, config, durability="sync")

        for _ in range(common.WARMUP_RUNS):
            run_one()
        started = clock()
        for _ in range(args.n):
            run_one()
        seconds = clock() - started
    return {
        "seconds": seconds,
        "n": args.n,
        "steps": args.steps,
        "setting": "graph.invoke, durability=sync",
        "durability": DURABILITY,
    }


@contextlib.asynccontextmanager
async def async_saver_for(args: argparse.Namespace) -> Any:
    if args.backend == "sqlite":
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with aiosqlite.connect(args.db) as conn:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA synchronous=FULL")
            async with conn.execute("PRAGMA journal_mode") as cur:
                mode = (await cur.fetchone() or [None])[0]
            async with conn.execute("PRAGMA synchronous") as cur:
                DURABILITY.update(
                    common.sqlite_durability(mode, (await cur.fetchone() or [None])[0])
                )
            lite = AsyncSqliteSaver(conn)
            await lite.setup()
            yield lite
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        DURABILITY.update(common.pg_durability(args.db))
        async with AsyncPostgresSaver.from_conn_string(args.db) as pg:
            await pg.setup()
            yield pg


async def _concurrent(args: argparse.Namespace) -> Result:
    async with async_saver_for(args) as saver:
        graph = line(args.steps, saver, is_async=True)
        await graph.ainvoke({"x": 1, "i": 0}, _thread("warm-up", args.steps), durability="sync")

        async def one() -> float:
            started = clock()
            config = _thread(str(uuid.uuid4()), args.steps)
            await graph.ainvoke({"x": 1, "i": 0}, config, durability="sync")
            return ms(clock() - started)

        t0 = clock()
        latencies = await asyncio.gather(*(one() for _ in range(args.n)))
        wall = clock() - t0
    saver_name = type(saver).__name__
    return {
        "seconds": wall,
        "n": args.n,
        "steps": args.steps,
        "steps_per_s": args.n * args.steps / wall,
        "setting": (
            f"asyncio.gather of {args.n} graph.ainvoke on one {saver_name} "
            "(the saver serialises its database calls)"
        ),
        "latency": "ainvoke called -> ainvoke returned",
        **common.latency_summary(list(latencies)),
        "durability": DURABILITY,
    }


def concurrent(args: argparse.Namespace) -> Result:
    if args.variant != "default":
        raise ValueError(f"unknown variant {args.variant!r} (default)")
    return asyncio.run(_concurrent(args))


def recovery_crash(args: argparse.Namespace) -> Result:
    if os.path.exists(args.marker):
        os.unlink(args.marker)
    with saver_for(args) as saver:
        graph = loop(args.steps, args.kill_at, args.marker, saver)
        config = _thread(common.stable_id("langgraph", args.marker), args.steps)
        graph.invoke({"x": 0, "i": 0}, config, durability="sync")
    return {"error": "the blocking node returned; the process was not killed"}


def recovery_resume(args: argparse.Namespace) -> Result:
    if not os.path.exists(args.marker):
        return {"error": f"no marker {args.marker}: run recovery-crash first"}
    t0 = clock()
    with saver_for(args) as saver:
        graph = loop(args.steps, args.kill_at, args.marker, saver)
        config = _thread(common.stable_id("langgraph", args.marker), args.steps)
        result = graph.invoke(None, config, durability="sync")
        done_at = clock()
    if result is None or result.get("i") != args.steps:
        return {"error": f"resume ended with {result!r}, expected i={args.steps}"}
    return {
        "to_step5_ms": ms(PROBE.wait("kill_step", 0) - t0),
        "to_result_ms": ms(done_at - t0),
        "kill_at": args.kill_at,
        "peak_rss_mb": common.peak_rss_mb(),
        "recovery": "graph.invoke(None) on the same thread_id",
        "durability": DURABILITY,
    }


def replay(args: argparse.Namespace) -> Result:
    return common.run_replay(args, "bench.peers.langgraph_peer")


def pickup(args: argparse.Namespace) -> Result:
    return {
        "skipped": "LangGraph has no queue or worker: invoke runs the graph in the "
        "caller, so there is nothing to pick work up"
    }


def takeover(args: argparse.Namespace) -> Result:
    return {"skipped": "LangGraph has no worker or lease: nothing takes over a thread"}


MEASURES = {
    "sequential": sequential,
    "concurrent": concurrent,
    "recovery-crash": recovery_crash,
    "recovery-resume": recovery_resume,
    "replay": replay,
    "pickup": pickup,
    "takeover": takeover,
}

if __name__ == "__main__":
    common.run("langgraph", MEASURES)
