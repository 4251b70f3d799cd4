"""Running ``ratchet`` commands in the test process, and a signing key of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ratchet.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def refused(code: int, *args: str) -> str:
    """A command that must fail with ``code`` and one clean line on stderr."""
    result = invoke(*args)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory of the test's own: receipts are signed with a key made there."""
    monkeypatch.delenv("RATCHET_SIGNING_KEY", raising=False)
    monkeypatch.setenv("RATCHET_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"
