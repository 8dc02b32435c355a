"""GET /healthz (no token) and GET /metrics (Prometheus text, admin)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import AdminDep, ServiceDep

router = APIRouter(tags=["operators"])


@router.get("/healthz")
async def healthz(svc: ServiceDep):
    """200 `ok`, or 503 `degraded` while the ledger refuses writes (every change is then refused
    with 503 too, and nothing is acknowledged that is not on disk)."""
    p = svc.planner
    if p.ledger_error is not None:
        return JSONResponse({"status": "degraded", "plan_version": p.plan_version,
                             "ledger": {"writable": False, "error": p.ledger_error[:300]}}, status_code=503)
    return {"status": "ok", "plan_version": p.plan_version, "ledger": {"writable": True}}


@router.get("/metrics")
async def metrics(svc: ServiceDep, who: AdminDep):
    m = svc.metrics
    m.open_ops.set(len(svc.planner.ops))
    m.plan_version.set(svc.planner.plan_version)
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
