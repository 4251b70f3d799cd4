"""``ratchet tokens`` and ``ratchet server`` as commands: a token is printed once and only
its hash is stored; a server process serves the API with an embedded worker and stops
cleanly on SIGTERM, ending its open event streams at once."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from httpx_sse import connect_sse
from test_cli import SHOP, invoke
from waiting import wait_for


def stored_hashes(db_url: str) -> list[str]:
    sql = "SELECT token_hash FROM api_tokens"
    if db_url.startswith("sqlite:///"):
        with sqlite3.connect(db_url[len("sqlite:///") :]) as conn:
            rows = conn.execute(sql).fetchall()
        conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            rows = pg.execute(sql).fetchall()
    return [r[0] for r in rows]


def test_tokens_create_list_revoke(db_url: str) -> None:
    made = invoke(
        "tokens",
        "create",
        "--tenant",
        "acme",
        "--scopes",
        "runs:read,admin",
        "--name",
        "ci",
        "--db",
        db_url,
    )
    assert made.exit_code == 0, made.output
    token = made.output.strip().splitlines()[-1]
    assert re.fullmatch(r"rt_[A-Za-z0-9_-]{40,}", token), made.output
    token_id = re.search(r"token (tok_[0-9a-f]+)", made.output)
    assert token_id is not None
    # Only the hash is kept.
    assert stored_hashes(db_url) == [hashlib.sha256(token.encode()).hexdigest()]

    listed = invoke("tokens", "list", "--json", "--db", db_url)
    assert listed.exit_code == 0 and token not in listed.output
    (row,) = json.loads(listed.output)
    assert row | {"created_at": 0} == {
        "id": token_id.group(1),
        "tenant": "acme",
        "scopes": ["runs:read", "admin"],
        "name": "ci",
        "created_at": 0,
        "revoked_at": None,
        "expires_at": None,
    }
    table = invoke("tokens", "list", "--db", db_url)
    assert token_id.group(1) in table.output and "acme" in table.output

    revoked = invoke("tokens", "revoke", token_id.group(1), "--db", db_url)
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    assert (
        json.loads(invoke("tokens", "list", "--json", "--db", db_url).output)[0]["revoked_at"]
        is not None
    )

    bad = invoke("tokens", "create", "--tenant", "acme", "--scopes", "runs:delete", "--db", db_url)
    assert bad.exit_code == 2 and "invalid scopes 'runs:delete'" in bad.output
    bad = invoke("tokens", "create", "--tenant", "no tenant", "--db", db_url)
    assert bad.exit_code == 2 and "invalid tenant" in bad.output
    unknown = invoke("tokens", "revoke", "tok_nope", "--db", db_url)
    assert unknown.exit_code == 2 and "unknown token id 'tok_nope'" in unknown.output


class ServerProc:
    """``ratchet server`` for shop.py's app, as a process, with a token of tenant acme;
    ``err`` collects its log (stderr), read up to uvicorn's line saying where it listens."""

    def __init__(self, tmp_path: Path, db_url: str, workers: int) -> None:
        (tmp_path / "shop.py").write_text(SHOP)
        made = invoke(
            "tokens",
            "create",
            "--tenant",
            "acme",
            "--scopes",
            "runs:read,runs:write",
            "--db",
            db_url,
        )
        self.token = made.output.strip().splitlines()[-1]
        env = {k: v for k, v in os.environ.items() if k != "RATCHET_DATABASE_URL"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "server",
                "--app",
                "shop:app",
                "--db",
                db_url,
                "--port",
                "0",
                "--workers",
                str(workers),
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        self.err: list[str] = []
        # uvicorn says where it listens once the app has started (port 0: any free one).
        while not (found := re.search(r"running on (http://\S+)", "".join(self.err))):
            line = self.proc.stderr.readline()
            if not line:
                self.stop()
                raise AssertionError(f"the server exited: {''.join(self.err)}")
            self.err.append(line)
        self.base = found.group(1)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base, timeout=30, headers={"Authorization": f"Bearer {self.token}"}
        )

    def sigterm(self) -> str:
        """Stop it with SIGTERM; its whole log."""
        self.proc.send_signal(signal.SIGTERM)
        self.err.append(self.proc.communicate(timeout=30)[1])
        return "".join(self.err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.mark.crash
def test_server_process_serves_runs_with_an_embedded_worker_and_stops_on_sigterm(
    db_url: str, tmp_path: Path
) -> None:
    server = ServerProc(tmp_path, db_url, workers=1)
    try:
        with server.client() as client:
            assert client.get("/readyz").json() == {"status": "ready"}
            started = client.post(
                "/v1/runs", json={"workflow": "checkout", "input": {"sku": "sku-42"}}
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            result = client.get(f"/v1/runs/{run_id}/result", params={"wait": 30}).json()
            assert result["status"] == "succeeded", result
            assert result["output"] == {"sku": "sku-42", "cents": 600}
        log = server.sigterm()
    finally:
        server.stop()
    assert server.proc.returncode == 0, log
    assert "action=server_ready workers=1 workflows=checkout" in log
    assert "action=worker_stopped" in log
    assert server.token not in log  # tokens never reach the log
    assert not (tmp_path / "not-this-one.db").exists()


@pytest.mark.crash
def test_sigterm_ends_open_event_streams_and_the_server_exits_0_at_once(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A stopping server ends its open streams at once instead of holding its shutdown to
    the graceful timeout and then cutting them with a traceback; a client resumes with
    Last-Event-ID and misses nothing."""
    # No worker: the run stays queued, its stream open with nothing more to send.
    server = ServerProc(tmp_path, sqlite_url, workers=0)
    try:
        with server.client() as client:
            r = client.post("/v1/runs", json={"workflow": "checkout", "input": {"sku": "a"}})
            assert r.status_code == 202, r.text
            seen: list[str] = []

            def follow() -> None:
                with connect_sse(
                    client, "GET", f"/v1/runs/{r.json()['run_id']}/events", timeout=60
                ) as source:
                    seen.extend(sse.event for sse in source.iter_sse())

            reader = threading.Thread(target=follow, daemon=True)
            reader.start()
            wait_for(lambda: seen, timeout=30, what="the stream to replay run_queued")
            stopped_at = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            reader.join(20)
            assert not reader.is_alive(), "the stream was not ended"
        log = server.sigterm()
        # Well within the 30 s graceful timeout a held stream would have cost.
        assert time.monotonic() - stopped_at < 15
    finally:
        server.stop()
    assert server.proc.returncode == 0, log
    assert seen == ["run_queued"]
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log
