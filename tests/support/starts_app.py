"""An app of one workflow for the tests of deduplicated, debounced and delayed starts, and
a process that starts one run of it when told to: ``python starts_app.py DB GO MODE KEY X``
waits for the file GO, then starts ``echo(X)`` with the dedup id KEY (MODE ``dedup``) or
the debounce KEY with a window of W seconds (MODE ``debounce:W``), and prints what came
back as one JSON line: ``{"won": RUN}`` or ``{"dup": RUN}``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from waiting import wait_for

import ratchet


def build(db_url: str) -> ratchet.Ratchet:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.workflow()
    async def echo(x: int) -> int:
        return x

    return app


def main() -> None:
    db_url, go, mode, key, x = sys.argv[1:6]
    app = build(db_url)
    try:
        _ = app.store  # connected and migrated before the go, so the starts race
        wait_for(lambda: Path(go).exists(), timeout=60, what=f"the file {go}")
        try:
            if mode == "dedup":
                said = {"won": app.start("echo", int(x), dedup_id=key)}
            else:
                wait_s = float(mode.removeprefix("debounce:"))
                debounce = ratchet.Debounce(key=key, wait_s=wait_s)
                said = {"won": app.start("echo", int(x), debounce=debounce)}
        except ratchet.DuplicateStart as e:
            said = {"dup": e.run_id}
        print(json.dumps(said), flush=True)
    finally:
        app.shutdown()


if __name__ == "__main__":
    main()
