"""``ratchet demo``: a worker killed with SIGKILL in the middle of step 4 of 6, a model
call, and a new one that finishes the run without running steps 1-3 again or paying for
the model call twice.

Two real worker processes (``ratchet worker ratchet.demo.workflow:app``) share one embedded
SQLite file. Both run under the same worker id, the way a restarted pod keeps its name,
so the second reclaims the dead one's run as soon as it starts instead of waiting for
the lease to expire. The model call goes to a local provider served by the demo's own
process, which holds its answer long enough for the kill to land while it is in flight,
and which keeps answers by ``Idempotency-Key`` as a careful provider does. What each step
did is read back from independent records: the invocation log the plain steps write (what
actually ran, in which process), the provider's request log (what it received and
billed), and the journal (what the engine recorded). The demo fails, with a non-zero exit,
if any disagrees with the claim.

:mod:`ratchet.demo.workflow` is the workflow the workers run, :mod:`ratchet.demo.stage`
what both ways of playing it share (the worker processes, the records, the checks),
:mod:`ratchet.demo.terminal` the demo in the terminal (``ratchet demo``) and
:mod:`ratchet.demo.served` the demo through ``ratchet server`` (``ratchet demo --serve``).
This module imports none of them: a worker process importing the workflow loads only it.
"""
