"""The isolated tier: workflows run in a sandbox of their own (one per attempt), their
journal writes reported to the worker that owns the sandbox.

``spec`` is what a workflow declares (imported by the engine); the rest sits above the
engine: the backends that spawn sandboxes, the report channel the worker serves, the
worker's side of an isolated drive, and the harness that runs inside the sandbox.
"""
