"""GET /healthz (no token) and GET /metrics (Prometheus text, admin)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import AdminDep, ServiceDep

router = APIRouter(tags=["operators"])


@router.get("/healthz")
async def healthz(svc: ServiceDep):
    return {"status": "ok", "plan_version": svc.planner.plan_version}


@router.get("/metrics")
async def metrics(svc: ServiceDep, who: AdminDep):
    m = svc.metrics
    m.open_ops.set(len(svc.planner.ops))
    m.plan_version.set(svc.planner.plan_version)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
