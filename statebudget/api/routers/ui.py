"""GET /ui (the live view: one static page, no build step) and GET /v1/ui/state, what it draws."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response

from ...service.ui import ui_state
from ..deps import PrincipalDep, ServiceDep

router = APIRouter(tags=["operators"])
STATIC = Path(__file__).resolve().parent.parent / "static"
# the page's script is a file of the same origin: no inline script runs, and no frame may hold it
CSP = "default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"


@cache
def _static(name: str) -> str:
    return (STATIC / name).read_text()


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
async def ui_page():
    """The page itself holds no data: it asks for a token and reads /v1/ui/state with it."""
    return HTMLResponse(_static("ui.html"), headers={"Cache-Control": "no-store", "Content-Security-Policy": CSP})


@router.get("/ui.js", include_in_schema=False)
async def ui_script():
    return Response(_static("ui.js"), media_type="text/javascript", headers={"Cache-Control": "no-store"})


@router.get("/v1/ui/state")
async def state(svc: ServiceDep, who: PrincipalDep):
    """Per GPU HBM by kind (weights, kv, experts, loading, engine overhead) and engines; per node
    DRAM and NVMe; transfers in flight; leases; the stall histogram of the last hour. An admin
    token sees everything, a runtime token its tenant's KV, leases and calls (and the totals)."""
    if who.role == "adapter":
        raise HTTPException(403, "the live view is for operators (admin token) and runtimes (their own tenant)")
    return JSONResponse(ui_state(svc.planner, who.tenant if who.role == "runtime" else None))
