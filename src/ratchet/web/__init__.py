"""The HTTP pieces every Ratchet server shares: the one JSON error shape (:mod:`.errors`)
and request-body limits (:mod:`.limits`). The API server and the sandbox's report channel
both build on them, so they sit below both."""
