"""SGLang adapter: weights and the KV pool released and resumed with SGLang's memory saver.

Source followed: SGLang main, `python/sglang/srt/entrypoints/http_server.py` (routes) and
`python/sglang/srt/managers/io_struct.py` (request dataclasses `ReleaseMemoryOccupationReqInput`,
`ResumeMemoryOccupationReqInput`: `tags: Optional[List[str]]`, None meaning every region;
`UpdateWeightFromDiskReqInput`: `model_path: str`, `load_format`, `abort_all_requests`,
`weight_version`, `flush_cache`, ...). The server must run with `--enable-memory-saver`:

    POST /release_memory_occupation {"tags": ["weights"] | ["kv_cache"]}   200, body null
    POST /resume_memory_occupation  {"tags": [...]}                         200, body null
         errors: 400 {"error": {"message": ...}}
    POST /update_weights_from_disk  {"model_path": ...}   200/400 {"success", "message", "num_paused_requests"}
    GET  /health                    200 when the server is up

One SGLang server serves one model on one GPU group, so endpoints are keyed by (model, GPU group).

    weights  demote gpu -> host:*         release ["weights"]
             drop, or demote -> nvme/none release ["weights"], remembered as needing a re-read
             promote host -> gpu          resume ["weights"]
             promote nvme/none -> gpu, or after a drop by this adapter:
                                          resume ["weights"], update_weights_from_disk {model_path}
    KV       to the LMCache adapter when one is given (per program); otherwise the engine's whole
             KV pool: demote/drop release ["kv_cache"], promote resume ["kv_cache"]
    experts  fail: SGLang has no HTTP route to page one MoE expert.

Then `GET /health` 200 before a promote is reported done (SGLang's /health generates one token).

SGLang's scheduler does not refuse what it cannot do, it fails: releasing a region already
released, or resuming one not released, raises in the scheduler subprocess, and a release while
requests are in flight fails its assertion that none are. The adapter follows the op (a demote
releases, a promote from off the GPU resumes), which the planner's books keep consistent with
the server as long as nothing else releases or resumes it; the planner releases a model's
regions only when none of its calls runs, and the runtime must not send requests to a server
whose model the planner moved elsewhere. `health()` does not probe a server with a region this
adapter released (a generation there fails or hangs): it reports it `probed: false`.

A released region keeps its contents only when the server runs with `--enable-weights-cpu-backup`
(weights); without it a demote to host loses the weights just as a drop does; set `cpu_backup=False` and every promote re-reads
them from disk. Released KV is always lost (the engine recomputes it; only the planner's cost
model is off). Release and resume are moves; `abort` restores the state from before the op.
"""

from __future__ import annotations

import logging
import time

import httpx

from ..models.plan import Op
from .base import OpResult, tier_kind
from .http import EngineError, EngineServersAdapter, check, op_result
from .lmcache import LMCacheAdapter

log = logging.getLogger("statebudget.adapter.sglang")


class SglangAdapter(EngineServersAdapter):
    """Weights and KV pool through SGLang's release/resume memory occupation."""
    kind = "sglang"
    engine_name = "SGLang"
    gpu_only = "only releases or resumes GPU memory"

    def __init__(self, planner: str, node: str, token: str, endpoints: dict[tuple[str, str], str],
                 model_paths: dict[str, str], lmcache: LMCacheAdapter | None = None, cpu_backup: bool = True,
                 client: httpx.Client | None = None, engine_client: httpx.Client | None = None,
                 timeout_s: float = 300.0, supervisor=None):
        """`endpoints`: (model, GPU tier such as "gpu:0,1") -> base URL of that SGLang server;
        `model_paths`: model -> checkpoint path to re-read its weights from after a drop;
        `cpu_backup`: the servers run with `--enable-weights-cpu-backup`."""
        super().__init__(planner, node, token, endpoints, lmcache, client, engine_client, timeout_s, supervisor)
        self.model_paths, self.cpu_backup = dict(model_paths), cpu_backup
        self.weights_lost: set[str] = set()  # base URLs whose released weights must be re-read from disk
        self.released: dict[str, set[str]] = {}  # base URL -> the regions this adapter released there (for health)

    # ---- HTTP --------------------------------------------------------------------------------------
    def release(self, url: str, tag: str) -> None:
        check(self.engine.post(f"{url}/release_memory_occupation", json={"tags": [tag]}))
        self.released.setdefault(url, set()).add(tag)
        if tag == "weights":
            self.slept(url, True)

    def forget_engine(self, url: str) -> None:
        self.released.pop(url, None)
        self.weights_lost.discard(url)

    def resume(self, url: str, tag: str) -> None:
        check(self.engine.post(f"{url}/resume_memory_occupation", json={"tags": [tag]}))
        self.released.get(url, set()).discard(tag)
        if tag == "weights":
            self.slept(url, False)

    def unprobed(self, url: str) -> list[str]:
        return sorted(self.released.get(url, ()))

    def reload_weights(self, url: str, model: str) -> None:
        """Re-read the weights from the checkpoint into the resumed (empty) weight memory."""
        if model not in self.model_paths:
            raise EngineError(f"no model path configured for {model!r}; cannot re-read its weights")
        r = check(self.engine.post(f"{url}/update_weights_from_disk", json={"model_path": self.model_paths[model]}))
        body = r.json()
        if not body.get("success", False):
            raise EngineError(f"update_weights_from_disk at {url}: {body.get('message', body)}")

    def ready(self, url: str) -> None:
        check(self.engine.get(f"{url}/health"))

    # ---- ops ---------------------------------------------------------------------------------------
    def execute(self, op: Op) -> OpResult:
        t0 = time.perf_counter()
        kind = op.object[0]
        if kind == "kv" and self.lmcache is not None:
            return self.lmcache.execute(op)
        if kind == "e":
            return op_result(op, t0, f"SGLang cannot page single MoE experts ({op.object}); "
                                     f"move the model's weights instead")
        if kind not in ("w", "kv"):
            return op_result(op, t0, f"unknown state object {op.object}")
        try:
            url = self.endpoint(op)
            tag = "weights" if kind == "w" else "kv_cache"
            if kind == "w" and op.kind == "promote" and self.started_fresh(url, op):
                pass  # a fresh server loaded its weights
            elif kind == "w" and op.kind != "promote" and not (op.kind == "demote" and tier_kind(op.dst) == "host") \
                    and self.stopped(url):
                self.forget_engine(url)
            elif op.kind == "promote":
                self.resume(url, tag)
                if kind == "w":
                    if tier_kind(op.src) in ("nvme", "none") or url in self.weights_lost or not self.cpu_backup:
                        self.reload_weights(url, op.object[1])
                    self.weights_lost.discard(url)
                if not self.unprobed(url):  # a region still released (the KV pool): /health would fail or hang
                    self.ready(url)
            else:
                self.release(url, tag)
                keeps = kind == "w" and op.kind == "demote" and tier_kind(op.dst) == "host" and self.cpu_backup
                if kind == "w" and not keeps:
                    self.weights_lost.add(url)
            return op_result(op, t0)
        except (EngineError, httpx.HTTPError) as e:
            return op_result(op, t0, str(e) or type(e).__name__)

    def abort(self, op: Op) -> None:
        """The planner refused a done op: put the server back as it was before the op."""
        if op.object[0] == "kv" and self.lmcache is not None:
            return self.lmcache.abort(op)
        if op.object[0] not in ("w", "kv"):
            return
        tag = "weights" if op.object[0] == "w" else "kv_cache"
        try:
            url = self.endpoint(op)
            if op.kind == "promote":
                self.release(url, tag)
                if tag == "weights" and not (tier_kind(op.src) == "host" and self.cpu_backup):
                    self.weights_lost.add(url)
            else:
                self.resume(url, tag)
                if tag == "weights" and (url in self.weights_lost or not self.cpu_backup):
                    self.reload_weights(url, op.object[1])
                    self.weights_lost.discard(url)
        except (EngineError, httpx.HTTPError) as e:
            log.error("could not undo op %s on SGLang: %s", op.op_id, e)
