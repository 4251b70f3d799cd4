"""The sandbox backend interface: spawn one sandbox process for one attempt of a run, kill
it, and say how it ended. Bubblewrap (:mod:`ratchet.sandbox.bwrap`) is the real one; a
Docker or microVM backend is the same three calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ratchet.sandbox.spec import Sandbox

# Where the report channel appears inside every sandbox.
REPORT_SOCKET = "/run/ratchet/report.sock"


@dataclass(frozen=True, slots=True)
class SpawnRequest:
    """One sandbox to start: ``argv`` runs inside it with exactly ``env``."""

    sandbox_id: str
    spec: Sandbox
    argv: list[str]
    env: dict[str, str]
    report_socket: str  # the host path of the report channel, bound at REPORT_SOCKET
    readable: list[str] = field(default_factory=list)  # host paths shown read-only
    # Host paths the sandbox must not see (Ratchet's data directory, database, key,
    # logs): masked wherever a path it is shown holds them.
    hidden: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Exit:
    """How a sandbox ended: its exit code, or the signal that killed it; its peak memory
    where the backend can measure it; whether its memory limit killed it."""

    exit_code: int | None
    signal: int | None
    peak_memory: int | None = None
    oom: bool = False


class SandboxProcess(ABC):
    """A running sandbox."""

    pid: int

    @abstractmethod
    async def wait(self) -> Exit:
        """Wait until the sandbox is gone (every process in it), then free what it held."""

    @abstractmethod
    def kill(self) -> None:
        """Kill every process of the sandbox now (idempotent)."""


class SandboxBackend(ABC):
    """Spawns sandboxes."""

    name: str
    limits: str  # how limits are enforced on this machine: "cgroup v1", "cgroup v2", "rlimit"

    @abstractmethod
    async def probe(self) -> None:
        """Check that this machine can make sandboxes; raises SandboxUnavailable saying
        why not."""

    @abstractmethod
    async def spawn(self, request: SpawnRequest) -> SandboxProcess:
        """Start the sandbox; raises SandboxUnavailable when it cannot."""
