"""What a sandbox is shown of the host (ratchet.sandbox.mounts): the app's code and never
the folder it sits in, masks over Ratchet's files wherever a shown path holds them, and
a refusal for code a mask would hide. Plans only: the sandboxes themselves are tried in
tests/test_sandbox_attack.py and tests/test_isolated.py."""

from __future__ import annotations

import os
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet.errors import SandboxUnavailable
from ratchet.sandbox.backend import SpawnRequest
from ratchet.sandbox.bwrap import BubblewrapBackend
from ratchet.sandbox.mounts import Op, module_paths, plan
from ratchet.sandbox.spec import Sandbox


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """/app with agents.py, a package pkg/, a venv, a data directory and a token file."""
    app = tmp_path / "app"
    (app / "pkg").mkdir(parents=True)
    (app / "pkg" / "__init__.py").write_text("")
    (app / "agents.py").write_text("")
    (app / "venv" / "lib").mkdir(parents=True)
    (app / ".ratchet").mkdir()
    (app / ".ratchet" / "signing_key.pem").write_text("key")
    (app / "token.txt").write_text("rt_secret")
    return app


def _binds(ops: list[Op]) -> list[str]:
    return [op.path for op in ops if op.kind == "bind"]


def test_the_working_directory_is_never_mounted_only_the_code_in_it(tree: Path) -> None:
    layout = plan(
        [str(tree / "venv")],
        [str(tree / "agents.py"), str(tree / "pkg")],
        [],
        [str(tree / ".ratchet")],
        str(tree),
    )
    assert _binds(layout.ops) == [str(tree / "venv"), str(tree / "pkg"), str(tree / "agents.py")]
    # Nothing shown holds the data directory or the token: no mask is needed.
    assert [op.kind for op in layout.ops] == ["bind", "bind", "bind"]


def test_a_mount_that_holds_the_working_directory_gets_it_masked(tree: Path) -> None:
    layout = plan(
        [], [str(tree / "agents.py")], [str(tree.parent)], [str(tree / ".ratchet")], str(tree)
    )
    assert layout.ops == [
        Op("bind", str(tree.parent), str(tree.parent)),
        Op("tmpfs", str(tree)),  # the working directory: empty ...
        Op("bind", str(tree / "agents.py"), str(tree / "agents.py")),  # ... but its code
        Op("ro", str(tree)),
    ]


def test_ratchets_files_are_masked_where_a_shown_path_holds_them(tree: Path) -> None:
    # A package folder (shown) that holds the data directory and a database file.
    db = tree / "pkg" / "ratchet.db"
    db.write_text("")
    (tree / "pkg" / "data").mkdir()
    layout = plan(
        [], [str(tree / "pkg")], [], [str(tree / "pkg" / "data"), str(db), f"{db}-wal"], "/"
    )
    assert layout.ops == [
        Op("bind", str(tree / "pkg"), str(tree / "pkg")),
        Op("tmpfs", str(tree / "pkg" / "data")),
        Op("null", str(db)),  # -wal does not exist: nothing to mask
        Op("ro", str(tree / "pkg" / "data")),
    ]


def test_code_or_a_mount_inside_a_masked_data_directory_is_refused(tree: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="inside .*holds Ratchet's own files"):
        plan([str(tree)], [str(tree / ".ratchet")], [], [str(tree / ".ratchet")], "/")
    with pytest.raises(SandboxUnavailable, match="the mount .* is inside"):
        plan([], [], [str(tree / ".ratchet")], [str(tree / ".ratchet")], "/")


@pytest.fixture
def cwd_package(tree: Path) -> Iterator[Path]:
    """A package whose folder is the working directory, imported (two of its modules)."""
    (tree / "__init__.py").write_text("")
    (tree / "flows.py").write_text("")
    pkg = types.ModuleType("ratchet_test_cwd_pkg")
    pkg.__path__ = [str(tree)]
    pkg.__file__ = str(tree / "__init__.py")
    flows = types.ModuleType("ratchet_test_cwd_pkg.flows")
    flows.__file__ = str(tree / "flows.py")
    sys.modules.update({pkg.__name__: pkg, flows.__name__: flows})
    try:
        yield tree
    finally:
        del sys.modules[pkg.__name__], sys.modules[flows.__name__]


def test_a_package_that_is_the_working_directory_is_shown_file_by_file(cwd_package: Path) -> None:
    found = module_paths(str(cwd_package))
    assert str(cwd_package) not in found
    assert {str(cwd_package / "__init__.py"), str(cwd_package / "flows.py")} <= set(found)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="needs bubblewrap and a worker running as root",
)
def test_an_imported_module_others_may_not_read_is_not_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared, secret = tmp_path / "ratchet_test_shared.py", tmp_path / "ratchet_test_secret.py"
    for path, mode in ((shared, 0o644), (secret, 0o600)):
        path.write_text("")
        path.chmod(mode)
        module = types.ModuleType(path.stem)
        module.__file__ = str(path)
        sys.modules[path.stem] = module
    try:
        backend = BubblewrapBackend()
        request = SpawnRequest("sbx-test", Sandbox(), ["python"], {}, "/dev/null")
        argv = backend.command(request)[0]
    finally:
        del sys.modules[shared.stem], sys.modules[secret.stem]
    assert str(shared) in argv and str(secret) not in argv
    assert "action=sandbox_code_not_shown" in caplog.text and str(secret) in caplog.text
