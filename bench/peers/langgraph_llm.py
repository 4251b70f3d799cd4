"""LangGraph's LLM measures (see bench/peers/llm.py): the agent as a LangGraph user writes
it, one ``agent`` node calling the bare ``openai`` SDK once a visit and looping back to
itself until the fifth reply, the conversation in the graph's state, checkpointed by
``SqliteSaver`` after every node (``durability="sync"`` and the file settings of the other
LangGraph measures: WAL, ``synchronous=FULL``).

``llm-resume`` invokes the graph again with ``None`` on the same ``thread_id``: it continues
after the last checkpoint, i.e. re-runs the node that was making call 4, which sends it
again with no idempotency key.
"""

from __future__ import annotations

import argparse
import operator
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph

from bench.peers import common, llm
from bench.peers.common import Result
from bench.peers.langgraph_peer import saver_for

client = openai.OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY


class AgentState(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]
    turns: int


def agent(state: AgentState) -> dict[str, Any]:
    completion = client.chat.completions.create(model=llm.MODEL, messages=state["messages"])  # type: ignore[arg-type]
    reply = completion.choices[0].message.content or ""
    turn = state["turns"] + 1
    return {"messages": llm.after(turn, reply), "turns": turn}


def graph(saver: Any) -> Any:
    builder = StateGraph(AgentState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", lambda s: "agent" if s["turns"] < llm.CALLS else END)
    return builder.compile(checkpointer=saver)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    return {"configurable": {"thread_id": common.stable_id("langgraph-llm", args.db)}}


def _answer(state: dict[str, Any]) -> str:
    return str(state["messages"][-1]["content"])


def llm_crash(args: argparse.Namespace) -> Result:
    with saver_for(args) as saver:
        # the bench kills us during call 4
        graph(saver).invoke(
            {"messages": llm.opening(), "turns": 0}, _config(args), durability="sync"
        )
    return {"error": "the run finished; the process was not killed during its 4th call"}


def llm_resume(args: argparse.Namespace) -> Result:
    with saver_for(args) as saver:
        state = graph(saver).invoke(None, _config(args), durability="sync")
    return {
        "answer": _answer(state),
        "resumed_by": "graph.invoke(None) on the same thread_id, from the last checkpoint",
    }


MEASURES = {"llm-crash": llm_crash, "llm-resume": llm_resume}

if __name__ == "__main__":
    common.run("langgraph", MEASURES)
