"""Operators: residency, cluster, oracle runs, metrics; and the unauthenticated health check."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import AdminDep, ServiceDep
from ..schemas import ClusterPut, OracleRunCreate, OracleRunPublic

router = APIRouter(tags=["operators"])


@router.get("/healthz")
async def healthz(svc: ServiceDep):
    return {"status": "ok", "plan_version": svc.planner.plan_version}


@router.get("/v1/residency")
async def residency(svc: ServiceDep, who: AdminDep):
    """Every copy in HBM and host DRAM, ready or in flight, with its version; open ops; counts."""
    return svc.planner.residency()


@router.get("/v1/cluster")
async def get_cluster(svc: ServiceDep, who: AdminDep):
    p = svc.planner
    return {"cluster": p.cluster.model_dump(mode="json"), "catalog": p.catalog.model_dump(mode="json"),
            "catalog_epoch": p.catalog_epoch}


@router.put("/v1/cluster")
async def put_cluster(body: ClusterPut, svc: ServiceDep, who: AdminDep):
    """Replace the cluster and catalog: any change while no state is held, or new model
    versions on the same cluster (stale copies go, leases of the old version go stale)."""
    out = svc.planner.set_cluster(body.cluster, body.catalog)
    svc.changed()
    return out


@router.post("/v1/oracle/runs", response_model=OracleRunPublic, status_code=202)
async def start_oracle(body: OracleRunCreate, svc: ServiceDep, who: AdminDep):
    """Solve the offline MILP over a trace in the background; poll GET /v1/oracle/runs/{run_id}."""
    return svc.start_oracle(body)


@router.get("/v1/oracle/runs/{run_id}", response_model=OracleRunPublic)
async def get_oracle(run_id: str, svc: ServiceDep, who: AdminDep):
    run = svc.planner.store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"no oracle run {run_id!r}")
    return run


@router.get("/metrics")
async def metrics(svc: ServiceDep, who: AdminDep):
    m = svc.metrics
    m.open_ops.set(len(svc.planner.ops))
    m.plan_version.set(svc.planner.plan_version)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
