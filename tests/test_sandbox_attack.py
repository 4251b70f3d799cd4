"""The isolated tier attacked from inside, with the server started the way
docs/how-to/isolated.md starts it: ``ratchet server --app attack_app:app`` in the app's own
folder, the default data directory (``./.ratchet``), a token saved beside the app and the
server's log written there too. A sandboxed step tries to read each of Ratchet's private
files and to write the journal itself; every attempt fails, and the run's receipt still
holds (a changed journal does not verify, and no sandbox could read the key to re-sign
it). On both backends: PostgreSQL keeps no database file, the key is in ./.ratchet all
the same."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attack_app
import httpx
import pytest
from waiting import wait_for

from ratchet.store import tenants

RESULT_S = 90
RATCHET = str(Path(sys.executable).with_name("ratchet"))


# Real sandboxes: bubblewrap must be there (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("bwrap")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> str | None:
    """None: the default database (./.ratchet/ratchet.db); else a PostgreSQL URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("pg_url"))


class Served:
    """The app in a folder of its own, a token made and saved there, and ``ratchet
    server`` running there with its log in ``server.log``."""

    def __init__(self, folder: Path, database: str | None) -> None:
        folder.mkdir()
        shutil.copy(attack_app.__file__, folder / "attack_app.py")
        self.folder = folder
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        if database is not None:
            self.env["RATCHET_DATABASE_URL"] = database
        made = subprocess.run(
            [RATCHET, "tokens", "create", "--tenant", "acme", "--scopes", "runs:read,runs:write"],
            cwd=folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        self.token = made.stdout.strip().splitlines()[-1]
        (folder / "token.txt").write_text(self.token + "\n")  # `... | tail -1 > token.txt`
        self.log_path = folder / "server.log"
        with self.log_path.open("wb") as log:  # `ratchet server ... > server.log 2>&1`
            self.proc = subprocess.Popen(
                [RATCHET, "server", "--app", "attack_app:app", "--port", "0"],
                cwd=folder,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def started() -> re.Match[str] | None:
            assert self.proc.poll() is None, f"the server exited: {self.log()}"
            return re.search(r"running on (http://\S+)", self.log())

        found = wait_for(started, timeout=60, what="the server to start", detail=self.log)
        self.base = found.group(1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base,
            timeout=RESULT_S + 30,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def ratchet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RATCHET, *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def served(tmp_path: Path, database: str | None) -> Iterator[Served]:
    server = Served(tmp_path / "agents", database)
    try:
        yield server
    finally:
        server.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_sandbox_reads_none_of_ratchets_files_and_cannot_write_the_journal(
    served: Served, database: str | None
) -> None:
    folder, data = served.folder, served.folder / ".ratchet"
    db = data / "ratchet.db"
    private = [
        data / "signing_key.pem",
        db,
        Path(f"{db}-wal"),
        Path(f"{db}-shm"),
        Path(f"{db}-journal"),
        folder / "token.txt",
        folder / "server.log",
    ]
    with served.client() as client:
        started = client.post(
            "/v1/runs",
            json={
                "workflow": "attack",
                "input": {"files": [str(p) for p in private], "folders": [str(folder), str(data)]},
            },
        )
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        result = client.get(f"/v1/runs/{run_id}/result", params={"wait": 60}).json()
        assert result["status"] == "succeeded", (result, served.log())
        out: dict[str, Any] = result["output"]
        events = client.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})

    # The first fence: none of them is there at all. The app's folder shows the app's
    # module and nothing else, the data directory is not there.
    assert out["files"] == {str(p): "denied FileNotFoundError" for p in private}, out
    assert out["folders"] == {
        str(folder): ["attack_app.py"],
        str(data): "denied FileNotFoundError",
    }, out
    # The sandbox's output goes to its worker through a pipe, not to the server's log.
    assert all(t.startswith("pipe:") for t in out["output"]), out["output"]
    # The second fence: what Ratchet made is for its own user only.
    assert _mode(data) == 0o700
    for path in [data / "signing_key.pem", *([] if database else private[1:3])]:
        assert _mode(path) == 0o600, path

    # The forged step_completed was refused, naming why, and nothing of it landed.
    assert out["forged"]["status"] == 422, out["forged"]
    assert "never started" in out["forged"]["answer"]["message"], out["forged"]
    assert "99:ghost" not in events.text and "123456" not in events.text

    # The receipt holds for the journal as it is, and not for a changed one.
    # The CLI is the operator's: it names runs by the engine's id (the tenant's, scoped).
    engine_id = tenants.scoped_id("acme", run_id)
    (folder / "receipt.json").write_text(served.ratchet("receipt", engine_id).stdout)
    (folder / "key.pem").write_text(served.ratchet("keys", "show").stdout)
    (folder / "journal.jsonl").write_text(served.ratchet("export", engine_id).stdout)
    checked = served.ratchet(
        "verify", "receipt.json", "--events", "journal.jsonl", "--public-key", "key.pem"
    )
    assert checked.returncode == 0 and checked.stdout.startswith("ok: "), checked
    lines = (folder / "journal.jsonl").read_text().splitlines()
    # What a workload that had read the key would have written: a record it changed.
    changed = [line.replace('"denied FileNotFoundError"', '"READ 2d2d"') for line in lines]
    assert changed != lines
    (folder / "changed.jsonl").write_text("\n".join(changed) + "\n")
    refused = served.ratchet(
        "verify", "receipt.json", "--events", "changed.jsonl", "--public-key", "key.pem"
    )
    assert refused.returncode == 1 and "verification failed" in refused.stderr, refused
