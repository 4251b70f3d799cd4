"""Load named SQL queries from a dialect's ``.sql`` file.

A file is a sequence of blocks, each opened by a ``-- name: query_name`` line; the lines
that follow, up to the next block, are the query. Comment lines before the first block
document the dialect's data model and are ignored.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")


def load_queries(dialect: str) -> dict[str, str]:
    text = resources.files("ratchet.store").joinpath(f"sql/{dialect}.sql").read_text("utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            if name:
                queries[name] = "\n".join(lines).strip().rstrip(";")
            name, lines = match.group(1), []
        elif name and not line.lstrip().startswith("--"):
            lines.append(line)
    if name:
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def load_migrations(dialect: str) -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` for each numbered migration file, in order."""
    folder = resources.files("ratchet.store").joinpath(f"migrations/{dialect}")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d+)_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    return sorted(found)
