"""Every Python example in README.md runs as shown.

Each ```python block runs as a script of its own, in a fresh process, in an empty folder,
against a SQLite database of its own. A block that is not meant to run alone says so on
the line before its fence: ``<!-- readme-test: continues -->`` runs it after the blocks
before it (a fragment of the same example), ``<!-- readme-test: skip REASON -->`` skips it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```python\n(?P<code>.*?)```",
                    re.DOTALL)


def examples() -> list[tuple[str, str | None]]:
    """``(code, skip reason)`` for each example, continuations joined to what they follow."""
    out: list[tuple[str, str | None]] = []
    for match in _BLOCK.finditer(README.read_text(encoding="utf-8")):
        mark, code = (match.group("mark") or "").strip(), match.group("code")
        if mark == "continues":
            if not out:
                raise AssertionError("the first README example cannot continue another")
            out[-1] = (out[-1][0] + "\n" + code, out[-1][1])
        elif mark.startswith("skip"):
            out.append((code, mark.removeprefix("skip").strip() or "marked skip"))
        elif mark:
            raise AssertionError(f"unknown readme-test mark {mark!r}")
        else:
            out.append((code, None))
    return out


EXAMPLES = examples()


def test_the_readme_has_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("code", "skip"), EXAMPLES,
                         ids=[f"example{n}" for n in range(1, len(EXAMPLES) + 1)])
def test_a_readme_example_runs_as_shown(code: str, skip: str | None, tmp_path: Path) -> None:
    if skip:
        pytest.skip(skip)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "RATCHET_DATABASE_URL": f"sqlite:///{tmp_path}/readme.db"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readme_price_table_is_the_bundled_one() -> None:
    """The prices README.md shows are those ``ratchet.llm`` charges."""
    from ratchet.llm.prices import price_for

    text = README.read_text(encoding="utf-8")
    table = text[text.index("| model | input | cached input | cache write | output |"):]
    table = table[:table.index("\n\n")]
    rows = re.findall(r"^\s*\| `([^`]+)` \|([^\n]*)\|$", table, re.MULTILINE)
    bundled = json.loads((Path(__file__).resolve().parent.parent / "src" / "ratchet" / "llm"
                          / "prices.json").read_text(encoding="utf-8"))
    models = [m for m in bundled if not m.startswith("_")]
    assert [m for m, _ in rows] == models
    for model, cells in rows:
        shown = [float(c) if c.strip() else None for c in cells.split("|")]
        price = price_for(model)
        assert price is not None
        assert shown == [price.input, price.cached_input, price.cache_write, price.output], model
