"""PUT /v1/inventory: an adapter says what it really holds (when it starts, and after its engine
restarted); the planner reconciles its books with it (`service/reconcile.py`)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException

from ..deps import AdapterDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import InventoryPut

router = APIRouter(prefix="/v1", tags=["adapters"], route_class=StrictJsonRoute)
log = logging.getLogger("statebudget.api")


@router.put("/inventory")
async def put_inventory(body: InventoryPut, svc: ServiceDep, who: AdapterDep):
    """Every ready copy the node holds in HBM and host DRAM; open ops of the node fail, copies the
    books list but the node lacks are gone, and the answer's `drop` lists what the adapter should
    free (copies the books do not take)."""
    if body.node != who.node:
        raise HTTPException(403, f"this adapter token is for node {who.node!r}, not {body.node!r}")
    out = svc.planner.reconcile(body.node, [c.model_dump() for c in body.copies], body.reason)
    svc.changed()
    return out.body()
