"""GET /v1/plan (long poll) and POST /v1/ops/{op_id}: the adapters' side (DESIGN.md §7)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from ..deps import AdapterDep, ServiceDep
from ..inputs import StrictJsonRoute
from ...models.plan import OpAck, Plan
from ..schemas import MAX_INT, Id, OpReport

router = APIRouter(prefix="/v1", tags=["adapters"], route_class=StrictJsonRoute)
log = logging.getLogger("statebudget.api")


@router.get("/plan", response_model=Plan)
async def get_plan(svc: ServiceDep, who: AdapterDep, node: Annotated[Id, Query()],
                   after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                   wait: Annotated[float, Query(ge=0, le=60, allow_inf_nan=False)] = 0.0):
    """The open ops of `node` once the plan version passes `after`, waiting up to `wait` seconds."""
    if node != who.node:
        raise HTTPException(403, f"this adapter token is for node {who.node!r}, not {node!r}")
    svc.planner.last_seen[node] = svc.planner.now  # an adapter waiting in a long poll is alive
    await svc.wait_for_version(after, wait)
    return svc.planner.plan_for(node, after)


@router.post("/ops/{op_id}", response_model=OpAck)
async def report_op(op_id: Annotated[Id, Path()], body: OpReport, svc: ServiceDep, who: AdapterDep):
    """`done` commits when version and epoch match the op and the books; stale or cancelled: 409."""
    out = svc.planner.report(who.node, op_id, body.model_dump())
    svc.changed()
    log.info("op", extra={"fields": {"op_id": op_id, "node": who.node, "status": str(out.status),
                                     "bytes": body.bytes, "seconds": body.seconds}})
    return out
