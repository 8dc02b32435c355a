"""Small fake engine servers (and a fake planner) for the HTTP adapter tests, plus `serve`, which
runs a FastAPI app with uvicorn on 127.0.0.1 in a background thread.

Each fake implements the routes, request shapes and error answers of the source named on its
class, keeps the state those routes change, and records every call it receives in `calls`
("METHOD /path?query", json body). `inject(route, status, body)` makes the next call to a route
answer an error, as an engine in trouble would. Where the real engine has no defined answer
(it crashes or corrupts memory) the fake answers an error instead; those places say so.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field


@contextmanager
def serve(app: FastAPI, start_timeout_s: float = 10.0, lifespan: str = "off"):
    """Run `app` on a free port of 127.0.0.1 in a thread; yields its base URL; stops it on exit.
    `lifespan="on"` runs the app's start-up and shut-down (a planning loop, say)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan,
                                           access_log=False, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="fake-server", daemon=True)
    thread.start()
    give_up = time.monotonic() + start_timeout_s
    while not server.started:  # a condition with a bound, not a fixed sleep
        if not thread.is_alive() or time.monotonic() > give_up:
            server.should_exit = True
            raise RuntimeError("fake server did not start")
        time.sleep(0.002)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(start_timeout_s)


class Fake:
    """Call recording and error injection shared by the fakes."""

    def __init__(self):
        self.app = FastAPI()
        self.calls: list[tuple[str, object]] = []
        self.engine_auth: list[str | None] = []  # each call's Authorization header
        self.injected: dict[str, tuple[int, object]] = {}

    def lines(self) -> list[str]:
        """The calls received, as "METHOD /path?query"."""
        return [line for line, _ in self.calls]

    def inject(self, route: str, status: int, body: object) -> None:
        """The next call to `route` (e.g. "/sleep") answers `status` with `body`."""
        self.injected[route] = (status, body)

    def record(self, request: Request, body: object = None) -> JSONResponse | None:
        """Record the call; return the injected answer for its route, if any."""
        query = f"?{request.url.query}" if request.url.query else ""
        self.calls.append((f"{request.method} {request.url.path}{query}", body))
        self.engine_auth.append(request.headers.get("authorization"))
        if request.url.path in self.injected:
            status, answer = self.injected.pop(request.url.path)
            return JSONResponse(answer, status_code=status)
        return None


# ---- vLLM ---------------------------------------------------------------------------------------------

def vllm_error(message: str, status: int) -> JSONResponse:
    """vLLM's error body (api_server's HTTPException handler: ErrorResponse(error=ErrorInfo(...)))."""
    phrases = {400: "Bad Request", 500: "Internal Server Error", 503: "Service Unavailable"}
    return JSONResponse({"error": {"message": message, "type": phrases.get(status, "Error"), "param": None,
                                   "code": status}}, status_code=status)


class FakeVllm(Fake):
    """vLLM dev-mode routes, after vLLM main `vllm/entrypoints/serve/sleep/api_router.py`,
    `vllm/entrypoints/serve/rpc/api_router.py`, `vllm/entrypoints/serve/instrumentator/health.py`
    and `docs/features/sleep_mode.md`: sleep level 1 offloads weights (kept) and discards KV,
    level 2 discards both; wake_up with no tags wakes everything, with tags only those; after a
    level-2 sleep the weights are garbage until `collective_rpc reload_weights`; `is_sleeping` is
    true until every slept tag is woken. Waking a tag that is not asleep is a no-op.

    Not from the source: a level other than 1 or 2 answers 400 (vLLM passes int(level) on; a
    non-number fails with a 500); reload_weights while the weights sleep answers 500 (vLLM would
    write into unmapped memory); an unknown rpc method answers 500 with the worker's
    AttributeError text (how vLLM surfaces a worker exception is not pinned down here).
    `wake_polls` keeps `is_sleeping` true for that many polls after a wake-up (a slow wake)."""

    def __init__(self, tp: int = 1, wake_polls: int = 0):
        super().__init__()
        self.tp, self.wake_polls = tp, wake_polls
        self.asleep: set[str] = set()      # memory tags asleep: "weights", "kv_cache"
        self.weights_valid = True          # false after a level-2 sleep until reload_weights
        self.dead = False
        self.pending_polls = 0
        app = self.app

        @app.post("/sleep")
        async def sleep(request: Request):
            if (injected := self.record(request)) is not None:
                return injected
            level = request.query_params.get("level", "1")
            if level not in ("1", "2"):
                return vllm_error(f"invalid sleep level {level!r}: expected 1 or 2", 400)
            self.asleep = {"weights", "kv_cache"}
            if level == "2":
                self.weights_valid = False
            return Response(status_code=200)

        @app.post("/wake_up")
        async def wake_up(request: Request):
            if (injected := self.record(request)) is not None:
                return injected
            tags = request.query_params.getlist("tags") or ["weights", "kv_cache"]
            was_asleep = bool(self.asleep)
            self.asleep -= set(tags)
            if was_asleep and not self.asleep:
                self.pending_polls = self.wake_polls
            return Response(status_code=200)

        @app.get("/is_sleeping")
        async def is_sleeping(request: Request):
            if (injected := self.record(request)) is not None:
                return injected
            if self.pending_polls > 0:
                self.pending_polls -= 1
                return JSONResponse({"is_sleeping": True})
            return JSONResponse({"is_sleeping": bool(self.asleep)})

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request):
            try:
                body = await request.json()
            except ValueError as e:
                self.record(request)
                return vllm_error(f"JSON decode error: {e}", 400)
            if (injected := self.record(request, body)) is not None:
                return injected
            method = body.get("method")
            if method is None:
                return vllm_error("Missing 'method' in request body", 400)
            if method != "reload_weights":
                return vllm_error(f"'Worker' object has no attribute '{method}'", 500)
            if "weights" in self.asleep:
                return vllm_error("reload_weights: the weights are asleep; wake_up(tags=['weights']) first", 500)
            self.weights_valid = True
            return JSONResponse({"results": [None] * self.tp})

        @app.get("/health")
        async def health(request: Request):
            if (injected := self.record(request)) is not None:
                return injected
            return Response(status_code=503 if self.dead else 200)


# ---- SGLang -------------------------------------------------------------------------------------------

class ReleaseMemoryOccupationReqInput(BaseModel):
    tags: list[str] | None = None


class ResumeMemoryOccupationReqInput(BaseModel):
    tags: list[str] | None = None


class UpdateWeightFromDiskReqInput(BaseModel):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class FakeSglang(Fake):
    """SGLang routes, after SGLang main `python/sglang/srt/entrypoints/http_server.py` and the
    request dataclasses of `python/sglang/srt/managers/io_struct.py`: release/resume answer 200
    with a null body, or 400 `{"error": {"message"}}`; update_weights_from_disk answers
    `{"success", "message", "num_paused_requests"}`, 200 or 400. Tags None means every region.
    `cpu_backup` is `--enable-weights-cpu-backup`: without it resumed weights are garbage until
    re-read from disk. Not from the source: releasing a region already released, or resuming one
    not released, answers 400 (SGLang's scheduler raises in its subprocess and the server dies);
    update_weights_from_disk while the weights are released answers 400."""

    REGIONS = ("weights", "kv_cache")

    def __init__(self, model_paths: set[str], cpu_backup: bool = True):
        super().__init__()
        self.model_paths, self.cpu_backup = set(model_paths), cpu_backup
        self.released: set[str] = set()
        self.weights_valid = True
        self.loaded_path: str | None = None
        app = self.app

        def error(message: str) -> JSONResponse:
            return JSONResponse({"error": {"message": message}}, status_code=400)

        @app.post("/release_memory_occupation")
        async def release(obj: ReleaseMemoryOccupationReqInput, request: Request):
            if (injected := self.record(request, obj.model_dump())) is not None:
                return injected
            tags = obj.tags or list(self.REGIONS)
            if bad := [t for t in tags if t not in self.REGIONS or t in self.released]:
                return error(f"cannot release {bad}: unknown or already released")
            self.released |= set(tags)
            if "weights" in tags and not self.cpu_backup:
                self.weights_valid = False
            return None

        @app.post("/resume_memory_occupation")
        async def resume(obj: ResumeMemoryOccupationReqInput, request: Request):
            if (injected := self.record(request, obj.model_dump())) is not None:
                return injected
            tags = obj.tags or sorted(self.released)
            if bad := [t for t in tags if t not in self.released]:
                return error(f"cannot resume {bad}: not released")
            self.released -= set(tags)
            return None

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(obj: UpdateWeightFromDiskReqInput, request: Request):
            if (injected := self.record(request, obj.model_dump())) is not None:
                return injected
            if "weights" in self.released:
                return JSONResponse({"success": False, "message": "weights memory is released; resume it first",
                                     "num_paused_requests": 0}, status_code=400)
            if obj.model_path not in self.model_paths:
                return JSONResponse({"success": False, "message": f"Failed to get weights iterator: "
                                     f"{obj.model_path} (repository not found).", "num_paused_requests": 0},
                                    status_code=400)
            self.weights_valid, self.loaded_path = True, obj.model_path
            return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                                 "num_paused_requests": 0})

        @app.get("/health")
        async def health(request: Request):
            if (injected := self.record(request)) is not None:
                return injected
            return Response(status_code=200)


# ---- LMCache controller ---------------------------------------------------------------------------------

class LookupRequest(BaseModel):
    tokens: list[int]


class ClearRequest(BaseModel):
    instance_id: str
    location: str


class PinRequest(BaseModel):
    instance_id: str
    location: str
    tokens: list[int]


class MoveRequest(BaseModel):
    old_position: tuple[str, str]
    new_position: tuple[str, str]
    tokens: list[int] | None = []
    copy_: bool | None = Field(False, alias="copy")  # "copy" would shadow BaseModel.copy


class CheckFinishRequest(BaseModel):
    event_id: str


class HealthRequest(BaseModel):
    instance_id: str


class FakeLMCache(Fake):
    """The LMCache controller API, after LMCache `lmcache/v1/api_server/__main__.py` (request and
    response models, every failure a 500 `{"detail"}`). KV is kept per token list as the set of
    (instance, location) holding it. A move finishes at its `finish_polls`-th /check_finish (the
    ones before answer "in_progress") and only then shows in /lookup, modelling the non-blocking
    move /check_finish is documented for; `finish_polls=0` makes /move blocking, as the source's
    executor is (its check_finish still raises NotImplementedError)."""

    def __init__(self, finish_polls: int = 2):
        super().__init__()
        self.finish_polls = finish_polls
        self.kv: dict[tuple[int, ...], set[tuple[str, str]]] = {}
        self.pinned: set[tuple[tuple[int, ...], str, str]] = set()
        self.events: dict[str, dict] = {}
        app = self.app

        def fail(message: str):
            raise HTTPException(status_code=500, detail=message)

        @app.post("/lookup")
        async def lookup(req: LookupRequest, request: Request):
            if (injected := self.record(request, req.model_dump())) is not None:
                return injected
            held = self.kv.get(tuple(req.tokens), set())
            return {"event_id": f"Lookup{len(self.calls)}",
                    "layout_info": {inst: [loc, len(req.tokens)] for inst, loc in sorted(held)}}

        @app.post("/move")
        async def move(req: MoveRequest, request: Request):
            if (injected := self.record(request, req.model_dump(by_alias=True))) is not None:
                return injected
            key = tuple(req.tokens or [])
            if tuple(req.old_position) not in self.kv.get(key, set()):
                fail(f"no KV of {len(key)} tokens at {list(req.old_position)}")
            event_id = f"Move{len(self.events)}"
            self.events[event_id] = event = {"left": self.finish_polls, "key": key, "old": tuple(req.old_position),
                                             "new": tuple(req.new_position), "copy": bool(req.copy_), "done": False}
            if self.finish_polls == 0:  # a blocking move, as the real executor's
                finish(event)
            return {"event_id": event_id, "num_tokens": len(key)}

        def finish(event: dict) -> None:
            held = self.kv[event["key"]]
            held.add(event["new"])
            if not event["copy"]:
                held.discard(event["old"])
            event["done"] = True

        @app.post("/check_finish")
        async def check_finish(req: CheckFinishRequest, request: Request):
            if (injected := self.record(request, req.model_dump())) is not None:
                return injected
            event = self.events.get(req.event_id)
            if event is None:
                fail(f"unknown event {req.event_id}")
            event["left"] = max(0, event["left"] - 1)
            if event["left"] > 0:
                return {"status": "in_progress"}
            if not event["done"]:
                finish(event)
            return {"status": "completed"}

        @app.post("/clear")
        async def clear(req: ClearRequest, request: Request):
            if (injected := self.record(request, req.model_dump())) is not None:
                return injected
            n = 0
            for key, held in self.kv.items():
                if (req.instance_id, req.location) in held:
                    held.discard((req.instance_id, req.location))
                    n += len(key)
            return {"event_id": f"Clear{len(self.calls)}", "num_tokens": n}

        @app.post("/pin")
        async def pin(req: PinRequest, request: Request):
            if (injected := self.record(request, req.model_dump())) is not None:
                return injected
            key = tuple(req.tokens)
            if (req.instance_id, req.location) not in self.kv.get(key, set()):
                fail(f"no KV of {len(key)} tokens at {[req.instance_id, req.location]} to pin")
            self.pinned.add((key, req.instance_id, req.location))
            return {"event_id": f"Pin{len(self.calls)}", "num_tokens": len(key)}

        @app.post("/health")
        async def health(req: HealthRequest, request: Request):
            if (injected := self.record(request, req.model_dump())) is not None:
                return injected
            return {"event_id": f"health{len(self.calls)}", "error_codes": {0: 0}}


# ---- the planner ---------------------------------------------------------------------------------------

class FakePlanner(Fake):
    """The planner's adapter API (statebudget.engine_adapters.base): GET /v1/plan answers the next
    of `offers` (a list of op lists) with version 1, 2, ...; POST /v1/ops/{op_id} records the result
    and answers 409 for op ids in `refuse`, else 200. `auth` keeps the Authorization headers seen."""

    def __init__(self, offers: list[list[dict]], refuse: set[str] = frozenset()):
        super().__init__()
        self.offers, self.refuse = list(offers), set(refuse)
        self.polls = 0
        self.reports: list[tuple[str, dict]] = []
        self.auth: set[str] = set()
        app = self.app

        @app.get("/v1/plan")
        async def plan(request: Request):
            self.record(request)
            self.auth.add(request.headers.get("authorization", ""))
            ops = self.offers[self.polls] if self.polls < len(self.offers) else []
            self.polls += 1
            return {"version": self.polls, "ops": ops}

        @app.post("/v1/ops/{op_id}")
        async def report(op_id: str, request: Request):
            body = await request.json()
            self.record(request, body)
            self.reports.append((op_id, body))
            if op_id in self.refuse:
                return JSONResponse({"detail": f"op {op_id} is stale"}, status_code=409)
            return {"ok": True}
