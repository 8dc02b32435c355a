"""GET /v1/queue: the calls waiting to start, in the queue discipline's order now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from ..deps import PrincipalDep, ServiceDep
from ..schemas import Id

router = APIRouter(prefix="/v1/queue", tags=["runtime"])


@router.get("")
async def get_queue(svc: ServiceDep, who: PrincipalDep,
                    model: Annotated[Id | None, Query(description="only calls on this model")] = None):
    """`{queue, calls: [{rank, program, call, model, attempt, waited_s, promoted}]}`, first to start
    first: the simulator's queue key at this instant (`serve --queue`), which follows the
    starvation promotion and a shrinking TTFT slack that `call_arrived`'s fixed `priority`
    cannot. For a runtime or gateway that holds calls and picks the next itself. A runtime token
    sees its tenant's calls only, each with its rank among all."""
    # plain JSON types already: skip FastAPI's per-field encoder (most of a read's time with 1,000 calls)
    return JSONResponse(svc.planner.waiting_calls(model, who.tenant if who.role == "runtime" else None).body())
