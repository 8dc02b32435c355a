"""Operators: the residency of every copy, the cluster and catalog the planner runs on, and the
operator's layout it homes models by."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import AdminDep, ServiceDep
from ..inputs import StrictJsonRoute
from ...models.errors import InputError
from ...models.load import found_elsewhere, layout_entries
from ...service.errors import Invalid
from ..schemas import ClusterPut, LayoutPut

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


def _layout_body(p) -> dict:
    return {"homes": {m: list(g) for m, g in p.layout or ()}, "holds": p.layout_holds}


@router.get("/v1/layout")
async def get_layout(svc: ServiceDep, who: AdminDep):
    """The operator's layout: {"homes": {model: [GPU index, ...]} ({}: none), "holds": its models come
    back to their groups} (docs/tracking.md)."""
    return _layout_body(svc.planner)


@router.put("/v1/layout")
async def put_layout(body: LayoutPut, svc: ServiceDep, who: AdminDep):
    """Replace the layout ({"homes": {}} or {"kept": null}: none). From the next planning step a
    model with no copy is homed by it (with "holds": true, one with a copy elsewhere too); copies
    stay where they are until evicted. The ledger keeps it across restarts. A `statebudget layout
    --json` output found on another cluster or catalog is refused."""
    p = svc.planner
    try:
        homes, names = layout_entries(body.model_dump(exclude_unset=True), "body")
    except InputError as e:
        raise Invalid(str(e)) from None
    elsewhere = found_elsewhere(names, p.cluster.name, p.catalog.name)
    if elsewhere:
        what, found, runs = elsewhere[0]
        raise Invalid(f"body:{what}: a layout found on {found!r}; the planner runs {what} {runs!r}")
    p.set_layout(homes, names.get("holds", False))
    svc.changed()
    return _layout_body(p)
