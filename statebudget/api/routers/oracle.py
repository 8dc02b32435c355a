"""POST /v1/oracle/runs and GET /v1/oracle/runs/{run_id}: the offline MILP as a background job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from ..deps import AdminDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import Id, OracleRunCreate, OracleRunPublic

router = APIRouter(prefix="/v1/oracle/runs", tags=["operators"], route_class=StrictJsonRoute)


@router.post("", response_model=OracleRunPublic, status_code=202)
async def start_oracle(body: OracleRunCreate, svc: ServiceDep, who: AdminDep):
    """Solve the offline MILP over a trace in the background (the body may be up to 64 MiB);
    GET /v1/oracle/runs/{run_id} (with `wait` to block until it ends) reads it."""
    return svc.start_oracle(body)


@router.get("/{run_id}", response_model=OracleRunPublic)
async def get_oracle(run_id: Annotated[Id, Path()], svc: ServiceDep, who: AdminDep,
                     wait: Annotated[float, Query(ge=0, le=600, allow_inf_nan=False)] = 0.0):
    """The run; with `wait`, once it has ended or after `wait` seconds, whichever comes first."""
    await svc.wait_for_run(run_id, wait)
    run = svc.planner.store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"no oracle run {run_id!r}")
    return run
