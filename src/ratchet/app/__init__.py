"""The application object: decorators, the client calls, and embedded workers.

:class:`Ratchet` is assembled from one module per job: ``base`` (the database, the loop,
the signing key), ``definitions`` (workflows, steps, tools, graphs), ``starting`` (starting
runs), ``forking`` (forks, resumes and diffs of runs), ``client`` (the calls on runs, as
coroutines), ``blocking`` (their blocking twins), ``queues`` (queues and their limits) and
``embedded`` (workers in this process)."""

from __future__ import annotations

from ratchet.app.blocking import Blocking
from ratchet.app.embedded import Embedded
from ratchet.app.queues import Queues
from ratchet.app.scheduling import Scheduling


class Ratchet(Embedded, Blocking, Scheduling, Queues):
    """A Ratchet application: its workflows, its steps and its database.

    ``database_url`` defaults to ``RATCHET_DATABASE_URL``, else
    ``sqlite:///.ratchet/ratchet.db``. A malformed URL is refused here, before anything
    is opened. ``read_only=True`` only reads: a missing database is an error instead of
    being created, and a SQLite file is opened read-only.
    """


__all__ = ["Ratchet"]
