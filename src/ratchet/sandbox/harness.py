"""Inside a sandbox: ``python -m ratchet.sandbox.harness module:workflow``, or
``python -m ratchet.sandbox.harness --graph`` for a graph (``tier: isolated``).

Runs the workflow with the engine's own driver, so its ``@app.step`` code is the same as
in-process: the journal is read from the report channel (with ``RATCHET_RESUME=1``, the
completed steps it holds are replayed from their saved outputs, not run again; a step an
earlier sandbox left in flight runs again under the same attempt and idempotency key),
and every journal write goes back as a report. The worker outside owns the run and writes
its journal: it has journaled this drive's start before spawning the sandbox, it checks
each report against the step state machine, judges the run's guards, and makes the run's
model calls (wrapped clients send them over the channel). This process only proposes.
Its exit code tells the worker what happened: 0 the run ended, 3 the sandbox was fenced
off (another owns the run), anything else a crash.

Environment (set by the worker): RATCHET_RUN_ID, RATCHET_SANDBOX_ID, RATCHET_REPORT_TOKEN,
RATCHET_WORKER_ID, RATCHET_LEASE_EPOCH, RATCHET_REPORT_SOCKET, RATCHET_NETWORK, and
RATCHET_RESUME=1 from the second sandbox of a run on. A graph's
harness gets its definition (RATCHET_GRAPH, checked against the run's version) and where
its tools are (RATCHET_GRAPH_TOOLS: ``{tool: "module:name"}``), and runs the interpreter.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import os
import sys
from typing import cast

from ratchet.engine.control import Control, DriveOutcome
from ratchet.engine.definitions import WorkflowDef
from ratchet.engine.driver import drive
from ratchet.engine.threads import StepThreads
from ratchet.llm import routing
from ratchet.model import ClaimedRun, Lease
from ratchet.sandbox.backend import REPORT_SOCKET
from ratchet.sandbox.remote import RemoteModels, RemoteStore, Reporter
from ratchet.store.base import Store

EXIT_ENDED = 0
EXIT_CRASHED = 1
EXIT_USAGE = 2
EXIT_FENCED = 3
_OUTCOME_EXIT = {
    DriveOutcome.SUCCEEDED: EXIT_ENDED,
    DriveOutcome.FAILED: EXIT_ENDED,
    DriveOutcome.NOOP: EXIT_ENDED,
    DriveOutcome.LEASE_LOST: EXIT_FENCED,
}

GRAPH_ARG = "--graph"
GRAPH_ENV = "RATCHET_GRAPH"
TOOLS_ENV = "RATCHET_GRAPH_TOOLS"
SCRIPT_MODULE = "ratchet_sandboxed_script"
USAGE = "usage: python -m ratchet.sandbox.harness module:workflow | --graph"

log = logging.getLogger("ratchet.sandbox.harness")


def load(ref: str) -> WorkflowDef:
    """The workflow ``module:name`` (or ``/path/script.py:name``) names."""
    wd = _import(ref)
    if not isinstance(wd, WorkflowDef):
        raise SystemExit(f"{ref} is not a Ratchet workflow")
    return wd


def load_graph() -> WorkflowDef:
    """The interpreter of the graph in RATCHET_GRAPH, with the tools RATCHET_GRAPH_TOOLS
    names, on an app of its own (it opens no database: the journal is the channel's)."""
    from ratchet.graphs.compiled import pin
    from ratchet.graphs.registry import graph_workflow
    from ratchet.graphs.validate import load as load_definition

    tools = {
        name: _import(ref) for name, ref in json.loads(os.environ.get(TOOLS_ENV, "{}")).items()
    }
    app = SandboxedGraphApp(tools)
    graph = load_definition(json.loads(os.environ[GRAPH_ENV]), tools=tools)
    pin(graph)
    return graph_workflow(app, graph.name, graph.version, graph)


class SandboxedGraphApp:
    """What a graph runs with inside a sandbox, in place of the app (it opens no database:
    the journal is the channel's): the tools RATCHET_GRAPH_TOOLS names, no code workflows,
    and the SDKs' default model clients, whose calls go over the channel."""

    def __init__(self, tools: dict[str, object]) -> None:
        self.workflows: dict[str, WorkflowDef] = {}
        self.tools = tools
        self._clients: dict[str, object] = {}
        self._interpreters: dict[str, WorkflowDef] = {}

    def llm_client_for(self, provider: str) -> object:
        """The SDK's default client for ``provider``, wrapped, made once."""
        client = self._clients.get(provider)
        if client is None:
            from ratchet.llm.wrap import default_client

            client = self._clients[provider] = default_client(provider)
        return client

    def graph_interpreter(self, name: str) -> WorkflowDef:
        """The interpreter as the workflow of graph ``name``, made once per name."""
        wd = self._interpreters.get(name)
        if wd is None:
            from ratchet.graphs.registry import graph_workflow

            wd = self._interpreters[name] = graph_workflow(self, name, "graph")
        return wd


def _import(ref: str) -> object:
    module, _, name = ref.rpartition(":")
    if not module or not name:
        raise SystemExit(f"{USAGE} (got {ref!r})")
    if module.endswith(".py"):
        # A script's workflow (or tools): run the script as a module of another name, so
        # its ``if __name__ == "__main__":`` part (starting runs, a worker) stays out;
        # once, however many of its names are asked for.
        loaded = sys.modules.get(SCRIPT_MODULE)
        if loaded is None or getattr(loaded, "__file__", None) != module:
            spec = importlib.util.spec_from_file_location(SCRIPT_MODULE, module)
            if spec is None or spec.loader is None:
                raise SystemExit(f"cannot load {module}")
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = loaded
            spec.loader.exec_module(loaded)
    else:
        loaded = importlib.import_module(module)
    if not hasattr(loaded, name):
        raise SystemExit(f"{ref}: module {module} has no {name}")
    return getattr(loaded, name)


async def _relay(socket_path: str) -> str:
    """Serve the report channel on the sandbox's own loopback too (report-only); its URL."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def run(wd: WorkflowDef) -> int:
    env = os.environ
    run_id, sandbox_id = env["RATCHET_RUN_ID"], env["RATCHET_SANDBOX_ID"]
    socket_path = env.get("RATCHET_REPORT_SOCKET", REPORT_SOCKET)
    if env.get("RATCHET_NETWORK") == "report-only":
        env["RATCHET_REPORT_URL"] = await _relay(socket_path)
    reporter = Reporter(socket_path, env.pop("RATCHET_REPORT_TOKEN"), run_id, sandbox_id)
    routing.route = RemoteModels(reporter)
    try:
        record, events = await reporter.journal()
        if (record.workflow, record.workflow_version) != (wd.name, wd.version):
            log.error(
                "action=harness_mismatch run_id=%s workflow=%s@%s harness=%s@%s",
                run_id,
                record.workflow,
                record.workflow_version,
                wd.name,
                wd.version,
            )
            return EXIT_USAGE
        lease = Lease(run_id, env["RATCHET_WORKER_ID"], int(env["RATCHET_LEASE_EPOCH"]))
        store = cast(Store, RemoteStore(reporter, events))  # the calls a drive makes
        # The worker outside has journaled this drive's start and judges its guards.
        outcome = await drive(
            store,
            ClaimedRun(record, lease, "sandbox"),
            {wd.name: wd},
            Control(),
            StepThreads(8),
            host_judged=True,
        )
    finally:
        await reporter.close()
    return _OUTCOME_EXIT.get(outcome, EXIT_CRASHED)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="sandbox: %(message)s")
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(run(load_graph() if args[0] == GRAPH_ARG else load(args[0])))


if __name__ == "__main__":
    sys.exit(main())
