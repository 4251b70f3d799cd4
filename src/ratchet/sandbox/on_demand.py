"""The isolation runner a worker is given, made when it first meets an isolated run.

Every worker of an app that serves graphs may meet one, so it is handed a runner; the
runner's machinery (sandbox backends, the report channel) loads on first use, and a worker
that never drives an isolated run does not pay for it at start, which is a restart's
latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratchet.engine.control import Control, DriveOutcome
    from ratchet.engine.definitions import WorkflowDef
    from ratchet.engine.worker import Relet
    from ratchet.model import ClaimedRun
    from ratchet.receipts import Signer
    from ratchet.sandbox.isolated import IsolatedRunner
    from ratchet.store.base import Store


class OnDemandRunner:
    """An :class:`ratchet.sandbox.isolated.IsolatedRunner`, made on first use."""

    def __init__(
        self, store: Store, signer: Signer | None = None, private: Sequence[str] = ()
    ) -> None:
        self.store = store
        self.signer = signer
        self.private = list(private)
        self.runner: IsolatedRunner | None = None

    def _runner(self) -> IsolatedRunner:
        if self.runner is None:
            from ratchet.sandbox.isolated import IsolatedRunner

            self.runner = IsolatedRunner(self.store, signer=self.signer, private=self.private)
        return self.runner

    async def drive(
        self, claimed: ClaimedRun, wd: WorkflowDef, control: Control, relet: Relet
    ) -> DriveOutcome:
        return await self._runner().drive(claimed, wd, control, relet)

    async def unavailable(self) -> str | None:
        """Why no sandbox can be made on this machine, or None when one can."""
        return await self._runner().unavailable()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
