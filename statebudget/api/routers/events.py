"""POST /v1/events: what the agent runtime tells the planner (DESIGN.md §7)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import RuntimeDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import EventBatch, EventCreate, EventPublic

router = APIRouter(prefix="/v1/events", tags=["runtime"], route_class=StrictJsonRoute)


@router.post("", response_model=EventPublic)
async def post_event(ev: EventCreate, svc: ServiceDep, who: RuntimeDep):
    """One event; the tenant is the token's. A stale epoch or an event after a cancel gets 409."""
    out = svc.planner.event(who.tenant, ev.model_dump(exclude_none=True))
    svc.changed()
    return {"type": ev.type, "program": ev.program, **out.body()}


@router.post("/batch")
async def post_events(batch: EventBatch, svc: ServiceDep, who: RuntimeDep):
    """Events in order, one transaction: `{results: [{status, body}]}`, one per event; a refused
    event (its `status` 404, 409, 422 …, `body` `{detail}`) changes nothing and the others still
    apply. For a gateway that sends what happened after its answers went out."""
    out = svc.planner.events(who.tenant, [ev.model_dump(exclude_none=True) for ev in batch.events])
    svc.changed()
    return {"results": [{"status": status, "body": body} for status, body in out]}
