"""/docs and /openapi.json, served only by `create_app(..., docs=True)` (`statebudget serve --docs`).

Both are for admin tokens: the description of every route is a map for whoever probes the service.
/docs is plain HTML written here from the OpenAPI description: no script, and no style sheet, font
or image from anywhere, which the page's Content-Security-Policy also tells the browser. It works
on a machine without internet, and nothing a third party serves can change what it shows.
(FastAPI's own /docs and /redoc load Swagger UI or ReDoc from a CDN; the PyPI package of Swagger
UI's files, swagger-ui-bundle, ships Swagger UI 4, which cannot show OpenAPI 3.1, what FastAPI writes.)

A browser sends no bearer header by itself: GET /docs without one answers a form that posts the
token to /docs and gets the page back. `curl -H 'Authorization: Bearer …' /docs` works too.
"""

from __future__ import annotations

import html
import json
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from .deps import AdminDep, get_principal, role

router = APIRouter(include_in_schema=False)

_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                       "frame-ancestors 'none'; base-uri 'none'",
            "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
_STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
          "code,pre{font:13px ui-monospace,monospace}pre{white-space:pre-wrap}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left;vertical-align:top}"
          "h2{border-top:1px solid #ccc;padding-top:1rem}.m{font-weight:700}")
_FORM = ('<p>These pages are for an admin token.</p><form method="post" action="/docs">'
         '<label>Admin token <input type="password" name="token" autocomplete="off" size="50"></label> '
         '<button>Show the API</button></form>')


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
                        f'</title><style>{_STYLE}</style></head><body>{body}</body></html>',
                        status_code=status, headers=_HEADERS)


@router.get("/openapi.json")
async def openapi(request: Request, who: AdminDep):
    return JSONResponse(request.app.openapi(), headers={"Cache-Control": "no-store"})


@router.get("/docs")
async def docs_page(request: Request):
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return _page("StateBudget API", _FORM)
    return await _docs_for(request, token.strip())


@router.post("/docs")
async def docs_form(request: Request):
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    return await _docs_for(request, (form.get("token") or [""])[0].strip())


async def _docs_for(request: Request, token: str) -> HTMLResponse:
    """The page for an admin token; the form again, with why, for any other."""
    try:
        who = await get_principal(request, HTTPAuthorizationCredentials(scheme="Bearer", credentials=token))
        await role("admin")(request, who)
    except HTTPException as e:
        return _page("StateBudget API", f"<p><strong>{html.escape(str(e.detail))}</strong></p>{_FORM}", e.status_code)
    return _page("StateBudget API", render(request.app.openapi()))


def _e(x) -> str:
    return html.escape(str(x))


def _type(s: dict) -> str:
    """A schema in a few words: `string ≤ 200`, `integer 0…10000000`, `array of Op`, `Plan | null`."""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f'<a href="#schema-{_e(name)}">{_e(name)}</a>'
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            return " | ".join(_type(x) for x in s[key])
    if "const" in s:
        return f"<code>{_e(json.dumps(s['const']))}</code>"
    if "enum" in s:
        return " | ".join(f"<code>{_e(json.dumps(v))}</code>" for v in s["enum"])
    t = s.get("type", "any")
    if t == "array":
        t = f"array of {_type(s.get('items', {}))}"
    elif t == "object" and isinstance(s.get("additionalProperties"), dict):
        t = f"object of {_type(s['additionalProperties'])}"
    else:
        t = _e(t)
    lo = s.get("minimum", s.get("exclusiveMinimum", s.get("minLength", s.get("minItems"))))
    hi = s.get("maximum", s.get("exclusiveMaximum", s.get("maxLength", s.get("maxItems"))))
    if lo is not None or hi is not None:
        t += f" {_e('' if lo is None else lo)}…{_e('' if hi is None else hi)}"
    if "pattern" in s:
        t += f" <code>{_e(s['pattern'])}</code>"
    return t


def _fields(rows: list[tuple[str, bool, dict]]) -> str:
    out = ["<table><tr><th>field</th><th>type</th><th>default</th><th>what</th></tr>"]
    for name, required, s in rows:
        default = "required" if required else _e(json.dumps(s.get("default"))) if "default" in s else ""
        out.append(f"<tr><td><code>{_e(name)}</code></td><td>{_type(s)}</td><td>{default}</td>"
                   f"<td>{_e(s.get('description', ''))}</td></tr>")
    return "".join(out) + "</table>"


def render(schema: dict) -> str:
    """The OpenAPI description as one HTML page; every link on it is an anchor of the page."""
    info = schema.get("info", {})
    out = [f"<h1>{_e(info.get('title', 'API'))} {_e(info.get('version', ''))}</h1>",
           f"<p>{_e(info.get('description', ''))}</p>",
           "<p>Every route but <code>/healthz</code> takes <code>Authorization: Bearer &lt;token&gt;</code>; "
           "its role decides the routes. The description as JSON: <code>GET /openapi.json</code> with an admin "
           "token.</p>"]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            out.append(f"<h2><span class=m>{_e(method.upper())}</span> <code>{_e(path)}</code></h2>")
            out.append(f"<pre>{_e(op.get('description') or op.get('summary', ''))}</pre>")
            params = [(p["name"] + f" ({p['in']})", p.get("required", False), p.get("schema", {}))
                      for p in op.get("parameters", [])]
            if params:
                out.append(_fields(params))
            body = op.get("requestBody", {}).get("content", {})
            for ctype, c in body.items():
                out.append(f"<p>Body ({_e(ctype)}): {_type(c.get('schema', {}))}</p>")
            codes = ", ".join(f"{_e(k)} {_e(v.get('description', ''))}" for k, v in op.get("responses", {}).items())
            out.append(f"<p>Answers: {codes}</p>")
    out.append("<h2>Schemas</h2>")
    for name, s in schema.get("components", {}).get("schemas", {}).items():
        out.append(f'<h3 id="schema-{_e(name)}">{_e(name)}</h3>')
        if s.get("description"):
            out.append(f"<pre>{_e(s['description'])}</pre>")
        required = set(s.get("required", []))
        props = s.get("properties", {})
        out.append(_fields([(k, k in required, v) for k, v in props.items()]) if props else f"<p>{_type(s)}</p>")
    return "".join(out)
