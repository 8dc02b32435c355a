"""The gateway end to end with the `openai` client: a planner -> coder -> reviewer program with
X-Next-Model hints, streaming, errors in OpenAI's shape, overload, and the books it keeps."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from statebudget.gateway.wire import Refused, parse_next_model
from statebudget.gateway.fake_engine import make_app as engine_app

from tests.fake_engines import serve
from tests.gateway.stack import gateway_stack
from tests.helpers import wait_until

pytestmark = pytest.mark.xdist_group("e2e")
PROMPT = [{"role": "user", "content": "go " * 40}]


def answer(model: str, n: int) -> str:
    return "".join(f"{model}:{k} " for k in range(n))


def calls_of(live, program: str) -> dict:
    rec = next(r for r in live.programs.values() if r.program.endswith(program))
    return {c: row["status"] for c, row in rec.calls.items()}


def test_a_hinted_program_finds_each_next_model_awake_and_gets_its_answers_whole(tmp_path):
    with gateway_stack(tmp_path, wake_s=0.3) as s:
        client = openai.OpenAI(base_url=s["url"] + "/v1", api_key="unused", max_retries=0)
        steps = [("planner", "coder"), ("coder", "reviewer"), ("reviewer", None)]
        ttft = []
        for model, nxt in steps:
            headers = {"X-Program-Id": "task-1"} | ({"X-Next-Model": f"{nxt}; in=1.5"} if nxt else {})
            t0 = time.monotonic()
            stream = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=8, stream=True,
                                                    extra_headers=headers)
            pieces = []
            for c in stream:
                if c.choices and c.choices[0].delta.content:
                    if not pieces:
                        ttft.append(time.monotonic() - t0)
                    pieces.append(c.choices[0].delta.content)
            assert pieces == [f"{model}:{k} " for k in range(8)]  # every chunk, in order, from that model
            if nxt:  # the hinted engine wakes during the agent's tool wait, before its call is sent
                wait_until(lambda m=nxt: httpx.get(s["engines"][m] + "/is_sleeping").json() == {"is_sleeping": False},
                           10, f"the hinted {nxt} engine to be awake")
        live = s["live"]
        wait_until(lambda: set(calls_of(live, "task-1").values()) == {"finished"}, 10, "every call to finish")
        assert len(calls_of(live, "task-1")) == 3
        rec = next(r for r in live.programs.values() if r.program == "task-1")
        stalls = {row["model"]: row["stall_s"] for row in rec.calls.values()}
        # the first call woke its engine (0.3 s at least); the hinted ones found theirs awake
        assert stalls["planner"] >= 0.3
        assert stalls["coder"] < stalls["planner"] and stalls["reviewer"] < stalls["planner"]
        print(f"client TTFT: first {ttft[0]:.3f} s, hinted {ttft[1]:.3f} s, {ttft[2]:.3f} s; planner stall {stalls}")
        gw = s["gateway"]
        gw.config.program_idle_s = 0.0
        asyncio.run_coroutine_threadsafe(gw.expire(), s["loop"]).result(10)
        assert rec.status == "finished"


def test_plain_completions_models_and_openai_errors(tmp_path):
    with gateway_stack(tmp_path, wake_s=0.0) as s:
        client = openai.OpenAI(base_url=s["url"] + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="coder", messages=PROMPT, max_tokens=5)
        assert r.choices[0].message.content == answer("coder", 5) and r.usage.completion_tokens == 5
        r = client.completions.create(model="reviewer", prompt="say it", max_tokens=3)
        assert r.choices[0].text == answer("reviewer", 3)
        text = "".join(c.choices[0].text for c in client.completions.create(model="planner", prompt="x", max_tokens=4,
                                                                              stream=True) if c.choices)
        assert text == answer("planner", 4)
        assert sorted(m.id for m in client.models.list()) == ["coder", "planner", "reviewer"]
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="gpt-5", messages=PROMPT)
        assert e.value.body["code"] == "model_not_found" and "gpt-5" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="coder", messages=PROMPT, extra_headers={"X-Next-Model": "coder; in=x"})
        assert "X-Next-Model" in e.value.body["message"]
        # one program per request without X-Program-Id: each ends with its call
        live = s["live"]
        wait_until(lambda: len(live.programs) == 3 and all(p.status == "finished" for p in live.programs.values()),
                   10, "the three one-call programs to finish")
        metrics = httpx.get(s["url"] + "/metrics").text
        assert 'statebudget_gateway_requests_total{code="200",model="coder"} 1.0' in metrics
        assert 'statebudget_gateway_requests_total{code="404",model="?"} 1.0' in metrics


def test_more_demand_than_the_engine_serves_gets_503_with_retry_after_never_a_hang(tmp_path):
    # one slot and one place in the queue; each answer takes ~0.8 s (16 tokens at 20/s)
    with gateway_stack(tmp_path, wake_s=0.0, tokens_per_s=20.0, queue_limit=1, max_inflight=1) as s:
        httpx.post(s["url"] + "/v1/chat/completions", json={"model": "coder", "messages": PROMPT, "max_tokens": 1},
                   timeout=30).raise_for_status()  # coder awake first: then only the slot limits

        async def burst():
            async with httpx.AsyncClient(base_url=s["url"], timeout=20) as c:
                return await asyncio.gather(*(c.post("/v1/chat/completions", headers={"X-Request-Timeout": "0.3"},
                                                     json={"model": "coder", "messages": PROMPT}) for _ in range(6)))
        t0 = time.monotonic()
        out = asyncio.run(burst())
        codes = sorted(r.status_code for r in out)
        assert set(codes) <= {200, 503} and codes.count(200) >= 1 and codes.count(503) >= 4, codes
        for r in out:
            if r.status_code == 503:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["type"] == "overloaded"
        assert time.monotonic() - t0 < 15  # bounded by the request timeouts, not a hang
        live = s["live"]
        wait_until(lambda: all(p.status == "finished" for p in live.programs.values()), 10, "every program to end")
        statuses = {row["status"] for p in live.programs.values() for row in p.calls.values()}
        assert statuses <= {"finished", "cancelled"}  # nothing left open in the ledger


def test_one_engine_found_awake_at_start_serves_with_no_adapter_running(tmp_path):
    with serve(engine_app("coder")) as coder:  # awake, as an engine someone started by hand
        with gateway_stack(tmp_path, engines={"coder": coder}, adapter=False, report_awake=True) as s:
            client = openai.OpenAI(base_url=s["url"] + "/v1", api_key="unused", max_retries=0)
            r = client.chat.completions.create(model="coder", messages=PROMPT, max_tokens=2)
            assert r.choices[0].message.content == answer("coder", 2)
            copies = {(c["object"][1], c["tier"]) for c in s["live"].residency().body()["copies"] if c["ready"]}
            assert ("coder", "gpu:0") in copies


def recording(app, seen: list):
    """`app` with every completion request's headers and body appended to `seen` as it arrived."""
    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            return await app(scope, receive, send)
        messages, body, more = [], b"", True
        while more:
            m = await receive()
            messages.append(m)
            body, more = body + m.get("body", b""), m.get("more_body", False)
        seen.append(([v for k, v in scope["headers"] if k == b"content-type"], body))

        async def replay():  # the body as it came, then the client's connection itself (its disconnect)
            return messages.pop(0) if messages else await receive()
        return await app(scope, replay, send)
    return wrapped


def test_the_engine_gets_the_clients_bytes_unless_the_model_is_renamed(tmp_path):
    seen = []
    with serve(recording(engine_app("coder"), seen)) as coder:
        with gateway_stack(tmp_path, engines={"coder": coder}, adapter=False, report_awake=True,
                           spec={"coder": {"aliases": ["my-coder"]}}) as s:
            raw = (b'{"model":"coder",   "messages": [{"role": "user", "content": "hi \\u00e9"}], "max_tokens": 2,'
                   b' "x_extra": {"b": 1, "a": [2, 1]}}')
            r = httpx.post(s["url"] + "/v1/chat/completions", content=raw, headers={"content-type": "text/plain"})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == answer("coder", 2)
            types, body = seen[-1]
            assert body == raw  # not decoded and encoded again: spacing, escapes and order as sent
            assert types == [b"application/json"]
            # an alias is renamed to the engine's model, so that body is written anew, as JSON too
            r = httpx.post(s["url"] + "/v1/chat/completions", headers={"content-type": "text/plain"},
                           content=json.dumps({"model": "my-coder", "messages": PROMPT, "max_tokens": 2, "x_extra": 1}))
            assert r.status_code == 200
            types, body = seen[-1]
            sent = json.loads(body)
            assert types == [b"application/json"]
            assert sent["model"] == "coder" and sent["x_extra"] == 1 and sent["messages"] == PROMPT
            # JSON in UTF-16 reaches the engine as UTF-8 JSON; NaN is not JSON, and never reaches it
            utf16 = json.dumps({"model": "coder", "messages": PROMPT, "max_tokens": 2}).encode("utf-16")
            r = httpx.post(s["url"] + "/v1/chat/completions", content=utf16)
            assert r.status_code == 200 and json.loads(seen[-1][1].decode("utf-8"))["messages"] == PROMPT
            n = len(seen)
            r = httpx.post(s["url"] + "/v1/chat/completions",
                           content=b'{"model": "coder", "messages": [], "temperature": NaN}')
            assert r.status_code == 400 and r.json()["error"]["message"] == "the body is not JSON" and len(seen) == n


def test_next_model_header_parses_or_says_what_is_wrong():
    assert parse_next_model("coder; in=2.5; p=0.7", 5.0) == ("coder", 2.5, 0.7)
    assert parse_next_model("coder", 5.0) == ("coder", 5.0, 1.0)
    for bad in ("coder; in=-1", "coder; p=2", "coder; at=3", "; in=2"):
        with pytest.raises(Refused):
            parse_next_model(bad, 5.0)


def test_bad_requests_and_an_unreachable_planner_are_answered_in_openai_shape():
    from fastapi.testclient import TestClient

    from statebudget.gateway.app import make_app
    from statebudget.gateway.config import GatewayConfig

    cfg = GatewayConfig(engines=[{"model": "coder", "url": "http://127.0.0.1:9"}])
    with TestClient(make_app(cfg, "http://127.0.0.1:9", "token")) as c:  # nothing listens on port 9
        body = {"model": "coder", "messages": PROMPT}
        for headers, extra, what in (({"X-Request-Timeout": "nan"}, {}, "X-Request-Timeout"),
                                     ({"X-Request-Timeout": "-1"}, {}, "X-Request-Timeout"),
                                     ({}, {"max_tokens": "many"}, "max_tokens"), ({}, {"max_tokens": 0}, "max_tokens")):
            r = c.post("/v1/chat/completions", json={**body, **extra}, headers=headers)
            assert r.status_code == 400 and what in r.json()["error"]["message"], r.text
        r = c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = c.post("/v1/chat/completions", json=body, headers={"X-Program-Id": "p1"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "planner_unreachable"
        assert r.headers["retry-after"] == "1"
        assert c.app.state.gateway.programs == {}  # a program the planner never saw is not kept
        assert c.app.state.gateway.held == {"coder": 0}


def test_a_lease_rejected_past_capacity_is_a_503_with_the_planners_retry_after():
    import httpx

    from tests.gateway.stack import ready_refusal

    posted = []

    def planner(request):
        posted.append(request.url.path)
        return httpx.Response(200, json={"lease_id": "L1", "decision": "rejected", "quote": {"p50_s": 1.0, "p95_s": 2.0},
                                         "reason": "overloaded: 9 calls wait for HBM on gpu:0, about 42 s of work; "
                                                   "retry after 42 s", "retry_after_s": 42.0})

    err = ready_refusal(planner, "p1", "c1", 60.0)
    # the quote (2 s) is within the timeout: only the planner's word stops the gateway asking again
    assert err.status == 503 and err.retry_after_s == 42.0 and "overloaded: 9 calls" in str(err)
    assert posted == ["/v1/leases"]


def test_starts_waiting_at_the_planner_never_hold_up_its_quick_requests():
    from fastapi import FastAPI

    from statebudget.gateway.app import Program, make_app
    from statebudget.gateway.config import GatewayConfig

    assert GatewayConfig.model_fields["planner_connections"].default != 3
    with pytest.raises(ValueError, match="planner_connections"):
        GatewayConfig(engines=[{"model": "coder", "url": "http://127.0.0.1:9"}], planner_connections=0)

    release, waiting = threading.Event(), []
    planner = FastAPI()

    @planner.post("/v1/programs/{program}/calls/{call}/start")
    def start(program: str, call: str, wait: float = 0.0):  # in the server's thread pool: it may block
        waiting.append(program)
        release.wait(30)
        return {"call": call, "status": "arrived", "ready": False, "group": None, "node": None}

    @planner.post("/v1/leases")
    def lease():
        return {"lease_id": "L1", "decision": "accepted", "quote": {"p95_s": 0.0}}

    async def run(url):
        # the gateway's own clients, as `make_app` wires them
        cfg = GatewayConfig(engines=[{"model": "coder", "url": "http://127.0.0.1:9"}], planner_connections=3)
        gw = make_app(cfg, url, "token").state.gateway
        assert gw.planner._transport.slots._value == 3  # the config's bound, not the default's
        try:
            n = 2 * cfg.planner_connections
            waits = [asyncio.create_task(gw._start(Program(f"p{i}", single=False), "c", 20.0)) for i in range(n)]
            for _ in range(2000):  # until every wait is held at the planner (bounded)
                if len(waiting) == n:
                    break
                await asyncio.sleep(0.005)
            assert len(waiting) == n, f"{len(waiting)} of {n} waits reached the planner, the rest wait here"
            out = await asyncio.wait_for(gw._post("/v1/leases", {"program": "p0", "model": "coder"}), 10)
            assert out["decision"] == "accepted" and not any(t.done() for t in waits)
            # more quick requests than connections: each waits its turn, none is lost
            posts = [gw._post("/v1/leases", {"program": f"q{i}", "model": "coder"})
                     for i in range(5 * cfg.planner_connections)]
            many = await asyncio.wait_for(asyncio.gather(*posts), 20)
            assert all(r["decision"] == "accepted" for r in many)
            release.set()
            assert all(r["ready"] is False for r in await asyncio.gather(*waits))
        finally:
            release.set()
            await gw.planner.aclose()
            await gw.polls.aclose()

    with serve(planner) as url:
        try:
            asyncio.run(run(url))
        finally:
            release.set()


def test_a_bounded_transport_waits_for_a_slot_no_longer_than_the_pool_timeout():
    from statebudget.gateway.wire import Bounded

    async def run():
        gate = asyncio.Event()

        async def handler(request):
            await gate.wait()
            return httpx.Response(200, json={"path": request.url.path})
        bounded = Bounded(httpx.MockTransport(handler), 1)
        async with httpx.AsyncClient(transport=bounded, base_url="http://planner") as c:
            first = asyncio.create_task(c.get("/a"))
            for _ in range(1000):  # until the first request holds the one slot (bounded)
                if bounded.slots.locked():
                    break
                await asyncio.sleep(0)
            with pytest.raises(httpx.PoolTimeout):  # (wait_for: a wait without a bound fails, not hangs)
                await asyncio.wait_for(c.get("/b", timeout=httpx.Timeout(5.0, pool=0.05)), 10)
            gate.set()
            assert (await first).json() == {"path": "/a"}
            assert (await c.get("/c")).json() == {"path": "/c"}  # its slot came back, and the timed-out one's
            assert not bounded.slots.locked()
    asyncio.run(run())
