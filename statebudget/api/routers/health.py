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
    with 503 too, and nothing is acknowledged that is not on disk). `adapters`: how many of the
    cluster's nodes have an adapter heard from lately (counts only: no token, tenant or node name)."""
    p = svc.planner
    up = svc.metrics.adapters_up(p)
    adapters = {"nodes": len(up), "up": sum(up.values())}
    if p.ledger_error is not None:
        return JSONResponse({"status": "degraded", "plan_version": p.plan_version, "adapters": adapters,
                             "ledger": {"writable": False, "error": p.ledger_error[:300]}}, status_code=503)
    return {"status": "ok", "plan_version": p.plan_version, "adapters": adapters, "ledger": {"writable": True}}


@router.get("/metrics")
async def metrics(svc: ServiceDep, who: AdminDep):
    m = svc.metrics
    m.scrape(svc.planner)  # the gauges read off the books, as they are now
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
