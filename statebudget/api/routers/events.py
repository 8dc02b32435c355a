"""POST /v1/events: what the agent runtime tells the planner (DESIGN.md §7)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import RuntimeDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import EventCreate, EventPublic

router = APIRouter(prefix="/v1/events", tags=["runtime"], route_class=StrictJsonRoute)


@router.post("", response_model=EventPublic)
async def post_event(ev: EventCreate, svc: ServiceDep, who: RuntimeDep):
    """One event; the tenant is the token's. A stale epoch or an event after a cancel gets 409."""
    out = svc.planner.event(who.tenant, ev.model_dump(exclude_none=True))
    svc.changed()
    return {"type": ev.type, "program": ev.program, **out.body()}
