"""What the API takes in before the models see it, and what a refusal says.

Python's `json` reads `NaN`, `Infinity` and `-Infinity`, turns `1e400` into infinity, and keeps
lone surrogates (`"\\ud800"`) in strings: none of these can be written back as JSON or UTF-8, so one
that reached the books would break every answer that shows it. `StrictJsonRoute` parses each JSON
body once and refuses them (422, `loc` naming the field, at any depth: also in the free-form
dicts of PUT /v1/cluster), with integers outside 64 bits.

A 422 says where (`loc`) and what (`msg`) for at most `MAX_ERRORS` errors, with at most
`EXCERPT_CHARS` characters of the value it refused (FastAPI's own answer echoes the whole input:
10 MB in, 10 MB out).

`BodyLimit` answers 413 to a body over `BODY_LIMIT`, or over its route's larger limit
(`ROUTE_LIMITS`): one whose Content-Length says so before any of it is read, a chunked one as
soon as the bytes read pass the limit. Nothing buffers the body on its way: FastAPI reads it once.
"""

from __future__ import annotations

import json
import math

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from .schemas import MAX_INT

MIB = 1024 * 1024
BODY_LIMIT = 1 * MIB  # events, leases, op reports: a few hundred bytes each (an event's `after`: 200 KB at most)
ROUTE_LIMITS = {("PUT", "/v1/cluster"): 8 * MIB,         # a cluster and a catalog: a few KB
                ("PUT", "/v1/inventory"): 16 * MIB,      # up to 100,000 copies of ~100 bytes
                ("POST", "/v1/oracle/runs"): 64 * MIB}   # a trace of up to 50 MB, as an escaped JSON string

MAX_ERRORS = 20
EXCERPT_CHARS = 200
_LOC_PARTS = 16  # a path deeper than this is cut: a body nested 10,000 deep names 16 steps of it


class BodyTooLarge(HTTPException):
    """An HTTPException, so that FastAPI, reading the body, passes it on to its handler (413 JSON)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body over {limit} bytes, the limit of this route",
                         headers={"Connection": "close"})  # the rest of the body is not read


class BodyLimit:
    """Pure ASGI middleware: 413 for a request body over its route's limit, without reading it."""

    def __init__(self, app, default: int = BODY_LIMIT, routes: dict[tuple[str, str], int] = ROUTE_LIMITS):
        self.app, self.default, self.routes = app, default, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.routes.get((scope["method"], scope["path"]), self.default)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await _too_large(limit)(scope, receive, send)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:  # read outside FastAPI's handlers (a middleware): answer here
            if started:
                raise
            await _too_large(limit)(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    refusal = BodyTooLarge(limit)
    return JSONResponse({"detail": refusal.detail}, status_code=413, headers=refusal.headers)


def excerpt(value, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of `value`, with what is not printable escaped (a bidi override
    or an escape sequence travels back as `\\u202e`, not as itself)."""
    try:
        s = value if isinstance(value, str) else str(value)  # str(nan) is "nan", str(inf) "inf"
    except ValueError:  # an integer of more than 4,300 digits
        s = "an integer too long to print"
    cut = len(s) > limit
    s = s[:limit]
    if not s.isprintable():
        s = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in s)
    return s + "\u2026" if cut else s


def _refusal(value) -> str | None:
    """What is wrong with one JSON value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else "Input should be a finite number (not NaN, Infinity or beyond ±1.8e308)"
    if isinstance(value, int) and not isinstance(value, bool):
        return None if -MAX_INT - 1 <= value <= MAX_INT else "Input should be an integer within 64 bits"
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"Input should be valid Unicode text: a lone surrogate U+{ord(value[e.start]):04X} at position {e.start}"
    return None


def json_refusals(data) -> list[dict]:
    """The values of parsed JSON that cannot go into the books, as pydantic-style errors (at most
    `MAX_ERRORS`). Iterative: the parser's own recursion limit bounds the depth, not this walk."""
    errors, stack = [], [((), data)]
    while stack and len(errors) < MAX_ERRORS:
        path, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if (what := _refusal(k)) is not None:
                    errors.append({"type": "invalid_key", "loc": ("body", *path), "msg": f"a key: {what}", "input": k})
            stack.extend(reversed([((*path, k), v) for k, v in value.items()]))  # in document order
        elif isinstance(value, list):
            stack.extend(reversed([((*path, i), v) for i, v in enumerate(value)]))
        elif (what := _refusal(value)) is not None:
            kind = {float: "finite_number", int: "int_range"}.get(type(value), "string_unicode")
            errors.append({"type": kind, "loc": ("body", *path), "msg": what, "input": value})
    return errors


def parse_json(body: bytes):
    """The JSON of a request body, or RequestValidationError (what FastAPI answers with 422)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos),
                                       "msg": f"JSON decode error: {e.msg}", "input": None}]) from None
    except RecursionError:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": "JSON nested too deeply", "input": None}]) from None
    except ValueError as e:  # not UTF-8 text, or an integer of more than 4,300 digits
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": f"not JSON: {excerpt(str(e))}", "input": None}]) from None
    errors = json_refusals(data)
    if errors:
        raise RequestValidationError(errors)
    return data


def _is_json(content_type: str | None) -> bool:
    """The content types FastAPI reads as JSON: application/json and application/*+json."""
    if not content_type:
        return False
    main, _, sub = content_type.split(";")[0].strip().lower().partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is parsed by `parse_json` before FastAPI reads it: FastAPI then takes
    the parsed value as it is (Starlette keeps it on the request), so each body is parsed once."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request):
            if _is_json(request.headers.get("content-type")):
                body = await request.body()
                if body:
                    request._json = parse_json(body)  # Starlette's cache of Request.json()
            return await handler(request)

        return strict


def _brief(err: dict) -> dict:
    loc = [p if isinstance(p, int) else excerpt(str(p), 100) for p in err.get("loc", ())]
    out = {"type": excerpt(str(err.get("type", "")), 60),
           "loc": loc if len(loc) <= _LOC_PARTS else loc[:_LOC_PARTS] + ["\u2026"],
           "msg": excerpt(str(err.get("msg", "")), 2 * EXCERPT_CHARS)}
    value = err.get("input")
    if isinstance(value, (str, int, float)):  # a dict or a list (the whole body, often) is not echoed
        out["input"] = excerpt(value)
    return out


async def validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422: where and what, for the first `MAX_ERRORS` errors, never more of the input than an excerpt."""
    errors = exc.errors()
    detail = [_brief(e) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        detail.append({"type": "too_many_errors", "loc": ["body"], "msg": f"and {len(errors) - MAX_ERRORS} more errors"})
    return JSONResponse({"detail": detail}, status_code=422)
