"""The dashboard's time to first render, measured in Chromium.

``python -m bench.dashboard [--events 10000] [--runs 1000] [--repeats 5] [--json]`` fills a fresh
SQLite database with one run of about ``--events`` journal events (a workflow of
``(events - 3) / 2`` steps) and ``--runs`` one-step runs, all driven by a real worker; serves
it with ``ratchet server``'s app on uvicorn; signs in with Playwright on the system's
Chromium (``/usr/bin/chromium``, or ``RATCHET_BENCH_CHROMIUM``) and loads, ``--repeats``
times each:

* the run's page, until its waterfall is painted (the page's own ``ratchet:painted``
  performance mark, set after the frame that follows the first rows' drawing), and until
  all its rows are in the DOM (``ratchet:complete``: past the first screenful, rows are
  added a chunk per task after the first paint);
* the runs list (first page of 50, with the counts over all runs), until its first
  contentful paint.

Times are from the start of navigation, as the browser measures them; the first load
(cold: scripts and stylesheet not cached yet) is reported beside the median. Prints a
Markdown table and writes it to ``bench/results/dashboard.md``; with ``--json``, prints the
samples as one JSON line instead (what ``python -m bench.run`` records).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

import ratchet
from bench.report import DASHBOARD_ROWS
from ratchet.server import create_app
from ratchet.store import tokens

RESULTS = Path(__file__).parent / "results"
CHROMIUM = os.environ.get("RATCHET_BENCH_CHROMIUM", "/usr/bin/chromium")


def build(url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(url)

    @app.step
    async def tick(i: int) -> int:
        return i

    # A run of thousands of steps is what is measured, not a runaway: no step ceiling.
    @app.workflow(guards=ratchet.Guards(max_steps=None))
    async def long(n: int) -> int:
        return sum([await tick(i) for i in range(n)])

    @app.workflow()
    async def one() -> int:
        return await tick(1)

    return app


def fill(url: str, events: int, runs: int) -> str:
    """The database with one long run and ``runs`` short ones, all finished; the long
    run's id."""
    app = build(url)
    try:
        app.launch(concurrency=64)
        long_id = app.start("long", (events - 3) // 2)
        ids = [app.start("one") for _ in range(runs)]
        for run_id in [long_id, *ids]:
            app.result(run_id, timeout_s=600)
        return long_id
    finally:
        app.shutdown()


@contextmanager
def serving(app: ratchet.Ratchet) -> Iterator[str]:
    config = uvicorn.Config(
        create_app(app),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        access_log=False,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


DONE = "performance.getEntriesByName('ratchet:complete').length > 0"
MARK_MS = "performance.getEntriesByName('ratchet:{}')[0].startTime"
HTML_MS = "performance.getEntriesByType('navigation')[0].responseEnd"
FCP_MS = (
    "performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint').startTime"
)


def measure(base: str, secret: str, run_id: str, repeats: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {"html": [], "run": [], "rows": [], "list": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        # The pages forbid eval (CSP); Playwright's wait_for_function needs it.
        page = browser.new_page(base_url=base, bypass_csp=True)
        page.set_default_timeout(60_000)
        page.goto("/signin")
        page.get_by_label("API token").fill(secret)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/runs")
        for _ in range(repeats):
            page.goto(f"/runs/{run_id}", wait_until="commit")
            page.wait_for_function(DONE)
            out["html"].append(float(page.evaluate(HTML_MS)))
            out["run"].append(float(page.evaluate(MARK_MS.format("painted"))))
            out["rows"].append(float(page.evaluate(MARK_MS.format("complete"))))
            page.goto("/runs", wait_until="load")
            page.wait_for_function("performance.getEntriesByType('paint').length > 1")
            out["list"].append(float(page.evaluate(FCP_MS)))
        browser.close()
    return out


def collect(events: int, runs: int, repeats: int) -> dict[str, Any]:
    """Fill a database, serve it and load its pages ``repeats`` times: the samples (ms from
    the start of navigation, the cold first load first) and what was measured; or
    ``skipped`` when there is no Chromium or Playwright."""
    if not Path(CHROMIUM).exists():
        return {"skipped": f"no Chromium at {CHROMIUM} (apt-get install chromium)"}
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return {"skipped": "Playwright is not installed (the bench extra)"}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        began = time.monotonic()
        run_id = fill(url, events, runs)
        filled = time.monotonic() - began
        app = build(url)
        try:
            n_events = len(app.events(run_id))
            _, secret = app.portal.call(tokens.create_token(app.store, "default", ("admin",)))
            with serving(app) as base:
                times = measure(base, secret, run_id, repeats)
        finally:
            app.shutdown()
    return {
        "events": n_events,
        "runs": runs + 1,
        "repeats": repeats,
        "fill_s": round(filled, 1),
        "chromium": CHROMIUM,
        "ms": times,
        "load_average": os.getloadavg(),
    }


def table(result: dict[str, Any]) -> list[str]:
    """The Markdown table of one :func:`collect` result."""
    lines = ["| page | first load (cold) ms | median ms | min–max ms |", "|---|---|---|---|"]
    for key, label in DASHBOARD_ROWS:
        xs = result["ms"][key]
        lines.append(
            f"| {label.format(events=result['events'], runs=result['runs'])} | "
            f"{xs[0]:.0f} | {statistics.median(xs):.0f} | "
            f"{min(xs):.0f}–{max(xs):.0f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--json", action="store_true", help="print the samples as JSON; write no file"
    )
    args = parser.parse_args()
    result = collect(args.events, args.runs, args.repeats)
    if args.json:
        print(json.dumps(result))
        return
    if "ms" not in result:
        raise SystemExit(result["skipped"])
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# Dashboard: time to first render",
        "",
        f"{now}; {os.cpu_count()} cores, {platform.platform()}; SQLite; Chromium "
        f"({CHROMIUM}), headless; {args.repeats} loads each, after sign-in; "
        f"database filled in {result['fill_s']:.1f} s.",
        "",
        *table(result),
    ]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dashboard.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
