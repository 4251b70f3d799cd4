"""A small MCP server for the tests, on the ``mcp`` package's own server API (``MCPServer``),
run as a process of its own:

- ``python tests/support/mcp_server.py stdio CALLS`` speaks MCP on its stdin and stdout (the
  client starts it);
- ``python tests/support/mcp_server.py http CALLS --port-file FILE`` serves streamable HTTP at
  ``http://127.0.0.1:<port>/mcp`` on a port of the system's choosing, written to ``FILE``
  once it listens.

Each tool call appends a JSON line to ``CALLS`` (the tool and its arguments) before it
answers, so a test counts the calls the server itself got, across client processes. With
``--gate FILE``, ``forecast`` then waits until ``FILE`` exists, so a test can hold a call.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("ratchet-test-tools", log_level="WARNING")
args = argparse.Namespace(calls=None, gate=None)


def _log(tool: str, arguments: dict[str, object]) -> None:
    line = json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()}) + "\n"
    with Path(args.calls).open("a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


@server.tool()
async def forecast(city: str) -> str:
    """Tomorrow's weather in a city."""
    import anyio

    _log("forecast", {"city": city})
    deadline = time.monotonic() + 60
    while args.gate and not Path(args.gate).exists() and time.monotonic() < deadline:
        await anyio.sleep(0.01)
    return f"rain in {city}"


@server.tool()
def add(a: int, b: int) -> int:
    """The sum of two numbers."""
    _log("add", {"a": a, "b": b})
    return a + b


def _serve_http(port_file: Path) -> None:
    import anyio
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(web.serve, [sock])
            while not web.started:
                await anyio.sleep(0.01)
            # Written whole, then renamed: a reader never sees half a port.
            part = port_file.with_suffix(".part")
            part.write_text(str(sock.getsockname()[1]))
            part.rename(port_file)

    anyio.run(main)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("calls")
    parser.add_argument("--port-file")
    parser.add_argument("--gate")
    args = parser.parse_args(namespace=args)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        _serve_http(Path(args.port_file))
