"""Operators: the residency of every copy, and the cluster and catalog the planner runs on."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import AdminDep, ServiceDep
from ..inputs import StrictJsonRoute
from ..schemas import ClusterPut

router = APIRouter(tags=["operators"], route_class=StrictJsonRoute)


@router.get("/v1/residency")
async def residency(svc: ServiceDep, who: AdminDep):
    """Every copy in HBM and host DRAM, ready or in flight, with its version; open ops; counts."""
    return svc.planner.residency().body()


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
    return out.body()
