"""DBOS's LLM measures (see bench/peers/llm.py): the agent as a DBOS user writes it, each
model call a ``@DBOS.step`` calling the bare ``openai`` SDK, the loop a ``@DBOS.workflow``.

The system database and its settings are the other DBOS measures' (``dbos_peer.launch``:
SQLite, ``synchronous=FULL``, DBOS's default journal). ``llm-resume`` launches DBOS again,
whose recovery resumes the PENDING workflow: steps 1–3 return their recorded outputs, step
4 runs again and, with no idempotency key on the request, is a new call to the provider.
"""

from __future__ import annotations

import argparse
from typing import Any

import openai
from dbos import DBOS, SetWorkflowID

from bench.peers import common, llm
from bench.peers.common import Result
from bench.peers.dbos_peer import launch

client = openai.OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY


@DBOS.step()
def call_model(messages: list[dict[str, str]]) -> str:
    completion = client.chat.completions.create(model=llm.MODEL, messages=messages)  # type: ignore[arg-type]
    return completion.choices[0].message.content or ""


@DBOS.workflow()
def agent() -> str:
    messages, reply = llm.opening(), ""
    for turn in range(1, llm.CALLS + 1):
        reply = call_model(messages)
        messages = messages + llm.after(turn, reply)
    return reply


def _workflow_id(args: argparse.Namespace) -> str:
    return common.stable_id("dbos-llm", args.db)


def llm_crash(args: argparse.Namespace) -> Result:
    launch(args)
    with SetWorkflowID(_workflow_id(args)):
        agent()  # the bench kills us during call 4
    return {"error": "the run finished; the process was not killed during its 4th call"}


def llm_resume(args: argparse.Namespace) -> Result:
    launch(args)  # recovers the PENDING workflow
    handle: Any = DBOS.retrieve_workflow(_workflow_id(args))
    answer = handle.get_result(polling_interval_sec=0.01)
    return {
        "answer": answer,
        "resumed_by": "DBOS.launch() recovers the PENDING workflow; recorded steps "
        "return their outputs",
    }


MEASURES = {"llm-crash": llm_crash, "llm-resume": llm_resume}

if __name__ == "__main__":
    common.run("dbos", MEASURES)
