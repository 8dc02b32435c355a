"""POST /v1/programs/{program}/calls/{call}/start: start an arrived call once its state is ready."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from ..deps import RuntimeDep, ServiceDep
from ..schemas import Id

router = APIRouter(prefix="/v1/programs", tags=["runtime"])


@router.post("/{program}/calls/{call}/start")
async def start_when_ready(program: Annotated[Id, Path()], call: Annotated[Id, Path()], svc: ServiceDep,
                           who: RuntimeDep, wait: Annotated[float, Query(ge=0, le=60, allow_inf_nan=False)] = 0.0):
    """Wait up to `wait` seconds for the call's model to have weights ready on a GPU group, then
    start the call there in the same step (`call_started`: its state is pinned before any planning
    step can move it). `{call, status, ready, group, node}` plus `stall_s` once started; `ready`
    false (and nothing started) if the wait ran out. For a gateway holding a request."""
    p = svc.planner
    ready = await svc.wait_until(lambda: (r := p.call_ready(who.tenant, program, call)).ready and r, wait)
    if not ready:
        return p.call_ready(who.tenant, program, call).body()
    ack = p.event(who.tenant, {"type": "call_started", "program": program, "call": call}).body()
    svc.changed()
    return {**ready.body(), **ack}
