"""``GET /v1/runs/{id}/receipt``: a finished run's signed receipt, signed now if it has none
over its whole journal. Another tenant's run is a 404, as everywhere."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ratchet.api.runs import ERRORS, Reader, app_of, owned, store_of
from ratchet.api.schemas import RunReceipt
from ratchet.receipts.service import ensure_receipt

router = APIRouter(prefix="/v1", tags=["runs"], responses=ERRORS)


@router.get("/runs/{run_id:path}/receipt", response_model=RunReceipt)
async def run_receipt(run_id: str, request: Request, token: Reader) -> Any:
    """The run's signed receipt (DSSE, in-toto statement); 409 while it has not finished.
    Verify it offline with ``ratchet verify`` and the journal from ``ratchet export``. The
    statement names the run as its journal does (the hash chain commits to that id): for
    a tenant other than ``default``, ``<tenant>~<id>``."""
    rec = await owned(request, run_id, token)
    stored = await ensure_receipt(store_of(request), app_of(request).signer, rec.run_id)
    return stored.envelope
