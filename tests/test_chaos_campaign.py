"""The chaos campaign's own machinery: which PostgreSQL cluster it faults (by default one of
its own, never the shared server), its fault lanes, and the per-run recovery breakdown by
cause."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from random import Random
from urllib.parse import urlsplit

import psycopg
import pytest
from conftest import PG_URL
from test_chaos_check import chain, good_specs
from waiting import wait_for

from chaos.campaign import Campaign, Config, expected_s
from chaos.cluster import bindir
from chaos.faults import Postgres, cluster_on_port, kill_a_sandbox, live_sandboxes
from chaos.lanes import Lane, lane_seconds
from chaos.plan import Fault
from chaos.recovery import Recovery, Window, by_cause, cause, recoveries

LISTING = """\
15 chaos   5433 online postgres /var/lib/postgresql/15/chaos /var/log/postgresql/chaos.log
15 main    5432 online postgres /var/lib/postgresql/15/main  /var/log/postgresql/main.log
16 staging 5434 down   postgres /var/lib/postgresql/16/staging /var/log/postgresql/staging.log
"""

# -- the cluster follows the URL -------------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "found"),
    [(5432, ("15", "main")), (5433, ("15", "chaos")), (5434, ("16", "staging")), (5999, None)],
)
def test_the_cluster_is_the_one_on_the_urls_port(port: int, found: tuple[str, str] | None) -> None:
    assert cluster_on_port(port, LISTING) == found


@pytest.mark.skipif(shutil.which("pg_ctlcluster") is None, reason="no pg_ctlcluster here")
def test_a_url_no_local_cluster_serves_is_never_restarted() -> None:
    pg = Postgres("postgresql://postgres@127.0.0.1:5999/postgres", "chaos_nothing")
    assert pg.version is None
    assert pg.unavailable is not None and "5999" in pg.unavailable


def _has_server_binaries() -> bool:
    try:
        bindir()
    except RuntimeError:
        return False
    return True


def _started_at(url: str) -> object:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


@pytest.mark.postgres
@pytest.mark.skipif(not _has_server_binaries(), reason="no PostgreSQL server binaries here")
def test_a_postgres_campaign_faults_a_cluster_of_its_own_and_removes_it(pg_url: str) -> None:
    """By default (no --postgres) the campaign's server is one it started on a free port in
    a folder of its own, fsync on; its restarts leave the shared server alone; its teardown,
    even after an error (Ctrl-C), stops the cluster and deletes it."""
    shared_since = _started_at(PG_URL)
    campaign = Campaign(Config(backend="postgres", seed=7, runs=1, faults=1, skip=("partition",)))
    try:
        campaign.setup()
        own = campaign.private
        assert own is not None and campaign.pg is not None
        port = urlsplit(campaign.url).port
        assert port == own.port and port != urlsplit(PG_URL).port and port != 5432
        with psycopg.connect(campaign.url, connect_timeout=5) as conn:
            shown = {
                name: conn.execute(f"SHOW {name}").fetchone()
                for name in ("data_directory", "fsync", "listen_addresses")
            }
        assert shown == {
            "data_directory": (str(own.data),),
            "fsync": ("on",),
            "listen_addresses": ("127.0.0.1",),
        }
        own_since = _started_at(campaign.url)
        campaign.pg.restart()  # the fault a campaign injects
        assert _started_at(campaign.url) != own_since
        assert _started_at(PG_URL) == shared_since
    finally:
        campaign.teardown(clean=False)  # what an error or Ctrl-C leaves to teardown
        shutil.rmtree(campaign.workdir, ignore_errors=True)
    assert not own.root.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(own.admin_url, connect_timeout=3).close()


# -- lanes -----------------------------------------------------------------------------------


def test_a_lane_injects_its_faults_in_order_one_at_a_time_beside_the_schedule() -> None:
    release = threading.Event()
    applied: list[str] = []
    running = 0
    overlap = False
    lock = threading.Lock()

    def apply(fault: Fault) -> None:
        nonlocal running, overlap
        with lock:
            running += 1
            overlap = overlap or running > 1
        if fault.kind == "pg_stop":
            assert release.wait(10)  # a fault that holds its lane while it heals
        applied.append(fault.kind)
        with lock:
            running -= 1

    lane = Lane("server", apply)
    for kind in ("pg_stop", "pg_terminate", "pg_restart"):
        lane.put(Fault(kind, 0.0))
    # The caller was not held: the stop is still healing, the others wait their turn.
    assert applied == [] and lane.backlog() >= 1
    release.set()
    lane.close()
    assert applied == ["pg_stop", "pg_terminate", "pg_restart"]
    assert not overlap


def test_a_lane_that_fell_behind_keeps_each_faults_gap_after_the_last_healed() -> None:
    ends: list[float] = []
    starts: list[float] = []

    def apply(fault: Fault) -> None:
        starts.append(time.monotonic())
        time.sleep(0.05)
        ends.append(time.monotonic())

    lane = Lane("server", apply)
    for _ in range(3):
        lane.put(Fault("disk_full", 0.2))
    lane.close()
    assert all(start - end >= 0.2 for end, start in zip(ends, starts[1:], strict=False))


def test_the_submit_window_covers_the_busiest_lane() -> None:
    gaps = [Fault("worker_kill", 0.5), Fault("worker_pause", 0.5, {"ttls": 2.0})]
    assert expected_s(gaps) == pytest.approx(1.0)
    stops = [Fault("pg_stop", 0.1) for _ in range(4)]
    busy = lane_seconds(stops, ttl=2.0)["server"]
    assert busy > 4 * 2 * 2.0  # each stop stays down two TTLs, then starts
    assert expected_s(stops) == pytest.approx(busy)
    assert lane_seconds([Fault("partition", 0.1, {"ttls": 5.0})], ttl=2.0) == {
        "partition": pytest.approx(10.1)
    }


def test_a_long_campaign_is_denser_on_a_larger_fleet() -> None:
    short = Config(backend="sqlite", seed=1, runs=600, faults=170)
    long = Config.long_campaign(backend="sqlite", seed=1, runs=2500, faults=2500)
    assert long.long and long.workers > short.workers
    assert sum(long.gap_s) < sum(short.gap_s)
    pg = Config.long_campaign(backend="postgres", seed=1, runs=2500, faults=2500)
    # Five workers of 8: PostgreSQL's max_connections, and no storm of sandbox starts.
    assert pg.concurrency == long.concurrency == short.concurrency == 8


# -- recovery by cause -----------------------------------------------------------------------


def test_each_held_run_recovers_at_its_next_drive_with_who_took_it() -> None:
    events = {"run-1": chain(good_specs())}  # drive 1 by w0-1 at t0+2, a sweep by w1-1 at +6
    [r] = recoveries(events, [(1005.0, "w0-1", "worker_kill")])
    assert (r.seconds, r.fault, r.reason, r.by) == (1.0, "worker_kill", "sweep", "w1-1")
    assert recoveries(events, [(1005.0, "w2-1", "worker_kill")]) == []
    assert recoveries(events, [(1001.0, "w0-1", "worker_kill")]) == []


def rec(
    fault: str = "worker_kill", reason: str = "sweep", at: float = 100.0, seconds: float = 3.0
) -> Recovery:
    return Recovery(at, seconds, fault, "r", reason, "w1-1")


@pytest.mark.parametrize(
    ("r", "workflow", "windows", "expected"),
    [
        (rec(), "flow", [], "lease_expiry"),
        (rec(reason="reclaim"), "flow", [], "reclaim"),
        (rec(), "audit", [], "v2_only"),
        (rec(), "boxed", [], "isolated"),
        (rec(), "flow", [Window(101.0, 102.0, "pg_stop")], "db_outage"),
        (rec(), "flow", [Window(90.0, 99.0, "pg_stop")], "lease_expiry"),  # over before it
        (rec(), "flow", [Window(104.0, 105.0, "disk_full")], "lease_expiry"),  # after it
        (rec(fault="partition_5xTTL"), "audit", [Window(101.0, 102.0, "pg_stop")], "partition"),
    ],
)
def test_a_recovery_is_put_down_to_what_bounded_it(
    r: Recovery, workflow: str, windows: list[Window], expected: str
) -> None:
    assert cause(r, workflow, windows, v2_only=("audit",), isolated=("boxed",)) == expected


def test_recoveries_are_grouped_by_cause() -> None:
    recs = [
        rec(seconds=2.5),
        rec(reason="reclaim", seconds=1.0),
        rec(seconds=9.0),
        rec(reason="takeover", seconds=0.5),
    ]
    grouped = by_cause(recs, {"r": "flow"}, [Window(105.0, 106.0, "pg_restart")])
    assert grouped == {
        "lease_expiry": [2.5],
        "reclaim": [1.0],
        "db_outage": [9.0],
        "death_seen": [0.5],
    }


def test_a_database_outage_long_after_the_fault_is_not_its_cause() -> None:
    late = Window(110.0, 112.0, "pg_restart")  # 10 s into a 30 s wait
    r = rec(seconds=30.0)
    assert cause(r, "flow", [late]) == "db_outage"
    assert cause(r, "flow", [late], within=6.0) == "lease_expiry"
    assert cause(r, "flow", [Window(103.0, 104.0, "pg_stop")], within=6.0) == "db_outage"


# -- sandbox kills -----------------------------------------------------------------------------


def test_a_sandbox_kill_only_targets_sandboxes_of_the_campaigns_workers() -> None:
    # A process that looks like a sandbox's outermost bwrap (its command line), a child of
    # this test process: the campaign's workers are other processes.
    fake = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "--die-with-parent",
            "RATCHET_SANDBOX_ID",
        ]
    )
    try:
        wait_for(
            lambda: fake.pid in live_sandboxes({os.getpid()}) or None, what="the process to show up"
        )
        assert fake.pid not in live_sandboxes({os.getpid() + 1_000_000})
        assert not kill_a_sandbox(Random(1), {os.getpid() + 1_000_000})
        assert fake.poll() is None  # not ours to kill: left alone
        assert kill_a_sandbox(Random(1), {os.getpid()})
        assert fake.wait(timeout=10) == -signal.SIGKILL
    finally:
        if fake.poll() is None:
            fake.kill()
        fake.wait()
