"""A whole gateway stack on 127.0.0.1, in threads of the test process: the planner service (one
node, one 0.3 GB GPU: two of the toy catalog's planner, coder and reviewer fit at once), fake
OpenAI engines of the three models on that GPU (asleep until the planner wakes them), the vLLM
adapter of the node driving them, and the gateway in front."""

from __future__ import annotations

import sys
import threading
from contextlib import ExitStack, contextmanager

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.engine_adapters.local import LocalAdapter
from statebudget.engine_adapters.supervisor import Supervisor
from statebudget.engine_adapters.vllm import VllmAdapter
from statebudget.gateway.app import make_app as gateway_app
from statebudget.gateway.config import GatewayConfig
from statebudget.gateway.fake_engine import make_app as engine_app
from statebudget.models.load import load_catalog
from statebudget.planner.target import TrackConfig
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner

from tests.fake_engines import serve
from tests.helpers import cluster, free_port

TOK = {"runtime": "gw-runtime-0123456789", "n0": "gw-adapter-n0-0123456789", "admin": "gw-admin-0123456789"}
MODELS = ("planner", "coder", "reviewer")


@contextmanager
def gateway_stack(tmp, wake_s: float = 0.3, tokens_per_s: float = 200.0, engines: dict | None = None,
                  adapter: bool = True, max_inflight: int = 64, supervised: bool = False, report_awake: bool = False,
                  local: bool = False, spec: dict | None = None, **config):
    """Yields a dict: `url` (the gateway), `planner` (its URL), `engines` {model: URL}, `live` (the
    LivePlanner), `gateway` (the Gateway object), `loop` (the gateway's event loop), `supervisor`.
    `engines` given: {model: URL} of servers the test runs itself (then no fake engines are started
    here). `supervised`: the engines are processes the adapter starts on demand (`supervisor.py`).
    `report_awake`: the gateway reports the engines it finds awake at start (no adapter needed).
    `local` (with `supervised`): the node's adapter is the local data plane, moving real bytes (a
    hundredth of their size), with the engine processes following the weights. `spec`: {model:
    more fields of its engine's entry in the gateway config} (`aliases`, `upstream_model`)."""
    auth = Auth([TokenEntry(token=TOK["runtime"], role="runtime", tenant="team"),
                 TokenEntry(token=TOK["n0"], role="adapter", node="n0"),
                 TokenEntry(token=TOK["admin"], role="admin")])
    one_gpu = cluster(gpus=1, hbm_gb=0.3, h2d=4.0, nvme_read=2.0, root=8.0, wake=wake_s, cold=1.0, host_gb=2.0) if wake_s > 0 else \
        cluster(gpus=1, hbm_gb=0.3, h2d=4.0, nvme_read=2.0, root=8.0, wake=0.05, cold=1.0, host_gb=2.0)
    # the planner as `serve` runs it by default: tracking the forecast MILP every 60 s
    live = LivePlanner(one_gpu, load_catalog("toy"), Store(tmp / "sb.db"), track=TrackConfig(replan_s=60.0))
    with ExitStack() as stack:
        planner_url = stack.enter_context(serve(create_app(live, auth, tick_s=0.5), lifespan="on"))
        sup = None
        if supervised:
            engines = {m: f"http://127.0.0.1:{free_port()}" for m in MODELS}
            sup = Supervisor({f"{m}@gpu:0": (f"{sys.executable} -m statebudget.gateway.fake_engine --model {m} "
                                             f"--port ${{PORT}} --tokens-per-s {tokens_per_s}", u, {})
                              for m, u in engines.items()}, tmp / "engine-logs")
            stack.callback(sup.close)
        elif engines is None:
            engines = {m: stack.enter_context(serve(engine_app(m, tokens_per_s=tokens_per_s, wake_s=wake_s,
                                                               asleep=True))) for m in MODELS}
        if adapter and local:
            ad = LocalAdapter(planner_url, "n0", TOK["n0"], root=tmp / "data", arena_bytes=3_000_000, bytes_scale=0.01,
                              supervisor=sup, endpoints={(m, "gpu:0"): u for m, u in engines.items()})
        elif adapter:
            ad = VllmAdapter(planner_url, "n0", TOK["n0"], {(m, "gpu:0"): u for m, u in engines.items()},
                             poll_interval_s=0.02, supervisor=sup)
        if adapter:
            stop = threading.Event()
            t = threading.Thread(target=ad.run, kwargs={"stop": stop.is_set, "wait_s": 0.5}, daemon=True)
            t.start()
            stack.callback(t.join, 5)
            stack.callback(stop.set)
        cfg = GatewayConfig(engines=[{"model": m, "url": u, "node": "n0", "gpus": [0], "max_inflight": max_inflight,
                                      **(spec or {}).get(m, {})} for m, u in engines.items()],
                            **config)
        app = gateway_app(cfg, planner_url, TOK["runtime"], {"n0": TOK["n0"]} if report_awake else None)
        url = stack.enter_context(serve(app, lifespan="on"))
        yield {"url": url, "planner": planner_url, "engines": engines, "live": live, "gateway": app.state.gateway,
               "loop": app.state.loop, "supervisor": sup, "adapter": ad if adapter else None}



def ready_refusal(planner, program: str, call: str, timeout_s: float):
    """The `Refused` a gateway for `coder` raises while it waits for a call's state to be ready, its
    planner `planner` (an httpx mock handler): how a lease's answer reaches the agent."""
    import asyncio
    import time

    import httpx
    import pytest

    from statebudget.gateway.app import Gateway, Program
    from statebudget.gateway.config import GatewayConfig
    from statebudget.gateway.wire import Refused

    async def ask():
        gw = Gateway(GatewayConfig(engines=[{"model": "coder", "url": "http://127.0.0.1:9"}]),
                     httpx.AsyncClient(transport=httpx.MockTransport(planner), base_url="http://planner"))
        with pytest.raises(Refused) as e:
            await gw._ready(Program(program, single=False), call, "coder", time.monotonic() + timeout_s)
        return e.value

    return asyncio.run(ask())
