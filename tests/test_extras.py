"""The core installs without the extras: with psycopg, starlette, uvicorn and the SDKs made
unimportable, SQLite runs and the CLI work and import none of them, and each feature that
needs an extra says in one line which one to install.

Each case runs in a fresh interpreter whose ``sys.meta_path`` starts with a finder that
refuses the blocked modules and records every attempt to import them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ratchet.extras import EXTRAS, install_line

EVERY_EXTRA = sorted({m for modules in EXTRAS.values() for m in modules})

_BLOCKER = """
import sys
BLOCKED = set({blocked!r})
TRIED = []
STARTUP = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)

class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            TRIED.append(name)
            raise ImportError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Refuse())
"""


def run_blocked(code: str, blocked: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where ``blocked`` (top-level modules) cannot be
    imported; ``TRIED`` lists the attempts, ``STARTUP`` what was loaded before the block."""
    script = _BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(code)
    env = {**os.environ, "RATCHET_DATABASE_URL": f"sqlite:///{cwd}/extras.db"}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_sqlite_runs_and_the_cli_import_no_extra(tmp_path: Path) -> None:
    proc = run_blocked(
        """
        import json, sys
        import ratchet, ratchet.cli, ratchet.llm, ratchet.store.sqlite

        app = ratchet.Ratchet()

        @app.step
        async def double(x: int) -> int:
            return 2 * x

        @app.workflow
        async def twice(x: int) -> int:
            return await double(await double(x))

        app.launch()
        run_id = app.start(twice, 5)
        result = app.result(run_id, timeout_s=30)
        app.shutdown()

        sys.argv = ["ratchet", "runs", "--json"]
        try:
            ratchet.cli.main()
        except SystemExit as e:
            code = e.code
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print(json.dumps({"result": result, "cli": code, "tried": TRIED,
                          "startup": STARTUP, "loaded": loaded}))
    """,
        EVERY_EXTRA,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["result"] == 20
    assert report["cli"] in (0, None)
    assert report["startup"] == []
    assert report["tried"] == [], "the core tried to import an extra's module"
    assert report["loaded"] == []


CLI_CASES = {
    "postgres": (
        ["--db", "postgresql://postgres@127.0.0.1:1/none", "runs"],
        ["psycopg"],
        f"a postgresql:// database needs the postgres extra: {install_line('postgres')}",
    ),
    "llm-server": (
        ["llm-server", "--port", "0"],
        ["uvicorn"],
        "the local model provider (ratchet llm-server) needs the server extra: "
        + install_line("server"),
    ),
    "demo-openai": (
        ["demo"],
        ["openai"],
        f"ratchet demo needs the openai extra: {install_line('openai')}",
    ),
    "demo-both": (
        ["demo"],
        ["openai", "starlette"],
        f"ratchet demo needs the openai and server extras: {install_line('openai', 'server')}",
    ),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_cli_names_a_missing_extra_in_one_line(case: str, tmp_path: Path) -> None:
    args, blocked, expected = CLI_CASES[case]
    proc = run_blocked(
        f"""
        import sys
        from ratchet.cli import main
        sys.argv = ["ratchet", *{args!r}]
        main()
    """,
        blocked,
        tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {expected} (No module named "), lines[0]
    assert not (tmp_path / ".ratchet").exists(), "the demo started before the check"


LIBRARY_CASES = {
    "postgres": (
        "ratchet.Ratchet('postgresql://postgres@127.0.0.1:1/none')",
        ["psycopg_pool"],
        "postgres",
    ),
    "server": ("import ratchet.llm.server", ["starlette"], "server"),
    "pydantic-ai": ("import ratchet.integrations.pydantic_ai", ["pydantic_ai"], "pydantic-ai"),
    # A client whose class names an SDK this interpreter cannot import.
    "wrap": (
        "ratchet.llm.wrap(type('AsyncOpenAI', (), {'__module__': 'openai._client'})())",
        ["openai"],
        "openai",
    ),
    "agent-openai": ("ratchet.Agent('gpt-4.1-mini').client", ["openai"], "openai"),
    "agent-anthropic": ("ratchet.Agent('claude-sonnet-4-6').client", ["anthropic"], "anthropic"),
}


@pytest.mark.parametrize("case", sorted(LIBRARY_CASES))
def test_the_library_raises_missing_extra_naming_it(case: str, tmp_path: Path) -> None:
    expr, blocked, extra = LIBRARY_CASES[case]
    proc = run_blocked(
        f"""
        import json
        import ratchet
        try:
            {expr}
        except ratchet.MissingExtra as e:
            print(json.dumps({{"message": str(e), "import_error": isinstance(e, ImportError),
                              "chained": e.__cause__ is not None or e.__context__ is not None}}))
    """,
        blocked,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    message = report["message"]
    assert "\n" not in message
    assert install_line(extra) in message
    assert report["import_error"] and not report["chained"]


def test_an_extra_that_imports_passes_the_check() -> None:
    from ratchet.extras import require

    require("a test", *EXTRAS)


def test_the_install_line_installs_from_where_ratchet_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ratchet import extras

    # From PyPI (after a release): the distribution's name.
    monkeypatch.setattr(extras, "installed_from", lambda: None)
    assert install_line("openai", "server") == "pip install 'ratchet-engine[openai,server]'"
    # From a clone, editable or not, or from a wheel: the same place, which PyPI is not.
    monkeypatch.setattr(extras, "installed_from", lambda: ("/src/ratchet", True))
    assert install_line("openai", "server") == "pip install -e '/src/ratchet[openai,server]'"
    wheel = "/tmp/dist/ratchet_engine-0.1.0-py3-none-any.whl"
    monkeypatch.setattr(extras, "installed_from", lambda: (wheel, False))
    assert install_line("server") == f"pip install '{wheel}[server]'"


def test_this_copy_knows_it_came_from_a_clone() -> None:
    from ratchet.extras import installed_from

    # The test environment installs the checkout with pip install -e (make).
    source = installed_from()
    assert source is not None, "installed from an index?"
    path, editable = source
    assert editable and (Path(path) / "pyproject.toml").is_file()
