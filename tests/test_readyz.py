"""``/readyz`` follows the database after the server started: 503, in the one error shape,
while the database is lost (the SQLite file removed or replaced, the PostgreSQL schema
dropped, its connections cut and refused), and 200 again once it is back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from conftest import PG_URL
from serving import serving
from waiting import wait_for

import ratchet
from ratchet.store import make_store


def probe(client: httpx.Client) -> tuple[int, str]:
    """/readyz's status and message; a 503 must be the one error shape."""
    r = client.get("/readyz")
    if r.status_code == 200:
        assert r.json() == {"status": "ready"}
        return 200, ""
    assert r.status_code == 503, r.text
    body = r.json()
    assert set(body) == {"error", "message", "details"} and body["error"] == "unavailable"
    assert "Traceback" not in r.text
    return 503, str(body["message"])


def not_ready(client: httpx.Client, reason: str) -> None:
    status, message = probe(client)
    assert status == 503 and reason in message, message


@pytest.fixture
def served(db_url: str) -> Iterator[httpx.Client]:
    app = ratchet.Ratchet(db_url)
    try:
        with (
            serving(app, ready_timeout_s=2.0) as base,
            httpx.Client(base_url=base, timeout=30) as client,
        ):
            assert probe(client) == (200, "")
            yield client
    finally:
        app.shutdown()


async def migrate(url: str) -> None:
    store = make_store(url)
    await store.open()
    await store.close()


async def test_readyz_answers_503_while_the_database_is_lost_and_200_once_back(
    served: httpx.Client, db_url: str
) -> None:
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///") :])
        aside = path.with_name("aside.db")
        path.rename(aside)
        not_ready(served, "not ready: the SQLite file cannot be found")
        # A new file at the path is not the one the open connections write to.
        path.write_bytes(b"")
        not_ready(served, "not ready: the SQLite file was replaced since it was opened")
        path.unlink()
        aside.rename(path)
    else:
        schema = db_url.rsplit("search_path%3D", 1)[1]  # conftest's schema of this test
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
            not_ready(served, "not ready: cannot read the applied migrations")
            admin.execute(f'CREATE SCHEMA "{schema}"')
        not_ready(served, "not ready: cannot read the applied migrations")
        await migrate(db_url)  # another process brings the schema back
    assert probe(served) == (200, "")


@pytest.mark.postgres
def test_readyz_answers_503_while_postgresql_cuts_and_refuses_connections() -> None:
    """The server's own database: its connections terminated and new ones refused (the
    server is not restarted), then accepted again."""
    name = f"rt_ready_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as e:
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}: {e}")
    url = urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        app = ratchet.Ratchet(url)
        try:
            with (
                serving(app, ready_timeout_s=2.0) as base,
                httpx.Client(base_url=base, timeout=30) as client,
            ):
                assert probe(client) == (200, "")
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                # The pool's connection is cut: the first probe fails on it; later ones
                # wait for a new connection the server refuses, until the timeout.
                not_ready(client, "not ready: ")
                not_ready(client, "not ready: ")
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
                wait_for(
                    lambda: probe(client)[0] == 200, timeout=60, what="/readyz to answer 200 again"
                )
        finally:
            app.shutdown()
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
