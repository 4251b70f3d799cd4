"""Shared fixtures: every storage and engine test runs against SQLite and PostgreSQL.

PostgreSQL is ``RATCHET_TEST_POSTGRES_URL`` (default: the local server's ``test``
database). Each test gets a schema of its own, dropped afterwards. When the server is not
reachable the PostgreSQL half is skipped with the reason, except under ``CI=true``, where
that fails the run.
"""

from __future__ import annotations

import gc
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg
import pytest

import ratchet
from ratchet.store import Clock, Store, make_store

if TYPE_CHECKING:
    from proc import Harness

    from ratchet.llm.server import LocalProvider

PG_URL = os.environ.get("RATCHET_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
_pg_error: str | None = None
_pg_checked = False


def _pg_unreachable() -> str | None:
    global _pg_error, _pg_checked
    if not _pg_checked:
        _pg_checked = True
        try:
            psycopg.connect(PG_URL, connect_timeout=3).close()
        except psycopg.Error as e:
            _pg_error = f"PostgreSQL unreachable at {PG_URL}: {str(e).strip().splitlines()[0]}"
    return _pg_error


def with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema of this test's own."""
    error = _pg_unreachable()
    if error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{error} (CI=true requires PostgreSQL)")
        pytest.skip(error)
    schema = f"rt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_schema(PG_URL, schema)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def bwrap() -> None:
    """Tests of real sandboxes need bubblewrap: skipped without it, except under
    ``CI=true``, where its absence fails the run."""
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("bubblewrap (bwrap) is not installed (CI=true requires it)")
        pytest.skip("bubblewrap (bwrap) is not installed")


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite:///{tmp_path}/ratchet.db"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs once per backend."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make_app(db_url: str) -> Iterator[Callable[..., ratchet.Ratchet]]:
    """Ratchet apps on this test's database (short leases, a quick sweep unless a test
    says otherwise), all shut down afterwards."""
    apps: list[ratchet.Ratchet] = []

    def make(**kw: Any) -> ratchet.Ratchet:
        kw.setdefault("lease_ttl", 3.0)
        kw.setdefault("recovery_interval", 0.5)
        app = ratchet.Ratchet(db_url, **kw)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """An opened store on this test's database, closed afterwards."""
    s = make_store(db_url, Clock())
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def h(db_url: str, tmp_path: Path) -> Iterator[Harness]:
    """A crash harness (tests/support/proc.py) on this test's database: worker processes running
    tests/support/crash_app.py, its invocation log and gates; every worker is stopped after."""
    from proc import Harness

    harness = Harness(db_url, tmp_path)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def provider() -> Iterator[tuple[LocalProvider, str]]:
    """A local model provider served over real HTTP for this test: it and its base URL."""
    from ratchet.llm.server import LocalProvider, serve

    p = LocalProvider()
    with serve(p) as base:
        yield p, base


@pytest.fixture
def collect_clients() -> Iterator[None]:
    """Collect the test's garbage inside it: a connection its apps left open would be an
    "unclosed transport" warning, an error, in the test that left it."""
    yield
    gc.collect()
