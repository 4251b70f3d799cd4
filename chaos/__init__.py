"""Chaos campaigns: real worker processes, real databases, injected faults.

``python -m chaos.run`` drives worker processes (:mod:`chaos.app`) against SQLite and
PostgreSQL while killing, pausing and partitioning them, restarting the database and
filling its disk; then it checks the invariants of docs/concepts/invariants.md from the
journal and from an HTTP receiver's own log (:mod:`chaos.check`) and prints a report of
figures.
"""
