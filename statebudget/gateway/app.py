"""The gateway: an OpenAI-compatible front door that tells the planner what the agents do.

Each request is one call of a program (`X-Program-Id`, else a program of its own). The gateway
posts `program_started`, `call_arrived`, waits until the planner has the model's weights ready on
a GPU group and starts the call there (`POST /v1/programs/{p}/calls/{c}/start`; a request not
ready at once is a lease due by its timeout first), forwards the request to the engine server of
that group and streams its answer back chunk by chunk, then posts
`call_finished`. Between two requests of a program the agent is away (a tool, a person): that is a
`tool_started` … `tool_finished` wait, which the planner's tool-wait KV rule sees. A
`X-Next-Model: NAME[; in=SECONDS][; p=CONFIDENCE]` header becomes a HandoffLease once the call
ends, due `in` seconds later (default `hint_in_s`).

A request is answered 503 with `Retry-After` when its state is not ready within its timeout
(`X-Request-Timeout` seconds, at most `timeout_s`), or when `queue_limit` requests of its model
already wait; never held past that. An unknown model is a 404 in OpenAI's error shape. An engine
that cannot be reached before any byte of the answer was sent is tried again (the request never
reached it, so it is safe) until the timeout; an engine that fails mid-answer ends the stream with
an error event. Every call ends in the ledger as finished or cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .config import EngineSpec, GatewayConfig
from .wire import Bounded, Held, Outbox, Refused, parse_next_model, prompt_tokens, usage

log = logging.getLogger("statebudget.gateway")
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RETRY_LEASE_S = 0.5  # how often a request refused for want of room asks the planner again
HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "authorization", "te", "upgrade",
       "accept-encoding"}


@dataclass
class Program:
    pid: str
    single: bool                       # no X-Program-Id: it ends with its one call
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: str | None = None         # the open tool wait between two calls
    in_flight: int = 0
    last_s: float = 0.0
    closing: set = field(default_factory=set)  # calls' ends being recorded: the next call waits for them
    hint: tuple | None = None          # (lease id, model, call id) of the lease its last X-Next-Model asked for


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


class Metrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("statebudget_gateway_requests", "requests answered", ["model", "code"], registry=r)
        self.queue = Histogram("statebudget_gateway_queue_seconds", "wait for a free engine slot", ["model"],
                               buckets=BUCKETS, registry=r)
        self.restore = Histogram("statebudget_gateway_restore_seconds", "wait for the planner to ready the model's "
                                 "state", ["model"], buckets=BUCKETS, registry=r)
        self.ttft = Histogram("statebudget_gateway_ttft_seconds", "arrival to the first byte of the answer",
                              ["model"], buckets=BUCKETS, registry=r)
        self.retries = Counter("statebudget_gateway_engine_retries", "requests sent again to an engine that could "
                               "not be reached", ["model"], registry=r)


class Gateway:
    def __init__(self, config: GatewayConfig, planner: httpx.AsyncClient, engines: httpx.AsyncClient | None = None,
                 polls: httpx.AsyncClient | None = None):
        # `planner` for the quick requests; `polls` (default: the same) for the waits on a start,
        # which hold their connection for up to 30 s
        self.config, self.planner, self.polls = config, planner, polls or planner
        self.engines = engines or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0),
                                                    limits=httpx.Limits(max_connections=1000,
                                                                        max_keepalive_connections=200))
        self.programs: dict[str, Program] = {}
        self.slots = {id(e): asyncio.Semaphore(e.max_inflight) for e in config.engines}
        self.held: dict[str, int] = {}     # model -> requests waiting in the gateway
        self.outbox = Outbox(planner)
        self._tasks: set[asyncio.Task] = set()
        self.metrics = Metrics()

    # ---- the planner ---------------------------------------------------------------------------------
    async def _call(self, method: str, path: str, client: httpx.AsyncClient | None = None, **kw) -> httpx.Response:
        """A request to the planner; one that does not get there is a 502 for the client."""
        try:
            return await (client or self.planner).request(method, path, **kw)
        except httpx.HTTPError as e:
            raise Refused(502, f"the planner cannot be reached: {type(e).__name__} {e}", "planner_error",
                          "planner_unreachable", retry_after_s=1) from None

    async def _post(self, path: str, body: dict) -> dict:
        r = await self._call("POST", path, json=body)
        if r.status_code != 200:
            raise Refused(502 if r.status_code >= 500 else 409, f"the planner refused {body.get('type', path)}: "
                          f"{r.status_code} {r.text[:300]}", "planner_error", str(r.status_code), retry_after_s=1)
        return r.json()

    async def event(self, **body) -> dict:
        return await self._post("/v1/events", body)

    async def report_awake(self, node_tokens: dict[str, str]) -> list[str]:
        """Engines of the config that are up and awake now, reported as the planner's ready copies
        (PUT /v1/inventory with that node's adapter token): one model serves with no adapter."""
        found: dict[str, list[dict]] = {}
        for e in self.config.engines:
            if e.node not in node_tokens or not await self._awake(e):
                continue
            found.setdefault(e.node, []).append({"object": ["w", e.model], "tier": e.gpu_tier})
        for node, copies in found.items():
            r = await self.planner.put("/v1/inventory", json={"node": node, "reason": "adapter started", "copies": copies},
                                       headers={"Authorization": f"Bearer {node_tokens[node]}"})
            if r.status_code != 200:
                raise RuntimeError(f"the planner refused node {node}'s inventory: {r.status_code} {r.text[:300]}")
        return [c["object"][1] + "@" + c["tier"] for cs in found.values() for c in cs]

    async def _awake(self, e: EngineSpec) -> bool:
        try:
            url = e.base_url()
            if e.check_path and (await self.engines.get(url + e.check_path, timeout=2)).status_code != 200:
                return False
            r = await self.engines.get(url + "/is_sleeping", timeout=2)
            return r.status_code == 404 or (r.status_code == 200 and not r.json().get("is_sleeping"))
        except (httpx.HTTPError, ValueError, RuntimeError):
            return False

    # ---- one request ---------------------------------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response:
        t0 = time.monotonic()
        model, held = "?", None
        try:
            body = await self._body(request)
            model = self.config.resolve(str(body.get("model"))) or ""
            if not model:
                raise Refused(404, f"The model `{body.get('model')}` does not exist (this gateway serves "
                              f"{', '.join(self.config.models())})", "invalid_request_error", "model_not_found",
                              param="model")
            timeout_s = self._timeout(request)
            hint = request.headers.get("x-next-model")
            hint = parse_next_model(hint, self.config.hint_in_s) if hint else None
            if hint and not self.config.resolve(hint[0]):
                raise Refused(404, f"X-Next-Model: the model `{hint[0]}` does not exist", "invalid_request_error",
                              "model_not_found")
            if self.held.get(model, 0) >= self.config.queue_limit:
                raise Refused(503, f"{self.held[model]} requests for {model} wait already", "overloaded",
                              "queue_full", retry_after_s=self.config.hint_in_s)
            held = Held(self.held, model)  # counted before the first await: a burst sees it
            return await self._serve(request, path, body, model, hint, t0, t0 + timeout_s, held)
        except Refused as e:
            self.metrics.requests.labels(model or "?", str(e.status)).inc()
            return e.response()
        finally:
            if held is not None:
                held.release()

    async def _body(self, request: Request) -> dict:
        """The request's JSON object, checked. `request.state.raw` keeps its bytes where they can go
        to the engine as they came: UTF-8 (strict), as the JSON the engine reads is."""
        raw = await request.body()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and text.startswith("\ufeff"):
            text = None  # a byte order mark: read from the bytes, sent written anew
        try:  # NaN and Infinity are not JSON: an engine could read them as numbers that pass its checks
            body = json.loads(raw if text is None else text, parse_constant=_not_json)
        except ValueError:
            raise Refused(400, "the body is not JSON", "invalid_request_error") from None
        request.state.raw = raw if text is not None else None
        if not isinstance(body, dict) or "model" not in body:
            raise Refused(400, "the body must be a JSON object with a `model`", "invalid_request_error", param="model")
        for k in ("max_tokens", "max_completion_tokens"):
            v = body.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise Refused(400, f"`{k}` must be a positive integer, not {json.dumps(v)[:40]}",
                              "invalid_request_error", param=k)
        return body

    def _timeout(self, request: Request) -> float:
        raw = request.headers.get("x-request-timeout")
        try:
            t = float(raw) if raw else self.config.timeout_s
        except ValueError:
            t = math.nan
        if not t > 0:  # NaN too
            raise Refused(400, f"X-Request-Timeout: {raw!r} is not a positive number of seconds",
                          "invalid_request_error", "bad_header")
        return min(t, self.config.timeout_s)

    async def _serve(self, request, path, body, model, hint, t0, deadline, held: "Held"):
        pid = request.headers.get("x-program-id")
        prog = self.programs.get(pid) if pid else None
        before = []
        if prog is None:
            prog = Program(pid or "gw-" + uuid.uuid4().hex[:20], single=not pid)
            before.append({"type": "program_started", "program": prog.pid})
            if pid:
                self.programs[pid] = prog
        if prog.closing:
            await asyncio.wait(list(prog.closing))
        call, hinted_lease = "c-" + uuid.uuid4().hex[:16], None
        if prog.hint is not None:
            lease_id, hinted, hinted_call = prog.hint
            prog.hint = None
            if hinted == model:  # the call the lease is for: its arrival consumes a ready one
                call, hinted_lease = hinted_call, lease_id
            else:  # the agent went elsewhere: the state held for it goes
                self._later(self.planner.delete(f"/v1/leases/{lease_id}"))
        async with prog.lock:  # the program's events in order: arrival, start, end, the wait after it
            if prog.waiting:
                before.append({"type": "tool_finished", "program": prog.pid, "tool": "agent", "call": prog.waiting})
            before.append({"type": "call_arrived", "program": prog.pid, "call": call, "model": model,
                           "context_tokens": prompt_tokens(body),
                           "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 1024})
            try:  # one round trip when the state is ready; the planner applies `before` up to a refusal
                first = await self._start(prog, call, 0.0, before)
            except Refused:
                if pid and before[0]["type"] == "program_started":
                    self.programs.pop(pid, None)
                prog.waiting = None if prog.waiting and prog.in_flight == 0 else prog.waiting
                raise
            prog.waiting = None
            prog.in_flight += 1
            prog.last_s = time.monotonic()
        try:
            ready = first if first["ready"] else await self._ready(prog, call, model, deadline)
        except BaseException:
            self._close_later(prog, call, finished=False)
            raise
        finally:
            if hinted_lease is not None:  # consumed at arrival if it was ready; else it would hold its state
                self._later(self.planner.delete(f"/v1/leases/{hinted_lease}"))
        self.metrics.restore.labels(model).observe(time.monotonic() - t0)
        try:
            engine, slot = await self._slot(model, ready, deadline)
        except BaseException:
            self._close_later(prog, call, finished=False)
            raise
        held.release()
        return await self._forward(request, path, body, model, engine, slot, prog, call, hint, t0, deadline)

    async def _ready(self, prog: Program, call: str, model: str, deadline: float) -> dict:
        """Until the planner has the call's model ready on a GPU group and has started the call
        there. The request becomes a lease due by its timeout, which the planner quotes and
        prepares. One whose quote is past the timeout is refused now, with the quote as
        Retry-After; one refused for want of room (loads in flight, pinned state) is asked again
        every `RETRY_LEASE_S` until the timeout."""
        out, lease, why = {"ready": False}, None, "never prepared"
        try:
            while not out["ready"]:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Refused(503, f"{model} not ready within the request's timeout ({why})", "overloaded",
                                  "not_ready", retry_after_s=self.config.hint_in_s)
                if lease is None or lease["decision"] == "rejected":
                    lease = await self._post("/v1/leases", {"program": prog.pid, "model": model, "for_call": call,
                                                            "deadline_s": left, "confidence": 1.0})
                    p95, why = lease["quote"]["p95_s"], lease.get("reason") or "rejected"
                    if lease["decision"] == "rejected" and lease.get("retry_after_s") is not None:
                        # the planner is past capacity where the model would run: asking again
                        # every RETRY_LEASE_S only adds load; the client is told when to come back
                        raise Refused(503, f"{model} not prepared: {why}", "overloaded", "not_ready",
                                      retry_after_s=max(1.0, lease["retry_after_s"]))
                    if lease["decision"] == "rejected" and p95 > left:
                        raise Refused(503, f"{model} cannot be ready within the request's timeout ({left:.1f} s): "
                                      f"{why}", "overloaded", "not_ready",
                                      retry_after_s=p95 if math.isfinite(p95) else self.config.hint_in_s)
                wait = min(left, RETRY_LEASE_S if lease["decision"] == "rejected" else 30.0)
                out = await self._start(prog, call, wait)
            return out
        finally:
            if lease is not None and lease["decision"] != "rejected":
                self._later(self.planner.delete(f"/v1/leases/{lease['lease_id']}"))  # its reservation is the call's now

    async def _start(self, prog: Program, call: str, wait_s: float, before: list | None = None) -> dict:
        r = await self._call("POST", f"/v1/programs/{prog.pid}/calls/{call}/start", self.polls if wait_s else None,
                             params={"wait": wait_s},
                             json={"before": before} if before else None)
        if r.status_code != 200:
            conflict = r.status_code == 409
            raise Refused(409 if conflict else 502, f"the planner: {r.status_code} {r.text[:300]}",
                          "invalid_request_error" if conflict else "planner_error",
                          "program_conflict" if conflict else str(r.status_code), retry_after_s=None if conflict else 1)
        return r.json()

    async def _slot(self, model: str, ready: dict, deadline: float) -> tuple[EngineSpec, asyncio.Semaphore]:
        mine = [e for e in self.config.engines if e.model == model and e.node == ready["node"]]
        engine = next((e for e in mine if e.gpu_tier == ready["group"]), None) or (mine[0] if mine else None)
        if engine is None:
            raise Refused(502, f"the planner readied {model} on {ready['group']} of node {ready['node']}, where this "
                          f"gateway has no engine of it: give the catalog model the GPUs of its engines (`gpus`)",
                          "gateway_config_error", "no_engine_there", retry_after_s=self.config.hint_in_s)
        slot = self.slots[id(engine)]
        q0 = time.monotonic()
        try:
            if slot.locked():  # a free slot is taken at once, whatever time is left
                await asyncio.wait_for(slot.acquire(), max(0.0, deadline - q0))
            else:
                await slot.acquire()
        except TimeoutError:
            raise Refused(503, f"every slot of {model}'s engine stays busy past the request's timeout", "overloaded",
                          "engine_busy", retry_after_s=self.config.hint_in_s) from None
        self.metrics.queue.labels(model).observe(time.monotonic() - q0)
        return engine, slot

    async def _forward(self, request, path, body, model, engine, slot, prog, call, hint, t0, deadline) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP and not k.lower().startswith("x-")}
        headers["accept-encoding"] = "identity"  # the bytes are passed on as they come, never re-encoded
        headers["content-type"] = "application/json"  # it parsed as JSON, whatever the client said
        name = engine.upstream_model or model
        raw = request.state.raw
        # the client's bytes go on as they came (no second encoding of a long prompt), unless the
        # model is renamed; written anew, as ASCII, a lone surrogate escaped is still JSON
        content = raw if raw is not None and body.get("model") == name else json.dumps({**body, "model": name}).encode()
        try:
            while True:
                try:
                    upstream = await self.engines.send(self.engines.build_request(
                        "POST", engine.base_url() + path, headers=headers, content=content), stream=True)
                    break
                except httpx.ConnectError:  # it never got the request: safe to send again once it is back
                    if time.monotonic() + 0.2 >= deadline:
                        raise Refused(503, f"{model}'s engine cannot be reached", "engine_unavailable",
                                      "engine_down", retry_after_s=self.config.hint_in_s) from None
                    self.metrics.retries.labels(model).inc()
                    await asyncio.sleep(0.2)  # back-off before the next connection attempt
                except httpx.HTTPError as e:  # it may have started on it: not sent again
                    raise Refused(502, f"{model}'s engine failed before answering: {type(e).__name__}",
                                  "engine_error", "engine_failed") from None
        except BaseException:
            slot.release()
            self._close_later(prog, call, finished=False)
            raise
        if upstream.status_code != 200 or not body.get("stream"):
            try:
                data = await upstream.aread()
            except httpx.HTTPError as e:
                self._close_later(prog, call, finished=False)
                raise Refused(502, f"{model}'s engine failed mid-answer: {type(e).__name__}", "engine_error",
                              "engine_failed") from None
            finally:
                await upstream.aclose()
                slot.release()
            self.metrics.ttft.labels(model).observe(time.monotonic() - t0)  # the whole answer is its first token
            self._close_later(prog, call, finished=upstream.status_code == 200, answer=data, hint=hint)
            self.metrics.requests.labels(model, str(upstream.status_code)).inc()
            return Response(data, status_code=upstream.status_code,
                            media_type=upstream.headers.get("content-type", "application/json"))

        async def chunks():
            n, done, tail = 0, False, b""
            try:
                async for chunk in upstream.aiter_raw():
                    if not n and chunk:
                        self.metrics.ttft.labels(model).observe(time.monotonic() - t0)
                    n += chunk.count(b"data: ")
                    tail = (tail + chunk)[-2048:]
                    done = done or b"data: [DONE]" in tail  # whole, even if the client leaves before the end
                    yield chunk
                done = True
            except httpx.HTTPError as e:
                if not done:
                    err = {"error": {"message": f"{model}'s engine failed mid-answer: {type(e).__name__}",
                                     "type": "engine_error", "code": "engine_failed"}}
                    yield b"data: " + json.dumps(err).encode() + b"\n\n"
            finally:
                await upstream.aclose()
                slot.release()
                # not awaited here: the client's disconnect after `[DONE]` cancels this generator
                self._close_later(prog, call, finished=done, answer=tail, chunks=n, hint=hint)
                self.metrics.requests.labels(model, "200" if done else "502").inc()

        return StreamingResponse(chunks(), status_code=200, media_type="text/event-stream")

    def _close_later(self, prog: Program, call: str, **kw) -> None:
        """Record the call's end in a task of its own, after the answer went out."""
        task = asyncio.get_running_loop().create_task(self._close(prog, call, **kw))
        prog.closing.add(task)
        task.add_done_callback(prog.closing.discard)

    async def _close(self, prog: Program, call: str, finished: bool, answer: bytes = b"", chunks: int = 0,
                     hint=None) -> None:
        """The call's end in the ledger, then the wait that follows it (or the program's end), then
        the hinted lease. Under the program's lock: its next call's events come after these. The
        events of calls that end together go in one batch (`Outbox`)."""
        async with prog.lock:
            prog.in_flight -= 1
            prog.last_s = time.monotonic()
            if finished:
                prompt, output = usage(answer, chunks)
                evs = [{"type": "call_finished", "program": prog.pid, "call": call, "output_tokens": output,
                        "tokens": prompt + output}]
            else:
                evs = [{"type": "call_cancelled", "program": prog.pid, "call": call}]
            if prog.single:
                evs.append({"type": "program_finished", "program": prog.pid})
            elif prog.in_flight == 0:
                prog.waiting = call + ":wait"
                evs.append({"type": "tool_started", "program": prog.pid, "tool": "agent", "call": prog.waiting})
            try:
                try:
                    results = await self.outbox.send(evs)
                except Refused:
                    prog.waiting = None  # the planner never saw the wait start: no end for it either
                    raise
                for ev, (status, out) in zip(evs, results):
                    if status != 200:
                        log.warning("gateway: the planner refused %s of %s: %s %s", ev["type"], prog.pid, status, out)
                        if ev["type"] == "tool_started":
                            prog.waiting = None
                if hint and not prog.single:
                    # for the program's next call, whose id is chosen now: its arrival consumes the
                    # lease (a ready lease holds its state until it is used or cancelled)
                    name, in_s, p = hint
                    model, nxt = self.config.resolve(name), "c-" + uuid.uuid4().hex[:16]
                    lease = await self._post("/v1/leases", {"program": prog.pid, "model": model, "deadline_s": in_s,
                                                            "confidence": p, "for_call": nxt})
                    if prog.hint is not None:  # a newer hint of the program replaces an unused one
                        self._later(self.planner.delete(f"/v1/leases/{prog.hint[0]}"))
                        prog.hint = None
                    if lease["decision"] != "rejected":
                        prog.hint = (lease["lease_id"], model, nxt)
            except (Refused, httpx.HTTPError) as e:  # the client has its answer; the ledger's gap is logged
                log.warning("gateway: the end of call %s of %s not recorded: %s", call, prog.pid, e)

    def _later(self, coro) -> None:
        """A request to the planner that nothing waits for (a lease no longer needed)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def expire(self) -> int:
        """Finish the programs idle past `program_idle_s`; returns how many. Each is let go of even
        when the planner cannot be told (it is logged): one program never blocks the others."""
        now, n = time.monotonic(), 0
        for pid, prog in list(self.programs.items()):
            if prog.in_flight or now - prog.last_s <= self.config.program_idle_s:
                continue
            if prog.closing:  # its last call's end is on its way: the program ends after it
                await asyncio.wait(list(prog.closing))
            if prog.in_flight or self.programs.get(pid) is not prog:
                continue
            del self.programs[pid]
            n += 1
            async with prog.lock:
                try:
                    if prog.hint is not None:
                        await self._call("DELETE", f"/v1/leases/{prog.hint[0]}")
                    evs = ([{"type": "tool_finished", "program": prog.pid, "tool": "agent", "call": prog.waiting}]
                           if prog.waiting else []) + [{"type": "program_finished", "program": prog.pid}]
                    for ev, (status, out) in zip(evs, await self.outbox.send(evs)):
                        if status != 200:
                            log.warning("gateway: the planner refused %s of %s: %s %s", ev["type"], pid, status, out)
                except Refused as e:
                    log.warning("gateway: the end of idle program %s not recorded: %s", pid, e)
        return n


def planner_clients(planner_url: str, token: str, connections: int,
                    transport=None) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """(quick, polls): the clients a gateway asks its planner with. httpcore scans every pooled
    connection, idle ones too, for every request it assigns (with 16 clients and a pool of 200, a
    third of the gateway's time). The planner answers one request at a time, so the quick requests
    share `connections` (`GatewayConfig.planner_connections`), and those beyond wait in
    `Bounded`'s queue, not httpcore's. The waits on a start hold a connection up to 30 s: they get
    a pool of their own, which keeps few idle. `transport` (tests): one for both, as it is."""
    def client(transport) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=planner_url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(70.0, connect=5.0), transport=transport)
    if transport is not None:
        return client(transport), client(transport)
    quick = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=connections,
                                                         max_keepalive_connections=connections))
    polls = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=200, max_keepalive_connections=8))
    return client(Bounded(quick, connections)), client(polls)


def make_app(config: GatewayConfig, planner_url: str, token: str, adapter_tokens: dict[str, str] | None = None,
             planner_transport=None, engine_client: httpx.AsyncClient | None = None) -> FastAPI:
    planner, polls = planner_clients(planner_url, token, config.planner_connections, planner_transport)
    gw = Gateway(config, planner, engine_client, polls)

    async def expiry_loop():
        while True:
            await asyncio.sleep(min(30.0, config.program_idle_s / 2))  # a timer, not a synchronisation
            try:
                await gw.expire()
            except (Refused, httpx.HTTPError) as e:
                log.warning("gateway: idle programs not finished: %s", e)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loop = asyncio.get_running_loop()
        task = None
        try:
            found = await gw.report_awake(adapter_tokens or {})
            if found:
                log.info("gateway: engines found awake: %s", ", ".join(found))
            task = asyncio.create_task(expiry_loop())
            yield
        finally:
            if task is not None:
                task.cancel()
            for c in (planner, polls, gw.engines):
                try:
                    await c.aclose()
                except Exception as e:  # one client that fails to close leaves the others to close
                    log.warning("gateway: a client did not close: %s", e)

    app = FastAPI(title="StateBudget gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await gw.handle(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await gw.handle(request, "/v1/completions")

    @app.get("/v1/models")
    async def models():
        now = int(time.time())
        names = sorted({n for e in config.engines for n in [e.model, *e.aliases]})
        return {"object": "list", "data": [{"id": n, "object": "model", "created": now, "owned_by": "statebudget"}
                                           for n in names]}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "programs": len(gw.programs), "held": sum(gw.held.values())}

    return app
