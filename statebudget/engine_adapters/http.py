"""Small HTTP helpers the engine adapters share: an engine's error text, the wait budget an op's
deadline leaves, polling until an engine is ready, and the report of an op."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..models.plan import Op
from .base import Adapter, OpResult, gpu_indexes, model_of, tier_kind


class EngineError(Exception):
    """An engine answered an error (or not at all); the message is the engine's own text."""


def engine_error_text(r: httpx.Response) -> str:
    """The error message in an engine's answer, whatever its shape: vLLM `{"error": {"message"}}`,
    SGLang `{"error": {"message"}}` or `{"success": false, "message"}`, FastAPI `{"detail"}`."""
    try:
        body = r.json()
    except ValueError:
        body = None
    text = ""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            text = str(err.get("message") or err)
        elif err:
            text = str(err)
        text = text or str(body.get("detail") or body.get("message") or "")
    return f"HTTP {r.status_code} {r.request.method} {r.request.url.path}: {text or r.text or r.reason_phrase}"


def check(r: httpx.Response) -> httpx.Response:
    """Raise `EngineError` with the engine's text unless the answer is a 2xx."""
    if not r.is_success:
        raise EngineError(engine_error_text(r))
    return r


def wait_budget_s(op: Op, timeout_s: float) -> float:
    """How long an op may wait for its engine: `timeout_s`, cut at `op.deadline` (Unix time)."""
    if op.deadline is None:
        return timeout_s
    return max(0.0, min(timeout_s, op.deadline - time.time()))


def engine_http_client(timeout_s: float, api_key: str | None = None) -> httpx.Client:
    """The HTTP client an adapter talks to its engine servers with: 10 s to connect, `timeout_s`
    to read (a wake or a reload answers when done), `api_key` as a bearer token if given."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    return httpx.Client(timeout=httpx.Timeout(10.0, read=timeout_s), headers=headers)


class PollTimeout(EngineError):
    """`poll_until` gave up: the engine never reached the state it waited for."""


def poll_until(probe: Callable[[], bool], budget_s: float, interval_s: float, what: str) -> None:
    """Call `probe` until it is true; raise `PollTimeout` once `budget_s` has passed. Probes at
    least once, so an engine already ready costs no wait."""
    give_up = time.monotonic() + budget_s
    while not probe():
        if time.monotonic() >= give_up:
            raise PollTimeout(f"timed out after {budget_s:.1f}s waiting for {what}")
        time.sleep(interval_s)


def gpu_group(tier: str) -> tuple[int, ...]:
    """The GPUs of a GPU tier as a sorted tuple: `gpu:1,0` and `gpu:0,1` name the same group."""
    return tuple(sorted(gpu_indexes(tier)))


def op_result(op: Op, t0: float, error: str = "") -> OpResult:
    """The report for `op`: done (its bytes) or failed (no bytes), timed from `t0` (perf_counter)."""
    return OpResult(status="failed" if error else "done", bytes=0.0 if error else op.bytes,
                    seconds=time.perf_counter() - t0, version=op.version, epoch=op.epoch, error=error)


class EngineServersAdapter(Adapter):
    """An adapter for engines run as one HTTP server per (model, GPU group) (vLLM, SGLang), with
    KV ops handed to an LMCache adapter when there is one."""
    engine_name = "engine"
    gpu_only = "only moves state on or off a GPU"

    def __init__(self, planner: str, node: str, token: str, endpoints: dict[tuple[str, str], str], lmcache=None,
                 client: httpx.Client | None = None, engine_client: httpx.Client | None = None,
                 timeout_s: float = 300.0, supervisor=None):
        """`endpoints`: (model, GPU tier such as "gpu:0,1") -> base URL of that server;
        `supervisor` (`supervisor.Supervisor`): the servers this adapter starts and stops itself."""
        super().__init__(planner, node, token, client)
        self.supervisor = supervisor
        self.endpoints = {(m, gpu_group(t)): url.rstrip("/") for (m, t), url in endpoints.items()}
        self.lmcache = lmcache
        self.engine = engine_client or engine_http_client(timeout_s)
        self.timeout_s = timeout_s
        self._down: set[str] = set()  # servers whose last /health failed
        self._restarts = 0            # servers seen down, then up again: each lost its memory

    def engine_generation(self) -> int:
        """Moves each time a server that failed /health answers it again: an engine that came
        back has restarted and holds only what it loads at start (its inventory says what).
        Supervised servers are the supervisor's: one that crashed is started again (or, asleep,
        given up), which moves it; one it has not started is not down."""
        if self.supervisor is not None:
            for url in self.supervisor.check():
                self.forget_engine(url)
                self._restarts += 1
        for url in sorted(set(self.endpoints.values())):
            if self.unprobed(url) or (self.supervisor is not None and self.supervisor.supervises(url)):
                continue
            try:
                up = self.engine.get(f"{url}/health").is_success
            except httpx.HTTPError:
                up = False
            if not up:
                self._down.add(url)
            elif url in self._down:
                self._down.discard(url)
                self._restarts += 1
        return self._restarts

    def endpoint(self, op: Op) -> str:
        """The server of the op's model on the op's GPU end."""
        gpu = op.src if tier_kind(op.src) == "gpu" else op.dst
        if tier_kind(gpu) != "gpu":
            raise EngineError(f"op {op.op_id} has no GPU end ({op.src} -> {op.dst}); {self.engine_name} {self.gpu_only}")
        key = (model_of(op.object), gpu_group(gpu))
        if key not in self.endpoints:
            raise EngineError(f"no {self.engine_name} server configured for model {key[0]!r} on {gpu}")
        return self.endpoints[key]

    def forget_engine(self, url: str) -> None:
        """What this adapter knew of the server at `url` (it restarted, or is gone)."""

    def slept(self, url: str, asleep: bool) -> None:
        if self.supervisor is not None and self.supervisor.supervises(url):
            self.supervisor.slept(url, asleep)

    def started_fresh(self, url: str, op: Op) -> bool:
        """A promote onto a supervised server that is not running starts it (a fresh server loads
        its weights: a cold start) and waits for its health; True if it did."""
        if self.supervisor is None or not self.supervisor.supervises(url) or self.supervisor.running(url):
            return False
        try:
            self.supervisor.start(url, wait_budget_s(op, self.timeout_s))
        except (TimeoutError, RuntimeError) as e:
            raise EngineError(str(e)) from None
        self.forget_engine(url)
        return True

    def stopped(self, url: str) -> bool:
        """A drop (or a demote to disk) of a supervised server's weights stops its process: all
        its GPU memory comes free. True if it did."""
        if self.supervisor is None or not self.supervisor.supervises(url):
            return False
        self.supervisor.stop(url)
        self.forget_engine(url)
        return True

    def commit(self, op: Op) -> None:
        if op.object[0] == "kv" and self.lmcache is not None:
            self.lmcache.commit(op)

    def unprobed(self, url: str) -> list[str]:
        """Regions released at `url` that make a /health probe unsafe there (none by default)."""
        return []

    def health(self) -> dict:
        servers = {}
        for (model, gpus), url in sorted(self.endpoints.items()):
            if released := self.unprobed(url):  # not probed, so neither ok nor failed
                servers[url] = {"model": model, "gpus": list(gpus), "ok": None, "probed": False, "released": released}
                continue
            try:
                r = self.engine.get(f"{url}/health")
                servers[url] = {"model": model, "gpus": list(gpus), "ok": r.is_success, "status": r.status_code}
            except httpx.HTTPError as e:
                servers[url] = {"model": model, "gpus": list(gpus), "ok": False, "error": f"{type(e).__name__}: {e}"}
        out = {"kind": self.kind, "ok": all(s["ok"] for s in servers.values() if s["ok"] is not None), "servers": servers}
        if self.lmcache is not None:
            out["lmcache"] = self.lmcache.health()
            out["ok"] = out["ok"] and out["lmcache"]["ok"]
        return out


class EngineFile(BaseModel):
    """Where an adapter's engine servers are (`statebudget adapter vllm|sglang --engines FILE`):

        {"endpoints": {"coder@gpu:0": "http://127.0.0.1:8001", "reasoner@gpu:2,3": "http://127.0.0.1:8002"},
         "model_paths": {"coder": "/models/qwen2.5-coder-32b"},   # SGLang: re-read after a drop
         "cpu_backup": true,                                       # SGLang: --enable-weights-cpu-backup
         "api_key": "...",                                         # the servers' --api-key, if they have one
         "commands": {"coder@gpu:0": "vllm serve /models/coder --port ${PORT} --enable-sleep-mode"},
         "env": {"coder@gpu:0": {"CUDA_VISIBLE_DEVICES": "0"}},
         "log_dir": "logs"}

    A server with a command is supervised (`supervisor.py`): started when the planner first puts
    its weights on its GPUs, stopped when it drops them, started again after a crash. Its endpoint
    must be a local URL with a port, which `${PORT}` becomes.
    """
    model_config = ConfigDict(extra="forbid")
    endpoints: dict[str, str] = Field(min_length=1)
    commands: dict[str, str] = Field(default_factory=dict)
    env: dict[str, dict[str, str]] = Field(default_factory=dict)
    log_dir: str | None = None
    model_paths: dict[str, str] = Field(default_factory=dict)
    cpu_backup: bool = True
    api_key: str | None = Field(None, min_length=1)

    def engine_client(self, timeout_s: float = 300.0) -> httpx.Client | None:
        """The client for the engine servers: with `api_key` as a bearer token, else the adapter's own."""
        return engine_http_client(timeout_s, self.api_key) if self.api_key is not None else None

    @field_validator("endpoints")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        for k, url in v.items():
            model, _, tier = k.partition("@")
            if not model or not tier.startswith("gpu:"):
                raise ValueError(f"endpoint key {k!r} must be MODEL@gpu:<i>[,<j>...]")
            gpu_indexes(tier)
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {k!r}: {url!r} is not an http(s) URL")
        return v

    @model_validator(mode="after")
    def _commands(self):
        for k in [*self.commands, *self.env]:
            if k not in self.endpoints:
                raise ValueError(f"{k!r} has a command or env but no endpoint: give it one (its URL gives the port)")
        for k in self.commands:
            u = urlsplit(self.endpoints[k])
            if u.hostname not in ("127.0.0.1", "localhost", "::1") or u.port is None:
                raise ValueError(f"endpoint {k!r}: a supervised server listens on this host; {self.endpoints[k]!r} "
                                 "needs to be http://127.0.0.1:PORT")
        return self

    def endpoint_map(self) -> dict[tuple[str, str], str]:
        return {tuple(k.split("@", 1)): url for k, url in self.endpoints.items()}

    def supervisor(self):
        """The supervisor of the servers with a command; None if none has one."""
        if not self.commands:
            return None
        from .supervisor import Supervisor
        return Supervisor({k: (cmd, self.endpoints[k], self.env.get(k, {}))
                           for k, cmd in self.commands.items()}, self.log_dir)


def load_engine_file(path) -> EngineFile:
    """Read and check an engine file; errors name the file and the field."""
    import json
    from pathlib import Path

    from pydantic import ValidationError

    from ..models.errors import InputError, pydantic_where

    p = Path(path)
    if not p.is_file():
        raise InputError(str(p), "", "no such engine file")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(str(p), f"line {e.lineno}", f"not JSON: {e.msg}") from None
    try:
        return EngineFile(**data) if isinstance(data, dict) else EngineFile(endpoints=data)
    except ValidationError as e:
        raise InputError(str(p), *pydantic_where(e)) from None
