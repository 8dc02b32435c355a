"""POST /v1/leases, GET and DELETE /v1/leases/{lease_id}: HandoffLeases."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path

from ..deps import RuntimeDep, ServiceDep
from ..inputs import StrictJsonRoute
from ...models.lease import LeasePublic
from ..schemas import Id, LeaseCreate

router = APIRouter(prefix="/v1/leases", tags=["runtime"], route_class=StrictJsonRoute)
LeaseId = Annotated[Id, Path(description="the lease_id its submission answered")]
log = logging.getLogger("statebudget.api")


@router.post("", response_model=LeasePublic)
async def submit_lease(body: LeaseCreate, svc: ServiceDep, who: RuntimeDep):
    """Quote and admit: `accepted` (all of it by the P95), `partial` (weights only) or `rejected`."""
    out = svc.planner.submit_lease(who.tenant, body.model_dump())
    svc.changed()
    log.info("lease", extra={"fields": {"lease_id": out.lease_id, "tenant": who.tenant, "program": body.program,
                                        "model": body.model, "decision": out.decision, "p95_s": out.quote.p95_s}})
    return out


@router.get("/{lease_id}", response_model=LeasePublic)
async def get_lease(lease_id: LeaseId, svc: ServiceDep, who: RuntimeDep):
    p = svc.planner
    return p.lease_view(p.get_lease(who.tenant, lease_id))


@router.delete("/{lease_id}", response_model=LeasePublic)
async def cancel_lease(lease_id: LeaseId, svc: ServiceDep, who: RuntimeDep):
    """Cancel: transfers stop, reservations are freed; a second cancel changes nothing."""
    out = svc.planner.cancel_lease(who.tenant, lease_id)
    svc.changed()
    return out
