"""A scheduled workflow, and the worker process that fires it (``tests/test_schedules_procs.py``).

Run as a script: one worker, configured from the environment as ``crash_app``'s is. Every
worker of this app fires the schedule ``tick`` (every second); the runs it makes show
whether each tick got exactly one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import ratchet


def build(db_url: str, **kw: Any) -> ratchet.Ratchet:
    app = ratchet.Ratchet(db_url, **kw)

    @app.schedule(every="1s", missed="skip")
    @app.workflow()
    async def tick(at: datetime) -> str:
        return at.isoformat()

    return app


# For `ratchet schedules --app schedule_app:app --db URL` (the command's --db is used).
app = build("sqlite:///.ratchet/schedule_app.db")


if __name__ == "__main__":
    from crash_app import main

    main(build)
