"""POST /v1/oracle/runs and GET /v1/oracle/runs/{run_id}: the offline MILP as a background job."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from ..deps import AdminDep, ServiceDep
from ..schemas import OracleRunCreate, OracleRunPublic

router = APIRouter(prefix="/v1/oracle/runs", tags=["operators"])


@router.post("", response_model=OracleRunPublic, status_code=202)
async def start_oracle(body: OracleRunCreate, svc: ServiceDep, who: AdminDep):
    """Solve the offline MILP over a trace in the background; poll GET /v1/oracle/runs/{run_id}."""
    return svc.start_oracle(body)


@router.get("/{run_id}", response_model=OracleRunPublic)
async def get_oracle(run_id: str, svc: ServiceDep, who: AdminDep):
    run = svc.planner.store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"no oracle run {run_id!r}")
    return run
