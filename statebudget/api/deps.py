"""Dependencies: the service and the caller's principal, as `Annotated` aliases. They are
`async` so FastAPI runs them on the event loop, not through a thread pool hop per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .auth import Principal, Refused

_bearer = HTTPBearer(auto_error=False, description="a token from the token file; its role decides the routes")


async def get_service(request: Request):
    return request.app.state.service


async def get_principal(request: Request, cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    if cred is None:
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    try:
        return request.app.state.service.auth.authenticate(cred.credentials)
    except Refused as e:
        raise HTTPException(401, str(e), headers={"WWW-Authenticate": "Bearer"}) from None


def role(*allowed: str):
    async def check(request: Request, who: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if who.role not in allowed:
            raise HTTPException(403, f"role {who.role!r} may not call {request.method} {request.url.path} "
                                     f"(needs {' or '.join(allowed)})")
        if who.role == "adapter":
            # A token minted for a node the cluster lacks (a typo, or a node PUT /v1/cluster
            # removed) would otherwise poll an empty plan for ever, with nothing to say why.
            cluster = request.app.state.service.planner.cluster
            if who.node not in cluster.node_by_name:
                raise HTTPException(403, f"this adapter token is for node {who.node!r}, which cluster {cluster.name} "
                                         f"does not have (nodes: {', '.join(cluster.node_by_name)})")
        return who
    return check


ServiceDep = Annotated[object, Depends(get_service)]
RuntimeDep = Annotated[Principal, Depends(role("runtime"))]
AdapterDep = Annotated[Principal, Depends(role("adapter"))]
AdminDep = Annotated[Principal, Depends(role("admin"))]
PrincipalDep = Annotated[Principal, Depends(get_principal)]  # any valid token, whatever its role
