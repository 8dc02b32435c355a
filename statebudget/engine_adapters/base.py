"""The adapter protocol: `poll / execute(op) / report / health` (LMCache's habit of small verbs).

    planner ──GET /v1/plan?node=N&after=V&wait=S──▶ adapter ── execute(op) ──▶ engine / data plane
    planner ◀──POST /v1/ops/{op_id} {status, bytes, seconds, checksum, version, epoch}── adapter

`poll` and `report` speak the planner's HTTP API and are the same for every engine; a subclass
says how one op is carried out (`execute`) and whether its engine is alive (`health`).

Every op is a transaction on the engine side: allocate the target, copy, verify, report, and only
once the planner acknowledges (200) release the source. A 409 means the op went stale or its lease
was cancelled while it ran: the adapter undoes the target (`abort`), so half-moved or stale state
is never used. An op offered again (a planner restart, a lost answer) is never executed twice: the
adapter remembers the results it reported by op id and reports them again.

When it starts, and whenever its engine restarted (`engine_generation` moved: the engine lost
its memory), an adapter sends its inventory (`announce`: PUT /v1/inventory, the ready copies it
holds in HBM and host DRAM); the planner closes the node's open ops, forgets what the adapter no
longer holds and answers what the adapter should free.

Tiers in ops: `gpu:<i>` or `gpu:<i>,<j>` (a tensor-parallel group, GPU indexes of the cluster),
`host:<node>`, `nvme:<node>`, `none`. Objects: `["w", model]`, `["e", model, page]`,
`["kv", program, model]`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Literal

import httpx
from pydantic import BaseModel, Field

from ..models.plan import Op

log = logging.getLogger("statebudget.adapter")
REFUSED_GRACE_S = 10.0  # a planner refusing the token (401/403) this long stops the adapter; shorter, it is
                        # retried (a token file being rewritten, a planner restarting with new tokens)


class OpResult(BaseModel):
    """What an adapter reports for one op (the body of POST /v1/ops/{op_id})."""
    status: Literal["done", "failed", "cancelled"]
    bytes: float = Field(0.0, ge=0)
    seconds: float = Field(0.0, ge=0)
    checksum: str | None = None
    version: int = 0
    epoch: int = 0
    error: str = ""


def run_order(ops: list[Op]) -> list[Op]:
    """The order to run one poll's ops in: the plan's, except that background promotes (tool-wait
    KV swap-ins, which take only free HBM, and speculative promotes, whose evictions come before
    them in the plan) go after the rest, which they must not delay. A swap-in
    that a later op of the same object must follow stays in place, and no other op moves: a
    demote (background or not) may free the room a later promote was planned into."""
    later: set = set()
    deferred = []
    for op in reversed(ops):
        key = tuple(op.object)
        if op.background and op.kind == "promote" and key not in later:
            deferred.append(op)
        later.add(key)
    moved = {op.op_id for op in deferred}
    return [op for op in ops if op.op_id not in moved] + deferred[::-1]


def tier_kind(tier: str) -> str:
    """`gpu:0,1` -> `gpu`, `host:n0` -> `host`, `none` -> `none`."""
    return tier.partition(":")[0]


def gpu_indexes(tier: str) -> tuple[int, ...]:
    """`gpu:3` -> (3,), `gpu:0,1` -> (0, 1)."""
    kind, _, rest = tier.partition(":")
    if kind != "gpu" or not rest:
        raise ValueError(f"not a GPU tier: {tier!r}")
    return tuple(int(x) for x in rest.split(","))


def model_of(obj: list[str] | tuple) -> str:
    """The model a state object belongs to."""
    return obj[2] if obj[0] == "kv" else obj[1]


class Adapter(ABC):
    """Base class: the planner protocol. Subclasses implement `execute`, `health` and, when a
    target must be undone after a refused report, `abort`/`commit`."""
    kind = "base"

    def __init__(self, planner: str, node: str, token: str, client: httpx.Client | None = None):
        self.planner, self.node = planner.rstrip("/"), node
        self.client = client or httpx.Client(base_url=self.planner, headers={"Authorization": f"Bearer {token}"},
                                             timeout=httpx.Timeout(10.0, read=120.0))
        self.version = 0
        self.reported: dict[str, OpResult] = {}  # op id -> the result reported (never execute twice)
        self.executed: list[str] = []            # op ids in the order they were executed
        self._unsettled: dict[str, Op] = {}      # executed, no answer from the planner yet
        self._generation: int | None = None      # the engine generation of the last inventory sent

    # ---- to implement -------------------------------------------------------------------------
    @abstractmethod
    def execute(self, op: Op) -> OpResult:
        """Carry out one op on the engine or data plane (the target stays unpublished)."""

    @abstractmethod
    def health(self) -> dict:
        """Whether the engine is alive, and what it holds."""

    def held(self) -> list[dict]:
        """The ready copies this adapter vouches for in HBM and host DRAM: `[{object, tier, bytes,
        version}]` (version None when unknown). By default none: the planner then forgets what
        its books say this node holds, and plans it again."""
        return []

    def forget(self, obj: list[str], tier: str) -> None:
        """Free a copy the planner does not take (an inventory answer's `drop`)."""

    def engine_generation(self) -> int:
        """A number that changes when the engine restarted and lost its memory."""
        return 0

    def commit(self, op: Op) -> None:
        """The planner acknowledged `op`: release its source (a move, not a copy)."""

    def abort(self, op: Op) -> None:
        """The planner refused `op` (stale or cancelled): undo its target."""

    # ---- the planner protocol ----------------------------------------------------------------------
    def poll(self, wait_s: float = 10.0) -> list[Op]:
        r = self.client.get("/v1/plan", params={"node": self.node, "after": self.version, "wait": wait_s})
        r.raise_for_status()
        body = r.json()
        self.version = body["version"]
        return [Op(**o) for o in body["ops"]]

    def announce(self, reason: str = "adapter started") -> dict:
        """Send the inventory; free what the planner does not take. Ops executed and not yet
        answered are forgotten: the planner closed them (failed), and offers new ones."""
        generation = self.engine_generation()
        r = self.client.put("/v1/inventory", json={"node": self.node, "reason": reason, "copies": self.held()})
        if r.status_code in (404, 405) and r.json().get("detail") in ("Not Found", "Method Not Allowed"):
            log.warning("the planner at %s takes no inventory (an older version): not reconciled", self.planner)
            self._generation = generation
            return {}
        r.raise_for_status()
        body = r.json()
        for c in body.get("drop", ()):
            self.forget(c["object"], c["tier"])
        for op in self._unsettled.values():  # closed by the planner: their targets are undone here too
            self._settle(op, 409)
        self._unsettled.clear()
        self._generation, self.version = generation, 0
        log.info("inventory (%s): %d copies lost, %d adopted, %d dropped, %d ops closed", reason,
                 len(body.get("lost", ())), len(body.get("adopted", ())), len(body.get("drop", ())),
                 body.get("ops_closed", 0))
        return body

    def report(self, op: Op, result: OpResult) -> int:
        """POST the result; returns the HTTP status (200 accepted, 409 refused). An op the planner
        no longer knows (404: closed long ago and compacted) is taken as refused."""
        r = self.client.post(f"/v1/ops/{op.op_id}", json=result.model_dump())
        if r.status_code == 404:
            log.warning("op %s: the planner no longer knows it; undone", op.op_id)
            return 409
        if r.status_code not in (200, 409):
            r.raise_for_status()
        return r.status_code

    def step(self, wait_s: float = 10.0) -> int:
        """One poll and the ops it brought; returns how many were executed. A result is kept
        before it is reported, so an op whose report was lost (the planner went away) is reported
        again when offered again, never executed again; commit or abort follows the answer."""
        n = 0
        ops = self.poll(wait_s)
        offered = {op.op_id for op in ops}
        # Executed ops whose answer never came (the planner died after committing, before replying)
        # are no longer offered: report them again; the planner answers a duplicate with 200.
        for op_id, op in list(self._unsettled.items()):
            if op_id not in offered:
                status = self.report(op, self.reported[op_id])
                del self._unsettled[op_id]
                if self.reported[op_id].status == "done":
                    self._settle(op, status)
        for op in run_order(ops):
            result = self.reported.get(op.op_id)
            if result is None:
                t0 = time.perf_counter()
                try:
                    result = self.execute(op)
                except Exception as e:  # an engine error fails the op; the planner falls back
                    log.exception("op %s failed", op.op_id)
                    result = OpResult(status="failed", error=f"{type(e).__name__}: {e}", version=op.version,
                                      epoch=op.epoch)
                self.executed.append(op.op_id)
                self.reported[op.op_id] = result
                self._unsettled[op.op_id] = op
                n += 1
                log.info("op %s %s %s -> %s: %s in %.3fs%s", op.op_id, op.kind, op.src, op.dst, result.status,
                         time.perf_counter() - t0, f" ({result.error})" if result.error else "")
            status = self.report(op, result)
            if self._unsettled.pop(op.op_id, None) is not None and result.status == "done":
                self._settle(op, status)
            if op.kind == "demote" and (status == 409 or result.status != "done"):
                # A move out that did not land: the planner drops the copy instead, ahead of the
                # ops it had planned into the room the move was to free. Poll for that drop first.
                break
        return n

    def _settle(self, op: Op, status: int) -> None:
        """Commit a done op the planner took (200), abort one it refused (409). An engine's error
        while releasing or undoing is logged, not raised: the planner's books already say what
        happened, and the loop must go on polling."""
        try:
            self.commit(op) if status == 200 else self.abort(op)
        except Exception:
            log.exception("op %s: %s failed", op.op_id, "commit" if status == 200 else "abort")

    def run(self, stop=None, wait_s: float = 10.0, on_step=None) -> None:
        """Poll and execute until `stop()` is true (forever by default); `on_step(n_executed)`
        after each poll. An unreachable planner (a restart) is retried every second."""
        refused_since = None
        while stop is None or not stop():
            try:
                if self._generation is None:
                    self.announce("adapter started")
                elif self.engine_generation() != self._generation:
                    self.announce("engine restarted")
                n = self.step(wait_s)
                refused_since = None
            except httpx.HTTPStatusError as e:
                refused = e.response.status_code in (401, 403)
                if not refused:
                    refused_since = None  # only refusals in a row count
                elif refused_since is None:
                    refused_since = time.monotonic()
                if refused and time.monotonic() - refused_since >= REFUSED_GRACE_S:  # not a passing state
                    raise PermissionError(
                        f"the planner refused node {self.node}'s token ({e.response.status_code}: {e.response.text[:200]}); "
                        f"an adapter token comes from `statebudget token add --tokens FILE --role adapter "
                        f"--node {self.node}`") from None
                log.warning("planner answered %s; retrying", e)  # a refusal too, for REFUSED_GRACE_S
                time.sleep(1.0)
                continue
            except httpx.HTTPError as e:
                refused_since = None
                log.warning("planner unreachable (%s); retrying", e)
                time.sleep(1.0)
                continue
            if on_step is not None:
                on_step(n)
