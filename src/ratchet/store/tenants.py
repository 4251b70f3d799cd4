"""Run ids scoped to their tenant: each tenant names its runs in a namespace of its own.

The engine knows one run id per run, global, and the journal's hash chain commits to it
(every event's hash covers its ``run_id``), so a stored run can never be renamed. The API
speaks each tenant's own ids instead, and this module maps between the two:

* for the tenant ``default`` (runs started from Python and the CLI) the engine's id is
  the client's id, unchanged;
* for any other tenant ``T`` it is ``T~<id>``. ``~`` is allowed neither in a run id a
  client chooses nor in a tenant name, so no client id can take a scoped one, and the
  tenant's id is a pure function of the tenant and the engine's id
  (:func:`external_id`). A child run's id is its parent's plus ``/<step>``, so a tenant's
  children stay in its namespace.

Runs written before ids were scoped (a run of tenant ``T`` stored under its raw id) stay
reachable by ``T`` under that id: a lookup falls back to the raw id when the row is
``T``'s. The migration that introduced scoping wrote down which tenants have such rows
(``tenant_legacy_ids``); for every other tenant, and on a database that never had any,
no lookup or start pays for the fallback. A raw id of another tenant never makes a start
collide, conflict or tell anything: the tenant ``default`` starting an id that another
tenant's old row holds gets the fallback id ``default~<id>``, and answers exactly as for
a fresh id.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

from ratchet.model import RunRecord
from ratchet.store.dialect import Dialect
from ratchet.store.rows import record_from_row
from ratchet.store.runs import get_run

DEFAULT_TENANT = "default"
SEP = "~"

_legacy: weakref.WeakKeyDictionary[Dialect, frozenset[str]] = weakref.WeakKeyDictionary()


def prefix(tenant: str) -> str:
    """What the engine's ids of ``tenant``'s runs start with (except its old rows)."""
    return f"{tenant}{SEP}"


def scoped_id(tenant: str, run_id: str) -> str:
    """The engine's id for ``tenant``'s ``run_id``, where no old row is in the way."""
    return run_id if tenant == DEFAULT_TENANT else prefix(tenant) + run_id


def external_id(tenant: str, internal: str) -> str:
    """The id ``tenant`` knows its run by, from the engine's id of it."""
    p = prefix(tenant)
    return internal[len(p) :] if internal.startswith(p) else internal


def scoped_key(tenant: str, key: str) -> str:
    """The stored form of ``tenant``'s concurrency key: queues are fleet-wide, and a key is
    the tenant's own, so another tenant using the same key never takes this one's slots."""
    return key if tenant == DEFAULT_TENANT else f"{tenant}/{key}"


def external_key(tenant: str, key: str) -> str:
    """The concurrency key ``tenant`` gave, from its stored form."""
    p = f"{tenant}/"
    return key[len(p) :] if tenant != DEFAULT_TENANT and key.startswith(p) else key


def external_text(tenant: str, text: str) -> str:
    """``text`` (an error message naming runs of ``tenant``) with the tenant's ids."""
    return text.replace(prefix(tenant), "")


async def legacy_tenants(store: Dialect) -> frozenset[str]:
    """The tenants with runs stored under raw ids (from before ids were scoped). Fixed
    once the migration ran (no raw id of another tenant than ``default`` is written since),
    so it is read once per store."""
    found = _legacy.get(store)
    if found is None:
        rows = await store._read(lambda tx: tx.all("tenant_legacy_ids", {}))
        found = _legacy[store] = frozenset(str(r["tenant_id"]) for r in rows)
    return found


def needs_lookup(tenant: str, legacy: frozenset[str]) -> bool:
    """Whether an old row may stand in the way of ``tenant``'s ids."""
    return bool(legacy) if tenant == DEFAULT_TENANT else tenant in legacy


def candidates(tenant: str, run_id: str, legacy: frozenset[str]) -> tuple[str, ...]:
    """The engine's ids that may hold ``tenant``'s ``run_id``, in order of preference."""
    if not needs_lookup(tenant, legacy):
        return (scoped_id(tenant, run_id),)
    if tenant == DEFAULT_TENANT:
        # The fallback id exists only where another tenant's old row took the raw one.
        return (run_id, prefix(tenant) + run_id)
    return (prefix(tenant) + run_id, run_id)


def choose(tenant: str, run_id: str, owners: Mapping[str, str]) -> str:
    """The engine's id for ``tenant``'s ``run_id`` given ``owners`` (engine id: tenant, of
    the :func:`candidates` that exist): the tenant's own run if one holds it, else the id
    to create it under."""
    if tenant == DEFAULT_TENANT:
        fallback = prefix(tenant) + run_id
        if owners.get(run_id, DEFAULT_TENANT) == DEFAULT_TENANT and fallback not in owners:
            return run_id
        return fallback
    scoped = prefix(tenant) + run_id
    if scoped not in owners and owners.get(run_id) == tenant:
        return run_id  # an old row of this tenant
    return scoped


async def internal_ids(store: Dialect, tenant: str, run_ids: Sequence[str]) -> list[str]:
    """The engine's id of each of ``tenant``'s ``run_ids``: the run's if it exists, else
    the one to create it under. One read, and none where no old rows can be in the way."""
    legacy = await legacy_tenants(store)
    if not needs_lookup(tenant, legacy):
        return [scoped_id(tenant, r) for r in run_ids]
    ids = store._ids(sorted({c for r in run_ids for c in candidates(tenant, r, legacy)}))
    rows = await store._read(lambda tx: tx.all("run_owners", {"ids": ids}))
    owners = {str(r["run_id"]): str(r["tenant_id"]) for r in rows}
    return [choose(tenant, r, owners) for r in run_ids]


async def find_run(store: Dialect, tenant: str, run_id: str) -> RunRecord | None:
    """``tenant``'s run ``run_id`` (the engine's record of it), or None: missing and
    another tenant's are the same answer."""
    legacy = await legacy_tenants(store)
    found = candidates(tenant, run_id, legacy)
    if len(found) == 1:
        rec = await get_run(store, found[0])
        return rec if rec is not None and rec.tenant_id == tenant else None

    ids = store._ids(list(found))
    rows = await store._read(lambda tx: tx.all("runs_get_many", {"ids": ids}))
    mine = {r.run_id: r for r in map(record_from_row, rows) if r.tenant_id == tenant}
    return next((mine[c] for c in found if c in mine), None)
