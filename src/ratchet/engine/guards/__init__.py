"""Guards: the thresholds that catch a pathological run, the budgets that stop its spend,
and what to do when one trips.

* :mod:`~ratchet.engine.guards.policy`: what a workflow or a run declares (:class:`Guards`,
  the names re-exported here);
* :mod:`~ratchet.engine.guards.run`: the guards at work in one drive (``RunGuards``),
  called by the drive at its step boundaries, over what the journal says of the run;
* :mod:`~ratchet.engine.guards.evidence`: the history and texts they measure against;
* :mod:`~ratchet.engine.guards.streak`: the runaway-loop streak, counted step by step;
* :mod:`~ratchet.engine.guards.host_judged`: a sandboxed drive's, judged by its host.
"""

from ratchet.engine.guards.policy import (
    ACTIONS,
    ANOMALIES,
    BUDGET,
    BUDGET_FIELDS,
    DEFAULT,
    LIMITS,
    Guards,
    check_grant,
    check_overrides,
)

__all__ = [
    "ACTIONS",
    "ANOMALIES",
    "BUDGET",
    "BUDGET_FIELDS",
    "DEFAULT",
    "LIMITS",
    "Guards",
    "check_grant",
    "check_overrides",
]
