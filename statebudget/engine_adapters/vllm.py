"""vLLM adapter: model weights moved with vLLM's sleep mode; KV handed to LMCache.

Source followed: vLLM main (the `vllm/entrypoints/serve/` layout, v0.12 and later):
`vllm/entrypoints/serve/sleep/api_router.py`, `vllm/entrypoints/serve/rpc/api_router.py`,
`vllm/entrypoints/serve/instrumentator/health.py` and `docs/features/sleep_mode.md` (older
releases serve the same routes from `vllm/entrypoints/openai/api_server.py`). The routes exist
only with `VLLM_SERVER_DEV_MODE=1` and `--enable-sleep-mode`:

    POST /sleep?level=1|2          200, empty body  (level 1: weights to CPU RAM, KV discarded;
                                                     level 2: weights and KV discarded)
    POST /wake_up[?tags=weights|kv_cache]  200, empty body; no tags wakes everything
    POST /collective_rpc {"method": "reload_weights"}   200 (empty, or {"results": [...]} per worker)
    GET  /is_sleeping              {"is_sleeping": bool}  (true until every slept tag is woken)
    GET  /health                   200, empty body; 503 once the engine is dead

Errors are vLLM's `{"error": {"message", "type", "code"}}` (older: FastAPI's `{"detail"}`).

One vLLM server serves one model on one GPU group, so endpoints are keyed by (model, GPU group).
Weights (`["w", model]`):

    demote gpu -> host:*          POST /sleep?level=1
    drop, or demote -> nvme/none  POST /sleep?level=2
    promote host -> gpu           POST /wake_up
    promote nvme -> gpu, or any promote after this adapter slept the engine at level 2:
                                  POST /wake_up?tags=weights, POST /collective_rpc reload_weights,
                                  POST /wake_up?tags=kv_cache  (the order sleep_mode.md gives)

(the reload needs a vLLM whose workers have `reload_weights`; older v1 workers lack it and
`/collective_rpc` answers 500, which fails the op),
then `GET /is_sleeping` until false and `GET /health` 200 before the promote is reported done;
a demote or drop is reported done once `GET /is_sleeping` is true (the verify step).
Any sleep discards the engine's whole KV cache, not one program's (vLLM has no finer control).
KV objects go to the LMCache adapter when one is given; expert pages fail: vLLM loads a MoE
model's experts with its weights and cannot page them.

A server under supervision (`supervisor.py`) is started by a promote when it is not running,
and stopped, not slept, by a drop or a demote to disk.

Sleep and wake are moves, not copies (vLLM frees the source itself), so `commit` has nothing
to release; `abort` (the planner refused the op) restores the state from before the op.
"""

from __future__ import annotations

import logging
import time

import httpx

from ..models.plan import Op
from .base import OpResult, tier_kind
from .http import EngineError, EngineServersAdapter, check, op_result, poll_until, wait_budget_s
from .lmcache import LMCacheAdapter

log = logging.getLogger("statebudget.adapter.vllm")


class VllmAdapter(EngineServersAdapter):
    """Weights through vLLM sleep mode, one server per (model, GPU group)."""
    kind = "vllm"
    engine_name = "vLLM"
    gpu_only = "only moves weights on or off a GPU"

    def __init__(self, planner: str, node: str, token: str, endpoints: dict[tuple[str, str], str],
                 lmcache: LMCacheAdapter | None = None, client: httpx.Client | None = None,
                 engine_client: httpx.Client | None = None, timeout_s: float = 300.0,
                 poll_interval_s: float = 0.1, supervisor=None):
        """`endpoints`: (model, GPU tier such as "gpu:0,1") -> base URL of that vLLM server;
        `supervisor`: the servers this adapter starts and stops (`supervisor.py`)."""
        super().__init__(planner, node, token, endpoints, lmcache, client, engine_client, timeout_s, supervisor)
        self.poll_interval_s = poll_interval_s
        self.sleep_level: dict[str, int] = {}  # base URL -> level of the last sleep this adapter asked for

    # ---- HTTP --------------------------------------------------------------------------------------
    def sleep(self, url: str, level: int, op: Op) -> None:
        """Put the server to sleep, then verify it: `GET /is_sleeping` until true, within the op's
        budget (vLLM V1 answers /sleep once the engine slept; older front ends could answer first)."""
        r = self.engine.post(f"{url}/sleep", params={"level": level})
        if r.status_code == 404 and self.stopped(url):  # a supervised server with no sleep mode (llama.cpp)
            return
        check(r)
        self.sleep_level[url] = level  # asked for: a later wake reloads after level 2 even if this fails
        self.slept(url, True)
        poll_until(lambda: self.is_sleeping(url), wait_budget_s(op, self.timeout_s), self.poll_interval_s,
                   f"vLLM at {url} to report sleeping after /sleep?level={level} (not verified)")

    def wake(self, url: str, reload: bool, op: Op) -> None:
        """Wake the server (re-reading the weights from disk after a level-2 sleep) and wait until
        it is awake and healthy."""
        if reload:
            check(self.engine.post(f"{url}/wake_up", params={"tags": "weights"}))
            check(self.engine.post(f"{url}/collective_rpc", json={"method": "reload_weights"}))
            check(self.engine.post(f"{url}/wake_up", params={"tags": "kv_cache"}))
        else:
            check(self.engine.post(f"{url}/wake_up"))
        self.sleep_level.pop(url, None)
        self.slept(url, False)
        poll_until(lambda: not self.is_sleeping(url), wait_budget_s(op, self.timeout_s), self.poll_interval_s,
                   f"vLLM at {url} to wake up")
        check(self.engine.get(f"{url}/health"))

    def forget_engine(self, url: str) -> None:
        self.sleep_level.pop(url, None)

    def is_sleeping(self, url: str) -> bool:
        return bool(check(self.engine.get(f"{url}/is_sleeping")).json()["is_sleeping"])

    def held(self) -> list[dict]:
        """The weights of every server that is up and awake (an asleep one's host copy is not
        vouched for: its sleep level is not known after a restart of this adapter)."""
        out = []
        for (model, group), url in sorted(self.endpoints.items()):
            try:
                awake = not self.is_sleeping(url)
            except (EngineError, httpx.HTTPError, KeyError, ValueError):
                continue  # down, or not a sleep-mode server: nothing to vouch for
            if awake:
                out.append({"object": ["w", model], "tier": "gpu:" + ",".join(map(str, group)), "version": None})
        return out

    # ---- ops ---------------------------------------------------------------------------------------
    def execute(self, op: Op) -> OpResult:
        t0 = time.perf_counter()
        kind = op.object[0]
        if kind == "kv":
            if self.lmcache is None:
                return op_result(op, t0, "vLLM has no per-program KV control; KV ops need an LMCache adapter")
            return self.lmcache.execute(op)
        if kind == "e":
            return op_result(op, t0, f"vLLM cannot page MoE experts ({op.object}): they load and sleep with the "
                                     f"model's weights; move the weights instead")
        if kind != "w":
            return op_result(op, t0, f"unknown state object {op.object}")
        try:
            url = self.endpoint(op)
            if op.kind == "promote":
                if not self.started_fresh(url, op):
                    reload = tier_kind(op.src) in ("nvme", "none") or self.sleep_level.get(url) == 2
                    self.wake(url, reload, op)
            elif op.kind == "demote" and tier_kind(op.dst) == "host":
                self.sleep(url, 1, op)
            elif not self.stopped(url):  # drop, or demote to nvme: the checkpoint on disk is the copy
                self.sleep(url, 2, op)
            return op_result(op, t0)
        except (EngineError, httpx.HTTPError) as e:
            return op_result(op, t0, str(e) or type(e).__name__)

    def abort(self, op: Op) -> None:
        """The planner refused a done op: put the server back as it was before the op."""
        if op.object[0] == "kv" and self.lmcache is not None:
            return self.lmcache.abort(op)
        if op.object[0] != "w":
            return
        try:
            url = self.endpoint(op)
            if op.kind == "promote":
                self.sleep(url, 1 if tier_kind(op.src) == "host" else 2, op.model_copy(update={"deadline": None}))
            else:
                self.wake(url, self.sleep_level.get(url) == 2, op.model_copy(update={"deadline": None}))
        except (EngineError, httpx.HTTPError) as e:
            log.error("could not undo op %s on vLLM: %s", op.op_id, e)
