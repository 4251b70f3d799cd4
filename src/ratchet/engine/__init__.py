"""The engine: workers, leases, the recovery sweep, driving and replaying runs, retries."""
