"""`LocalAdapter`: the planner protocol over a `LocalDataPlane`, with optional engine processes."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from ...models.plan import Op
from ..base import Adapter, OpResult, model_of, tier_kind
from .plane import LocalDataPlane

log = logging.getLogger("statebudget.adapter.local")


class LocalAdapter(Adapter):
    """The planner protocol over a `LocalDataPlane` (the data plane is the engine).

        LocalAdapter("http://planner:8000", "n0", token, root="/var/tmp/sb", arena_bytes=8 << 30).run()

    `plane` passes a ready data plane; otherwise one is made at `root` for this node with
    `plane_kw` (see `LocalDataPlane`). `supervisor` and `endpoints` ((model, GPU tier) -> URL, as
    the vLLM adapter's) add an engine process per model whose life follows its weights on the
    GPUs (`statebudget fake-engine` servers, so that a gateway can serve from this node on a
    laptop): a promote into HBM starts or wakes it before the op is reported done, a demote to
    DRAM sleeps it, a drop or a demote to disk stops it."""
    kind = "local"

    def __init__(self, planner: str, node: str, token: str, client=None, *, plane: LocalDataPlane | None = None,
                 root: str | Path = "statebudget-local", supervisor=None, endpoints: dict | None = None, **plane_kw):
        super().__init__(planner, node, token, client)
        self.plane = plane or LocalDataPlane(root, node=node, **plane_kw)
        self.supervisor, self.endpoints = supervisor, dict(endpoints or {})
        self.engine = httpx.Client(timeout=30.0)

    def execute(self, op: Op) -> OpResult:
        url = self._engine_of(op)
        if url is not None and op.kind != "promote":
            try:  # the engine lets go of the weights before the bytes move
                self._follow(op, url)
            except (httpx.HTTPError, TimeoutError, RuntimeError) as e:
                return OpResult(status="failed", error=f"engine at {url}: {e}", version=op.version, epoch=op.epoch)
        out = self.plane.execute(op)
        if url is not None and op.kind != "promote" and out.status != "done":
            self._undo(op, url)  # the weights stay in HBM: so does their engine
        if url is not None and op.kind == "promote" and out.status == "done":
            try:  # ready means served: the engine is awake before the op is reported done
                self._follow(op, url)
            except (httpx.HTTPError, TimeoutError, RuntimeError) as e:
                self.plane.abort(op)
                return OpResult(status="failed", error=f"engine at {url}: {e}", version=op.version, epoch=op.epoch)
        return out

    def _engine_of(self, op: Op) -> str | None:
        if self.supervisor is None or op.object[0] != "w":
            return None
        gpu = op.dst if op.kind == "promote" else op.src
        return self.endpoints.get((model_of(op.object), gpu)) if tier_kind(gpu) == "gpu" else None

    def _follow(self, op: Op, url: str) -> None:
        if op.kind == "promote":
            if self.supervisor.running(url):
                self.engine.post(f"{url}/wake_up").raise_for_status()
                self.supervisor.slept(url, False)
            else:
                self.supervisor.start(url, 60.0)
        elif op.kind == "demote" and tier_kind(op.dst) == "host":
            if self.supervisor.running(url):
                self.engine.post(f"{url}/sleep", params={"level": 1}).raise_for_status()
                self.supervisor.slept(url, True)
        else:
            self.supervisor.stop(url)

    def commit(self, op: Op) -> None:
        self.plane.commit(op)

    def abort(self, op: Op) -> None:
        self.plane.abort(op)
        url = self._engine_of(op)
        if url is not None:
            self._undo(op, url)

    def _undo(self, op: Op, url: str) -> None:
        """The engine as it was before `op` (the planner refused it, or its bytes did not move)."""
        try:
            if op.kind == "promote":
                if self.supervisor.running(url):
                    self.engine.post(f"{url}/sleep", params={"level": 1}).raise_for_status()
                    self.supervisor.slept(url, True)
            elif self.supervisor.running(url):
                self.engine.post(f"{url}/wake_up").raise_for_status()
                self.supervisor.slept(url, False)
            else:
                self.supervisor.start(url, 60.0)
        except (httpx.HTTPError, TimeoutError, RuntimeError) as e:
            log.error("could not put the engine at %s back as it was before op %s: %s", url, op.op_id, e)

    def held(self) -> list[dict]:
        return self.plane.held()

    def forget(self, obj: list[str], tier: str) -> None:
        self.plane.forget(obj, tier)

    def engine_generation(self) -> int:
        if self.supervisor is not None:
            self.supervisor.check()
        return self.plane.generation

    def health(self) -> dict:
        out = {"kind": self.kind, **self.plane.health()}
        if self.supervisor is not None:
            out["engines"] = self.supervisor.status()
        return out

    def inventory(self) -> dict:
        """What this adapter did and holds: the ops it executed (in order), every ready copy with
        its checksum, and the bytes/s per path."""
        return {"node": self.node, "executed": list(self.executed),
                "copies": [{"object": list(k), "tier": t, "checksum": c.checksum, "bytes": c.nbytes}
                           for (k, t), c in sorted(list(self.plane.copies.items()))],
                "stats": self.plane.stats()}
