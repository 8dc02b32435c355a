"""`LocalAdapter`: the planner protocol over a `LocalDataPlane`."""

from __future__ import annotations

from pathlib import Path

from ...models.plan import Op
from ..base import Adapter, OpResult
from .plane import LocalDataPlane


class LocalAdapter(Adapter):
    """The planner protocol over a `LocalDataPlane` (no engine: the data plane is the engine).

        LocalAdapter("http://planner:8000", "n0", token, root="/var/tmp/sb", arena_bytes=8 << 30).run()

    `plane` passes a ready data plane; otherwise one is made at `root` for this node with
    `plane_kw` (see `LocalDataPlane`)."""
    kind = "local"

    def __init__(self, planner: str, node: str, token: str, client=None, *, plane: LocalDataPlane | None = None,
                 root: str | Path = "statebudget-local", **plane_kw):
        super().__init__(planner, node, token, client)
        self.plane = plane or LocalDataPlane(root, node=node, **plane_kw)

    def execute(self, op: Op) -> OpResult:
        return self.plane.execute(op)

    def commit(self, op: Op) -> None:
        self.plane.commit(op)

    def abort(self, op: Op) -> None:
        self.plane.abort(op)

    def held(self) -> list[dict]:
        return self.plane.held()

    def forget(self, obj: list[str], tier: str) -> None:
        self.plane.forget(obj, tier)

    def engine_generation(self) -> int:
        return self.plane.generation

    def health(self) -> dict:
        return {"kind": self.kind, **self.plane.health()}

    def inventory(self) -> dict:
        """What this adapter did and holds: the ops it executed (in order), every ready copy with
        its checksum, and the bytes/s per path."""
        return {"node": self.node, "executed": list(self.executed),
                "copies": [{"object": list(k), "tier": t, "checksum": c.checksum, "bytes": c.nbytes}
                           for (k, t), c in sorted(list(self.plane.copies.items()))],
                "stats": self.plane.stats()}
