"""POST /v1/programs/{program}/calls/{call}/start: start an arrived call once its state is ready."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import JSONResponse

from ..deps import RuntimeDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import EventCreate, Id

router = APIRouter(prefix="/v1/programs", tags=["runtime"], route_class=StrictJsonRoute)


@router.post("/{program}/calls/{call}/start")
async def start_when_ready(program: Annotated[Id, Path()], call: Annotated[Id, Path()], svc: ServiceDep,
                           who: RuntimeDep, wait: Annotated[float, Query(ge=0, le=60, allow_inf_nan=False)] = 0.0,
                           before: Annotated[list[EventCreate] | None, Body(embed=True, max_length=100)] = None):
    """Apply the events of `before` first (as POST /v1/events, in one transaction: a gateway's
    `program_started` and `call_arrived`; the first refused one is this request's answer, and
    those after it are not applied), then
    wait up to `wait` seconds for the call's model to have weights ready on a GPU group, and start
    the call there in the same step (`call_started`: its state is pinned before any planning step
    can move it). `{call, status, ready, group, node}` plus `stall_s` once started; `ready` false
    (and nothing started) if the wait ran out."""
    p = svc.planner
    refusal, ready, started = p.arrive_and_start(who.tenant, program, call,
                                                 [ev.model_dump(exclude_none=True) for ev in before or ()])
    if before or started:
        svc.changed()
    if refusal is not None:
        return JSONResponse(refusal[1], status_code=refusal[0])
    if started is None and await svc.wait_until(lambda: p.call_ready(who.tenant, program, call).ready, wait):
        _, ready, started = p.arrive_and_start(who.tenant, program, call, [])  # ready now: the one way to start
        svc.changed()
    if started is None:
        return p.call_ready(who.tenant, program, call).body()
    return {**ready.body(), **started}
