"""The op journal: every transfer the planner asks an adapter to run, from open to closed.

    _new_op ─▶ open ──plan_for──▶ offered (any number of times)
                 │
                 ├─ report done, version and epoch match ─▶ _commit: the target copy is ready
                 └─ report failed / cancelled / stale ───▶ _close: the target is undone; a move
                                                            out of HBM that did not land takes its
                                                            source back (`_demote_undone`) or drops
                                                            it in its place (`_drop_instead`)

A drop the engine failed is sent again, held (`not_before`) for 1 s, 2 s, then 4 s; after
`DROP_TRIES` the books let the copy go. Every op, open or closed, is in the ledger, so a restart
offers the open ones again and answers a repeated report of a closed one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from ..core.books import GpuCopy
from ..models.plan import Op, OpAck, Plan
from ..planner.leases import Lease
from .errors import Conflict, Forbidden, Invalid, NotFound
from .telemetry import op_reason

log = logging.getLogger("statebudget.planner")
# An engine busy with requests may refuse a release for a while, and one without per-program
# KV control refuses it at every poll: a failed drop is retried a few times, backing off.
DROP_TRIES = 3       # a drop the engine failed is sent again this many times, ...
DROP_RETRY_S = 1.0   # ... 1 s, 2 s, then 4 s after the failure before it


class OpStatus(StrEnum):
    OPEN = "open"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class OpRec:
    """An op and what the journal knows of it."""
    op: Op
    node: str
    status: OpStatus = OpStatus.OPEN
    offered: int = 0
    plan_version: int = 0
    result: dict | None = None
    reason: str = ""
    order: int = 0            # its place in the node's plan (`plan_for`): its number, or the
                              # place of the move out it replaces (`_demote_undone`)
    tries: int = 0            # a drop sent again: how many drops of that copy failed before it
    not_before: float = 0.0   # ... and not offered before this time (0: offered now)
    closed_s: float = 0.0     # when it closed (compaction drops it from the ledger later)
    issued_s: float = 0.0     # when it was planned, on the planner's clock (not in the ledger: a restart's time)


def gpu_tier(group) -> str:
    """The tier name of a GPU group: (0, 1) -> `gpu:0,1`."""
    return "gpu:" + ",".join(str(i) for i in group)


def object_key(obj) -> tuple:
    """A state key from an op's `object` (strings on the wire; an expert page's index is an int)."""
    return (obj[0], obj[1], int(obj[2])) if obj[0] == "e" else tuple(obj)


def tier_group(tier: str) -> tuple[int, ...]:
    """The GPU group of a group tier: `gpu:0,1` -> (0, 1)."""
    return tuple(int(x) for x in tier.split(":", 1)[1].split(","))


def per_gpu_tiers(tier: str) -> list[str]:
    """A group tier `gpu:0,1` as the per-GPU tiers the cost model's paths know."""
    if tier.startswith("gpu:"):
        return [f"gpu:{i}" for i in tier_group(tier)]
    return [tier]


class Journal:
    """The op journal as a part of `LivePlanner`: ops open, are offered, and close."""

    def _new_op(self, kind: str, key, src: str, dst: str, nbytes: float, node: str, lease: Lease | None = None,
                background: bool = False, order: int | None = None, version: int | None = None,
                epoch: int | None = None, not_before: float = 0.0, tries: int = 0) -> Op:
        """A new open op; `order`, `version`, `epoch` default to the next number and the state's now
        (`not_before`, `tries`: a held drop, `_drop_instead`)."""
        self._op_seq += 1
        op = Op(op_id=f"op{self._op_seq}", kind=kind, object=[str(x) for x in key], src=src, dst=dst, bytes=nbytes,
                epoch=self.epoch_of(key) if epoch is None else epoch,
                version=self.version_of(key) if version is None else version,
                deadline=lease.request.deadline_s if lease else None, lease_id=lease.lease_id if lease else None,
                background=background, checksum=self.require_checksums and kind != "drop")
        self._bump()  # an adapter long-polling the plan must see it
        rec = self.ops[op.op_id] = OpRec(op, node, plan_version=self.plan_version,
                                         order=self._op_seq if order is None else order, tries=tries,
                                         not_before=not_before, issued_s=self.now)
        self._on_link(op, +1)
        self.ops_of.setdefault(tuple(key), set()).add(op.op_id)
        if kind == "promote":
            self.writer[(key, dst)] = op.op_id
        self._save_op(rec)
        return op

    def _bump(self) -> None:
        """The plan changed: a new plan version, which wakes the adapters' long polls."""
        self.plan_version += 1
        self._save_meta()

    def plan_for(self, node: str, after: int) -> Plan:
        """The open ops of one node, in the order to run them: the order they were made, except
        that a drop in place of a move out of HBM that did not land takes that move's place, ahead
        of the promotes planned into the room the move was to free. Held drops wait (`_release_held`).

        Called by GET /v1/plan once the plan version passed `after` (the route waits for that).
        Counts each op as offered once more. Returns the plan version and the ops.
        Raises NotFound for a node the cluster does not have."""
        if node not in self.cluster.node_by_name:
            raise NotFound(f"no node {node!r} in cluster {self.cluster.name!r}")
        self.last_seen[node] = self.now
        ops = sorted((r for r in self.ops.values() if r.node == node and not r.not_before),
                     key=lambda r: r.order)
        if ops:
            with self._tx():
                for r in ops:
                    r.offered += 1
                    self._save_op(r)
        return Plan(version=self.plan_version, ops=[r.op for r in ops])

    def report(self, node: str, op_id: str, result: dict) -> OpAck:
        """An adapter's report. `done` with the op's version and epoch, while the books still hold
        them, commits; anything stale or cancelled is refused (Conflict) and undone. A refusal is
        committed before it is raised: the op is closed on disk as in memory.

        Called by POST /v1/ops/{op_id} with the adapter's node and its `OpReport` as a dict.
        Returns the op's status (`duplicate` for a done report of a closed op sent again).
        Raises NotFound, Forbidden (another node's op) or Conflict (stale, or already closed)."""
        refused = None
        self.last_seen[node] = self.now
        with self._tx():
            rec = self.ops.get(op_id)
            if rec is None:
                return self._closed_report(node, op_id, result)
            if rec.node != node:
                raise Forbidden(f"op {op_id} belongs to node {rec.node}, not {node}")
            op, key = rec.op, object_key(rec.op.object)
            bad = self._implausible(op, result) if result["status"] == OpStatus.DONE else None
            if bad:
                self._close(rec, OpStatus.FAILED, f"report refused: {bad}", result)
            elif result["status"] == OpStatus.DONE:
                if (result.get("version"), result.get("epoch")) != (op.version, op.epoch):
                    refused = (f"reported version/epoch {result.get('version')}/{result.get('epoch')} "
                               f"!= op's {op.version}/{op.epoch}")
                elif self._stale(op) and op.kind != "drop":
                    refused = (f"state moved on to version/epoch {self.version_of(key)}/{self.epoch_of(key)} "
                               f"while the op ran")
                if refused:
                    self._close(rec, OpStatus.CANCELLED, refused, result)
                else:
                    self._commit(rec, result)
            else:
                self._close(rec, OpStatus(result["status"]), result.get("error") or "reported " + result["status"], result)
            self._flush()
        self.plan_due = True
        if bad:
            raise Invalid(f"op {op_id}: {bad}; the op is failed, its target undone")
        if refused:
            raise Conflict(f"op {op_id}: {refused}")
        return OpAck(op_id=op_id, status=rec.status.value)

    @staticmethod
    def _implausible(op: Op, result: dict) -> str | None:
        """What makes a done report of `op` impossible: more bytes copied than the object could
        hold (an existing copy moves whole, so up to twice the op's bytes, plus rounding), or no
        checksum where the op asked for one."""
        limit = max(2.0 * op.bytes, op.bytes + 2.0 ** 20)
        if float(result.get("bytes", 0.0)) > limit:
            return f"{result['bytes']:.4g} bytes copied for an object of {op.bytes:.4g} B"
        if op.checksum and not result.get("checksum"):
            return "no checksum, and the op asked for one"
        return None

    def _stale(self, op: Op) -> bool:
        """The state `op` is about has moved on (another version, or epoch) since it was made."""
        key = object_key(op.object)
        return (self.version_of(key), self.epoch_of(key)) != (op.version, op.epoch)

    def _closed_report(self, node: str, op_id: str, result: dict) -> OpAck:
        """A report for an op no longer open: a repeat of its done report is acknowledged again."""
        row = self.store.get_op(op_id)
        if row is None:
            raise NotFound(f"no op {op_id!r}")
        if row["node"] != node:
            raise Forbidden(f"op {op_id} belongs to node {row['node']}, not {node}")
        if row["status"] == result["status"] == OpStatus.DONE and (row["result"] or {}).get("checksum") == result.get("checksum"):
            return OpAck(op_id=op_id, status=OpStatus.DONE.value, duplicate=True)
        raise Conflict(f"op {op_id} is already {row['status']}" + (f": {row['reason']}" if row["reason"] else ""))

    def _commit(self, rec: OpRec, result: dict) -> None:
        op, key = rec.op, object_key(rec.op.object)
        if op.kind == "promote" and op.dst.startswith("gpu:"):
            c = self.tiers.gpu[(key, tier_group(op.dst))]
            c.ready = True
            self._save_gpu(c)
            self.policy.on_copy_ready(self, c)
        elif op.dst.startswith("host:"):
            hc = self.tiers.host[(key, op.dst.split(":", 1)[1])]
            hc.ready = True
            self._save_host(hc)
            if key in self.swap_in_after:  # a tool-wait swap-in waited for this swap-out
                program, wait, group = self.swap_in_after.pop(key)
                self._kv_back(program, wait, key, group)
        links = self._op_links(op)
        moved = float(result.get("bytes", op.bytes))
        for link, b in links.items():  # the bytes really copied (0 if the target already held them)
            self.telemetry.moved(link, moved * b / op.bytes if op.bytes else 0.0)
        rec.status, rec.result = OpStatus.DONE, result
        self.fail_backoff.pop((key, op.dst), None)
        if op.kind != "drop":  # a drop sets no back-off (`_failed`), and frees no failing move
            self.fail_backoff.pop((key, op.src), None)
        self._finish(rec)

    def _close(self, rec: OpRec, status: OpStatus, reason: str, result: dict | None = None,
               undo_source: bool = True) -> None:
        """An op ends without a commit: undo its target in the books (the copy it was writing);
        a demotion's source goes back into the books unless `undo_source` is off (the caller
        accounts for it)."""
        op, key = rec.op, object_key(rec.op.object)
        mine = self.writer.get((key, op.dst)) == op.op_id  # undo only a target this op was writing
        if op.dst.startswith("gpu:") and mine:
            c = self.tiers.gpu.get((key, tier_group(op.dst)))
            if c is not None and not c.ready:
                self.tiers.remove_gpu_copy(c)
                self.store.delete_copy(key, op.dst)
        elif op.dst.startswith("host:") and mine:
            self.swap_in_after.pop(key, None)  # the swap-out it waited for will not land
            hc = self.tiers.host.get((key, op.dst.split(":", 1)[1]))
            if hc is not None and not hc.ready:
                self.tiers.remove_host_copy(hc)
                self.store.delete_copy(key, op.dst)
        if undo_source and op.src.startswith("gpu:") and (op.kind == "demote" or (op.kind == "drop" and status == OpStatus.FAILED)):
            self._demote_undone(rec)  # the source is still in HBM: a move releases it only on commit
        rec.status, rec.reason, rec.result = status, reason, result
        if status == OpStatus.FAILED:
            self._failed(rec)  # back off that target, so a failing op is not planned again in a loop
        self._finish(rec)
        self._bump()

    def _demote_undone(self, rec: OpRec) -> None:
        """A demotion failed or was cancelled (or a drop failed), so its source is still in HBM (a
        move releases it only on commit): back into the books if it still fits and is still
        wanted and current, else dropped (`_drop_instead`). A copy of an older version (a call
        grew the KV elsewhere, the catalog was reloaded) is never taken back as the current one."""
        op, key, group = rec.op, object_key(rec.op.object), tier_group(rec.op.src)
        per_gpu = op.bytes / len(group)
        if key[0] == "kv" and key not in self.kv_tokens or self._stale(op):
            self._drop_instead(rec)  # its program ended, or the state moved on while it ran: it must go
            return
        back = self.tiers.gpu.get((key, group))
        if back is not None and not back.ready:
            # it is being promoted back onto that very group: the source never left, adopt it
            back.ready = True
            self._save_gpu(back)
            writer = self.writer.get((key, op.src))
            if writer is not None:
                self._finish_as(self.ops[writer], OpStatus.CANCELLED, "its source never left HBM")
            self.policy.on_copy_ready(self, back)
            return
        if (key, group) in self.tiers.gpu or not self._take_gpu_copy(key, group, per_gpu):
            self._drop_instead(rec)

    def _take_gpu_copy(self, key, group, per_gpu: float) -> bool:
        """Put a copy the engine holds (a move that did not leave, an adapter's inventory) into the
        books as ready, with its engine if it is weights, if it fits; whether it did."""
        if not self.tiers.fits_gpu(group, per_gpu + self.tiers.engine_need(key, group)):
            return False
        if key[0] == "w":
            self.tiers.start_engine(key, group, self.now)
        self.tiers.alloc_gpu(group, per_gpu)
        c = GpuCopy(key, group, per_gpu, True, self.now, self.now)
        self.tiers.add_gpu_copy(c)
        self._save_gpu(c)
        return True

    def _drop_instead(self, rec: OpRec) -> None:
        """Drop the source of `rec`, a move out of HBM that did not land or a drop that failed, in
        its place in the plan: ahead of the promotes planned into the room it was to free. A
        failed drop is sent again after 1 s, 2 s and 4 s (held, `not_before`: an engine busy with
        requests may refuse a release for a while, and one without per-program KV control refuses
        it at every poll); then the books let the copy go, with a warning, and the engine keeps it."""
        op, key = rec.op, object_key(rec.op.object)
        if op.kind != "drop":
            self._new_op("drop", key, op.src, "none", op.bytes, rec.node, order=rec.order)
            return
        if rec.tries >= DROP_TRIES:
            log.warning("%s in %s: the engine failed %d drops (%s); the books let it go", list(key), op.src,
                        rec.tries + 1, rec.reason)
            return
        # sent again as the same drop (of the version it was, so that a copy out of date stays so),
        # held until its time: an open op, in the ledger, so a restart keeps it
        self._new_op("drop", key, op.src, "none", op.bytes, rec.node, order=rec.order, version=op.version,
                     epoch=op.epoch, not_before=self.now + DROP_RETRY_S * 2 ** rec.tries, tries=rec.tries + 1)

    def _finish_as(self, rec: OpRec, status: OpStatus, reason: str) -> None:
        """Close an op whose target is already settled in the books (nothing to undo)."""
        rec.status, rec.reason = status, reason
        self._finish(rec)
        self._bump()

    def _finish(self, rec: OpRec) -> None:
        rec.closed_s = self.now
        del self.ops[rec.op.op_id]
        key = object_key(rec.op.object)
        ids = self.ops_of.get(key)
        if ids is not None:
            ids.discard(rec.op.op_id)
            if not ids:
                del self.ops_of[key]
        self._on_link(rec.op, -1)
        self.writer.pop((object_key(rec.op.object), rec.op.dst), None)
        self._save_op(rec)
        self.telemetry.op(rec.status, op_reason(rec, self))

    def _held(self):
        """The open ops held back until their `not_before`."""
        return (r for r in self.ops.values() if r.not_before)

    def _release_held(self) -> None:
        """Held drops whose time has come are offered (the plan version moves for the long polls),
        unless the books took that copy up again meanwhile (a promote onto that tier, which
        replaced it): that one is cancelled."""
        due = [r for r in self._held() if r.not_before <= self.now]
        for r in due:
            r.not_before = 0.0
            if (object_key(r.op.object), tier_group(r.op.src)) in self.tiers.gpu:
                self._finish_as(r, OpStatus.CANCELLED, "the copy is in the books again")
            else:
                self._save_op(r)
        if due:
            self._bump()

    def link_backlog(self) -> dict[str, float]:
        """Bytes the open ops still have to put on each link (all of an op's bytes until done),
        kept as ops open and close. Read by the planning step (`planner/core.py`) when it quotes and ranks."""
        return {l: b for l, b in self.backlog.items() if b > 1.0}

    def _op_links(self, op: Op) -> dict[str, float]:
        """The bytes `op` puts on each link of its path (none for a drop)."""
        if op.src == "none" or op.dst == "none":
            return {}
        out: dict[str, float] = {}
        srcs, dsts = per_gpu_tiers(op.src), per_gpu_tiers(op.dst)
        share = op.bytes / (len(srcs) * len(dsts))
        for s in srcs:
            for d in dsts:
                for link in self.cost.path(s, d):
                    out[link] = out.get(link, 0.0) + share
        return out

    def _on_link(self, op: Op, sign: float) -> None:
        """Add (+1, an op opens) or take off (-1, it closes) its bytes from the link backlog."""
        for link, b in self._op_links(op).items():
            self.backlog[link] = self.backlog.get(link, 0.0) + sign * b

