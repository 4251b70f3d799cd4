"""Every example in README.md and the documentation under docs/ runs as shown.

Each ```python block runs as a script of its own, in a fresh process, in an empty folder,
against a SQLite database of its own. A block that is not meant to run alone says so on
the line before its fence:

- ``<!-- readme-test: continues -->`` runs it after the blocks before it (a fragment of
  the same example);
- ``<!-- readme-test: skip REASON -->`` skips it;
- ``<!-- readme-test: file NAME -->`` is a file the page asks the reader to save (a module
  a worker imports): it is checked to compile, and saved as NAME beside every later
  example of the same page.

Every ``ratchet`` command line in a shell block names a command and options that exist, and
the generated CLI and HTTP references cover every command and route.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
_BLOCK = re.compile(
    r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.DOTALL
)
_SHELL = re.compile(r"```(?:sh|bash|console|shell)\n(?P<code>.*?)```", re.DOTALL)


@dataclass
class Example:
    """One runnable example: its code, why it is skipped, and the files saved beside it."""

    page: str
    code: str
    skip: str | None = None
    files: dict[str, str] = field(default_factory=dict)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def examples(page: Path) -> tuple[list[Example], dict[str, str]]:
    """The page's examples, continuations joined to what they follow, and its files."""
    out: list[Example] = []
    files: dict[str, str] = {}
    for match in _BLOCK.finditer(page.read_text(encoding="utf-8")):
        mark, code = (match.group("mark") or "").strip(), match.group("code")
        if mark == "continues":
            if not out:
                raise AssertionError(f"{_name(page)}: the first example cannot continue another")
            out[-1].code += "\n" + code
        elif mark.startswith("skip"):
            out.append(
                Example(_name(page), code, mark.removeprefix("skip").strip() or "marked skip")
            )
        elif mark.startswith("file "):
            files[mark.removeprefix("file ").strip()] = code
        elif mark:
            raise AssertionError(f"{_name(page)}: unknown readme-test mark {mark!r}")
        else:
            out.append(Example(_name(page), code, files=dict(files)))
    return out, files


EXAMPLES: list[Example] = []
FILES: list[tuple[str, str, str]] = []
for _page in PAGES:
    _examples, _files = examples(_page)
    EXAMPLES += _examples
    FILES += [(_name(_page), name, code) for name, code in _files.items()]


def _ids(items: list[Any], page: Any) -> list[str]:
    counts: dict[str, int] = {}
    out = []
    for item in items:
        counts[page(item)] = counts.get(page(item), 0) + 1
        out.append(f"{page(item)}:{counts[page(item)]}")
    return out


def test_the_readme_and_the_docs_have_examples() -> None:
    assert sum(e.page == "README.md" for e in EXAMPLES) >= 1
    assert sum(e.page != "README.md" for e in EXAMPLES) >= 10


@pytest.mark.parametrize("example", EXAMPLES, ids=_ids(EXAMPLES, lambda e: e.page))
def test_an_example_runs_as_shown(example: Example, tmp_path: Path) -> None:
    if example.skip:
        pytest.skip(example.skip)
    for name, code in example.files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    env = {**os.environ, "RATCHET_DATABASE_URL": f"sqlite:///{tmp_path}/readme.db"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("page", "name", "code"), FILES, ids=[f"{page}:{name}" for page, name, _ in FILES]
)
def test_a_file_a_page_asks_to_save_compiles(page: str, name: str, code: str) -> None:
    compile(code, f"{page}:{name}", "exec")


def test_the_llm_price_table_is_the_bundled_one() -> None:
    """The prices the LLM guide shows are those ``ratchet.llm`` charges."""
    from ratchet.llm.prices import price_for

    text = (DOCS / "how-to" / "llm.md").read_text(encoding="utf-8")
    table = text[text.index("| model | input | cached input | cache write | output |") :]
    table = table[: table.index("\n\n")]
    rows = re.findall(r"^\s*\| `([^`]+)` \|([^\n]*)\|$", table, re.MULTILINE)
    bundled = json.loads(
        (ROOT / "src" / "ratchet" / "llm" / "prices.json").read_text(encoding="utf-8")
    )
    models = [m for m in bundled if not m.startswith("_")]
    assert [m for m, _ in rows] == models
    for model, cells in rows:
        shown = [float(c) if c.strip() else None for c in cells.split("|")]
        price = price_for(model)
        assert price is not None
        assert shown == [price.input, price.cached_input, price.cache_write, price.output], model


# --- the CLI and HTTP references ---------------------------------------------------------


def _reference() -> ModuleType:
    """docs/scripts/gen_reference.py, which the site build runs, imported as a module."""
    spec = importlib.util.spec_from_file_location(
        "gen_reference", DOCS / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _command_lines(text: str) -> list[str]:
    """The ``ratchet ...`` commands of a page's shell blocks, one string each."""
    out = []
    for block in _SHELL.finditer(text):
        code = block.group("code").replace("\\\n", " ")
        for line in code.splitlines():
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"\s(?:\|\|?|&&|;|&)\s|\s&$", line):
                words = part.split("#", 1)[0].split()
                # A redirection ends the command's own words (> server.log 2>&1).
                cut = [i for i, w in enumerate(words) if re.match(r"(\d|&)?>", w)]
                words = words[: cut[0]] if cut else words
                while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                    words.pop(0)  # VAR=value before the command
                if words and words[0] == "ratchet":
                    out.append(" ".join(words))
    return out


def _check_command(line: str, root: Any) -> str | None:
    """Why ``line`` is not a command line ``ratchet`` accepts, or None. The words are
    parsed as the CLI parses them (commands, options, values), but nothing is run."""
    import typer

    try:
        ctx = root.make_context("ratchet", shlex.split(line)[1:])
        while hasattr(ctx.command, "resolve_command"):
            # typer's copy of click keeps a group's unparsed words here (click 8.2's name)
            rest = [*getattr(ctx, "_protected_args", ()), *ctx.args]
            if not rest:
                break
            name, command, args = ctx.command.resolve_command(ctx, rest)
            ctx = command.make_context(name, args, parent=ctx)
    except typer.Exit:
        return None  # --help, --version
    except Exception as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        return f"{line}: {message}"
    return None


def test_every_ratchet_command_the_docs_show_exists() -> None:
    root = _reference().root_command()
    lines = [
        (_name(p), line) for p in PAGES for line in _command_lines(p.read_text(encoding="utf-8"))
    ]
    assert len(lines) >= 20
    problems = [f"{page}: {why}" for page, line in lines if (why := _check_command(line, root))]
    assert not problems, "\n".join(problems)


def test_the_command_check_catches_a_wrong_verb_or_flag() -> None:
    root = _reference().root_command()
    assert _check_command("ratchet worker app:app --concurrency 4 -q a", root) is None
    assert _check_command("ratchet --db sqlite:///x.db receipts settle K --failed", root) is None
    assert _check_command("ratchet receipts RUN", root) is None  # a run id, not a command
    assert "No such command 'wrokers'" in (_check_command("ratchet wrokers", root) or "")
    assert "No such option: --fast" in (_check_command("ratchet worker a:app --fast", root) or "")
    assert "No such command 'delete'" in (_check_command("ratchet tokens delete 1", root) or "")
    assert "Invalid value for '--concurrency'" in (
        _check_command("ratchet worker a:app --concurrency many", root) or ""
    )
    assert _command_lines("```sh\nFOO=1 ratchet runs --json | jq .   # all\n```\n") == [
        "ratchet runs --json"
    ]


def test_the_cli_reference_shows_every_command_and_option() -> None:
    module = _reference()
    page = module.cli_markdown()
    root = module.root_command()
    import typer

    def walk(command: Any, ctx: Any, path: str) -> None:
        assert f"### `{path}`" in page, path
        for param in command.params:
            for opt in getattr(param, "opts", ()):
                if opt.startswith("-") and opt != "--help":
                    assert opt in page.split(f"### `{path}`", 1)[1], (path, opt)
        for name in getattr(command, "list_commands", lambda _: [])(ctx):
            sub = command.get_command(ctx, name)
            walk(sub, typer.Context(sub, info_name=name, parent=ctx), f"{path} {name}")

    walk(root, typer.Context(root, info_name="ratchet"), "ratchet")


def test_the_http_reference_shows_every_route_and_schema() -> None:
    module = _reference()
    spec = module.openapi_spec()
    page = module.http_markdown(spec)
    for path, methods in spec["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {path}`" in page, (method, path)
    for name in spec["components"]["schemas"]:
        assert f"### {name}\n" in page, name
    assert "/v1/runs" in spec["paths"]


# --- the psql recipes --------------------------------------------------------------------


@pytest.mark.postgres
def test_every_psql_recipe_runs_on_the_schema(pg_url: str) -> None:
    """Each statement of the operations page's ```sql blocks runs on a migrated schema
    holding a finished run, so a renamed column or table fails here, not for an operator."""
    import psycopg

    import ratchet

    app = ratchet.Ratchet(pg_url)

    @app.step()
    async def one() -> int:
        return 1

    @app.workflow()
    async def recipe() -> int:
        return await one()

    with app:
        app.launch()
        run_id = app.start(recipe)
        assert app.result(run_id, timeout_s=60) == 1
    page = (DOCS / "operations" / "psql.md").read_text(encoding="utf-8")
    statements = [
        s.strip()
        for block in re.findall(r"```sql\n(.*?)```", page, re.DOTALL)
        for s in block.split(";")
        if s.strip()
    ]
    assert len(statements) >= 10
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in statements:
            try:
                conn.execute(statement.replace("RUN_ID", run_id)).fetchall()
            except psycopg.Error as e:
                raise AssertionError(f"{statement}\n{e}") from e


# --- the metrics page --------------------------------------------------------------------


async def test_the_metrics_page_lists_what_metrics_serves(tmp_path: Path) -> None:
    """The table on the operations page names exactly the metrics ``/metrics`` renders."""
    from ratchet.api.metrics import Metrics
    from ratchet.store import Clock, make_store

    store = make_store(f"sqlite:///{tmp_path}/metrics.db", Clock())
    await store.open()
    try:
        body, _ = await Metrics().render(store)
    finally:
        await store.close()
    served = {
        name
        for name in re.findall(r"^# TYPE (\S+) ", body.decode(), re.MULTILINE)
        if not name.endswith("_created")
    }  # the client library's creation stamps
    page = (DOCS / "operations" / "metrics.md").read_text(encoding="utf-8")
    table = page[page.index("| metric | type |") :]
    shown = set(re.findall(r"^\| `([a-z_]+)` \|", table[: table.index("\n\n")], re.MULTILINE))
    assert shown == served


# --- the site's navigation ---------------------------------------------------------------


def test_every_page_is_in_the_nav() -> None:
    """A page under docs/ that the nav does not list is built but hard to find: each one
    is listed in mkdocs.yml (pages merged with their features get their entry then)."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def listed(entries: Any) -> set[str]:
        if isinstance(entries, str):
            return {entries}
        if isinstance(entries, list):
            return set().union(*(listed(e) for e in entries))
        return set().union(*(listed(v) for v in entries.values()))

    nav = listed(config["nav"])
    generated = {"reference/cli.md", "reference/http.md"}  # written by gen_reference.py
    pages = {
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if p.relative_to(DOCS).parts[0] != "scripts"
    }
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages - generated == set(), "nav entries with no page"


# --- what is promised ------------------------------------------------------------------

# Claims a step running at a SIGKILL disproves (its body runs again, at least once).
_OVERCLAIMS = ("fires no side effect twice", "never run twice", "never runs twice")
_PROMISES = ("exactly once", "at least once", "at most once", "same `Idempotency-Key`")


@pytest.mark.parametrize("page", [README, DOCS / "index.md"], ids=_name)
def test_the_headline_states_the_guarantees_as_they_hold(page: Path) -> None:
    """Next to the headline: completion exactly once, step bodies at least once, deliveries
    at most once, a re-sent model call under the same key; and no claim a kill disproves."""
    text = page.read_text(encoding="utf-8")
    # The headline and what follows it, before any example, as one line of words.
    head = " ".join(text[: text.index("```")].replace("**", "").split())
    for claim in _OVERCLAIMS:
        assert claim not in text.lower(), f"{_name(page)} still claims {claim!r}"
    for promise in _PROMISES:
        assert promise in head, f"{_name(page)}'s headline does not say {promise!r}"
    assert "concepts/guarantees.md" in head


def test_the_bill_table_says_what_billed_once_rests_on() -> None:
    """The README's bill table (written by the bench) says that billed once is the
    provider's doing, and which providers do not document it."""
    from bench import readme

    block = README.read_text(encoding="utf-8")
    block = block[block.index(readme.START) : block.index(readme.END)]
    after = block[block.index("| system | calls sent |") :]
    assert readme.BILL_NOTE in after
    for name in ("local provider", "OpenAI", "Anthropic", "Idempotency-Key"):
        assert name in readme.BILL_NOTE
    page = (DOCS / "concepts" / "guarantees.md").read_text(encoding="utf-8")
    assert "Which providers honour `Idempotency-Key`" in page
