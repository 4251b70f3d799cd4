"""The tests' MCP server (``mcp_server.py``) as a process: started over stdio by the MCP
client itself, or over streamable HTTP by the test, and the calls it logged."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from waiting import wait_for

SCRIPT = Path(__file__).with_name("mcp_server.py")


def stdio_toolset(calls: Path, gate: Path | None = None, id: str = "tools") -> Any:
    """An ``MCPToolset`` that starts the server on its first use, speaking stdio."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    args = [str(SCRIPT), "stdio", str(calls), *(["--gate", str(gate)] if gate else [])]
    return MCPToolset(StdioTransport(command=sys.executable, args=args), id=id)


def http_toolset(url: str, id: str = "tools") -> Any:
    """An ``MCPToolset`` for the server at ``url`` (streamable HTTP)."""
    from pydantic_ai.mcp import MCPToolset

    return MCPToolset(url, id=id)


@contextmanager
def http_server(calls: Path, gate: Path | None = None) -> Iterator[str]:
    """The server over streamable HTTP, as a process of its own; yields its URL."""
    port_file = calls.with_name(calls.name + ".port")
    args = [
        sys.executable,
        str(SCRIPT),
        "http",
        str(calls),
        "--port-file",
        str(port_file),
        *(["--gate", str(gate)] if gate else []),
    ]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_file.exists() or proc.poll() is not None, what="the MCP server")
        assert proc.poll() is None, f"the MCP server exited with {proc.returncode}"
        yield f"http://127.0.0.1:{port_file.read_text()}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def calls_made(calls: Path) -> list[dict[str, Any]]:
    """The tool calls the server got, in order."""
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines() if line]
