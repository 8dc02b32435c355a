"""What an adapter really holds wins over the books, as a part of `LivePlanner`.

An adapter that (re)starts, or whose engine restarted and lost its memory, sends its inventory:
every ready copy it holds in HBM and host DRAM (`PUT /v1/inventory`). The planner then

    open ops of that node ──▶ failed ("adapter restarted"): the new adapter never runs what the
                              old one may have begun, so no op is executed twice
    a copy in the books, not in the inventory (or of another version) ──▶ gone, from memory and
                              the ledger; the live leases it served go stale with the reason
    a copy in the inventory, not in the books ──▶ adopted if it is current and fits, else the
                              answer tells the adapter to drop it
and plans again from there.

Failed ops back off: a promote that failed is not planned again onto the same tier, nor a move
out of HBM that failed from the same copy, for 1 s, 2 s, 4 s ... (`FAIL_BACKOFF_S`, doubling, at
most `FAIL_BACKOFF_MAX_S`); after `FAIL_GIVE_UP`
failures in a row from a host copy, that host copy is given up (the books let it go, so the next
plan reads the model store instead). A commit clears the record. This is soft state: a restart
starts it afresh, which costs at most `FAIL_GIVE_UP` more tries.

Compaction keeps the ledger bounded: closed ops older than `retain_ops_s`, ended programs (with
their ended leases) and any lease ended longer than `retain_programs_s` ago leave memory and
disk, and only the newest `KEEP_ORACLE_RUNS` oracle runs stay. A program id whose record was
compacted is new again: a late `program_started` for it starts a fresh program.
"""

from __future__ import annotations

import logging

from ..core.books import HostCopy
from ..planner.leases import LeaseState
from .errors import Invalid, NotFound
from .journal import OpStatus, gpu_tier, object_key, tier_group
from .results import InventoryAck

log = logging.getLogger("statebudget.planner")

FAIL_BACKOFF_S = 1.0
FAIL_BACKOFF_MAX_S = 60.0
FAIL_GIVE_UP = 3
COMPACT_EVERY_S = 60.0
KEEP_ORACLE_RUNS = 100  # the newest oracle runs kept in the ledger


class Reconcile:
    """Inventories, failure back-off and compaction."""

    # ---- inventory ---------------------------------------------------------------------------------
    def reconcile(self, node: str, copies: list[dict], reason: str = "adapter started") -> InventoryAck:
        """Take node `node`'s inventory (`[{object, tier, bytes?, version?}]`, its ready copies in
        HBM and host DRAM) as the truth, in one transaction.

        Called by PUT /v1/inventory with the adapter's node. Returns what changed. Raises NotFound
        (no such node) or Invalid (a copy on a tier of another node, or not a state object)."""
        if node not in self.cluster.node_by_name:
            raise NotFound(f"no node {node!r} in cluster {self.cluster.name!r}")
        held = self._inventory_index(node, copies)
        self.last_seen[node] = self.now
        why = f"{reason}: node {node}'s inventory replaces the books"
        with self._tx():
            closed = 0
            for rec in sorted((r for r in self.ops.values() if r.node == node), key=lambda r: r.order):
                self._close(rec, OpStatus.FAILED, why, undo_source=False)
                closed += 1
            lost = self._forget_missing(node, held)
            adopted, drop = self._adopt(held)
            stale = self._stale_leases(lost, why)
            self.fail_backoff = {k: v for k, v in self.fail_backoff.items() if not self._on_node(node, k[1])}
            self._bump()
            self._flush()
        self.plan_due = True
        log.warning("node %s inventory (%s): %d ops closed, %d copies lost, %d adopted, %d to drop, %d leases stale",
                    node, reason, closed, len(lost), len(adopted), len(drop), stale)
        return InventoryAck(node, self.plan_version, closed, [_wire(k, t) for k, t in lost],
                            [_wire(k, t) for k, t in adopted], [_wire(k, t) for k, t in drop], stale)

    def _on_node(self, node: str, tier: str) -> bool:
        """Whether `tier` is node `node`'s DRAM or a group of its GPUs (raises ValueError for a
        GPU tier that is not one)."""
        if tier.startswith("gpu:"):
            return all(i < len(self.gpus) and self.gpus[i].node == node for i in tier_group(tier))
        return tier == f"host:{node}"

    def _inventory_index(self, node: str, copies: list[dict]) -> dict[tuple, dict]:
        out = {}
        for i, c in enumerate(copies):
            tier = c["tier"]
            try:
                key = object_key(c["object"])
                ok_tier = self._on_node(node, tier)
            except (ValueError, IndexError):
                raise Invalid(f"copies[{i}]: not a state object on a tier: {c['object']!r} on {tier!r}") from None
            if key[0] not in ("w", "kv", "e") or not ok_tier:
                raise Invalid(f"copies[{i}]: {list(c['object'])} on {tier!r} is not a copy node {node} can hold")
            model = key[2] if key[0] == "kv" else key[1]
            m = self.catalog.by_name.get(model)
            if m is None or (key[0] == "e" and not (m.moe and 0 <= key[2] < m.moe.pages)) or \
                    (key[0] == "kv" and len(key) != 3) or (key[0] == "w" and len(key) != 2):
                raise Invalid(f"copies[{i}]: {list(c['object'])} is no state object of catalog {self.catalog.name!r}")
            if tier.startswith("gpu:") and tier_group(tier) not in self.model_groups(m):
                raise Invalid(f"copies[{i}]: {tier!r} is no GPU group of cluster {self.cluster.name!r} for {model!r} "
                              f"(tensor-parallel width {m.tp})")
            out[(key, tier)] = c
        return out

    def _forget_missing(self, node: str, held: dict) -> list[tuple]:
        """Books copies of `node` the inventory does not list at their version: gone."""
        lost = []
        for (key, group), c in sorted(self.tiers.gpu.items(), key=lambda x: (gpu_tier(x[0][1]), x[0][0])):
            tier = gpu_tier(group)
            if not self._on_node(node, tier) or (c.ready and self._holds(held.get((key, tier)), key)):
                continue
            self.tiers.remove_gpu_copy(c)
            self.store.delete_copy(key, tier)
            lost.append((key, tier))
        for (key, n), hc in sorted(self.tiers.host.items(), key=lambda x: x[0][0]):
            tier = f"host:{n}"
            if n != node or (hc.ready and self._holds(held.get((key, tier)), key)):
                continue
            self.tiers.remove_host_copy(hc)
            self.store.delete_copy(key, tier)
            lost.append((key, tier))
        return lost

    def _holds(self, row: dict | None, key) -> bool:
        """An inventory row holds the books' current version of `key`. A KV's version (its token
        count) must be given; weights without one (an engine that cannot tell) are taken as the
        catalog's current version."""
        if row is None:
            return False
        v = row.get("version")
        return v == self.version_of(key) or (v is None and key[0] != "kv")

    def _adopt(self, held: dict) -> tuple[list, list]:
        """Inventory copies the books lack: current ones that fit are taken in (ready), the rest
        the adapter drops."""
        adopted, drop = [], []
        for (key, tier), row in sorted(held.items(), key=lambda x: (x[0][1], x[0][0])):
            current = self._holds(row, key) and (key[0] != "kv" or key in self.kv_tokens)
            size = self.size_of(key) if key[0] != "kv" or key in self.kv_tokens else 0.0
            if tier.startswith("gpu:"):
                group = tier_group(tier)
                if (key, group) in self.tiers.gpu:
                    continue
                if current and self._take_gpu_copy(key, group, size / len(group)):
                    adopted.append((key, tier))
                else:
                    drop.append((key, tier))
            else:
                node = tier.split(":", 1)[1]
                if (key, node) in self.tiers.host:
                    continue
                if current and key[0] != "kv" and self.tiers.alloc_host(node, size):
                    hc = self.tiers.host[(key, node)] = HostCopy(key, node, size, True, self.now)
                    self._save_host(hc)
                    adopted.append((key, tier))
                else:
                    drop.append((key, tier))
        return adopted, drop

    def _stale_leases(self, lost: list[tuple], why: str) -> int:
        """Live leases that prepared a lost copy on their group: stale, with the reason."""
        gone = {(k, tier_group(t)) for k, t in lost if t.startswith("gpu:")}
        n = 0
        for lid, lease in list(self.ledger.leases.items()):
            group = self.policy.group_of.get(lid)
            if lease.state.live and group is not None and any((k, group) in gone for k in lease.objects):
                self._apply(self.policy.stop_leases(self, [(lid, self.ledger.lose(lid, self.now, why))]))
                n += 1
        return n

    # ---- failed ops --------------------------------------------------------------------------------
    def _failed(self, rec) -> None:
        """An op failed: a promote holds its target back, a move out of HBM its source (which went
        back into the books), doubling each time; a host source of promotes is given up after
        FAIL_GIVE_UP failures in a row. A failed drop has its own retries (`_drop_instead`)."""
        op, key = rec.op, object_key(rec.op.object)
        if op.kind == "drop":
            return
        tier = op.dst if op.kind == "promote" else op.src
        n, _ = self.fail_backoff.get((key, tier), (0, 0.0))
        n += 1
        self.fail_backoff[(key, tier)] = (n, self.now + min(FAIL_BACKOFF_S * 2 ** (n - 1), FAIL_BACKOFF_MAX_S))
        if op.kind != "promote":
            return
        if n >= FAIL_GIVE_UP and op.src.startswith("host:"):
            hc = self.tiers.host.get((key, op.src.split(":", 1)[1]))
            if hc is not None and hc.ready:
                log.warning("%s: %d promotes from %s failed (%s); gave up that copy", list(key), n, op.src, rec.reason)
                self.tiers.remove_host_copy(hc)
                self.store.delete_copy(key, op.src)
                rec.reason = f"{rec.reason} (gave up {op.src} after {n} failures)"

    def held_back(self, key, tier: str) -> bool:
        """Whether a promote of `key` into `tier` failed recently and waits out its back-off."""
        rec = self.fail_backoff.get((key, tier))
        return rec is not None and self.now < rec[1]

    # ---- compaction --------------------------------------------------------------------------------
    def _compact(self) -> int:
        """Closed ops and ended programs past their retention leave the ledger (and memory); run
        from `tick` at most every COMPACT_EVERY_S. Returns the rows removed."""
        now = self.now
        if now - self._compacted_s < COMPACT_EVERY_S:
            return 0
        self._compacted_s = now
        n = self.store.delete_closed_ops(now - self.retain_ops_s)
        old = [p for p, r in self.programs.items()
               if p not in self.running and r.ended_s is not None and r.ended_s < now - self.retain_programs_s]
        ended = {LeaseState.CONSUMED, LeaseState.REJECTED, LeaseState.CANCELLED, LeaseState.STALE, LeaseState.EXPIRED}
        for p in old:
            del self.programs[p]
        n += self.store.delete_programs(old)
        gone = set(old)
        leases = [lid for lid, l in self.ledger.leases.items() if l.state in ended and (
            l.request.program in gone or (l.ended_s is not None and l.ended_s < now - self.retain_programs_s))]
        for lid in leases:
            self.ledger.forget(lid)
            self.policy.group_of.pop(lid, None)
        n += self.store.delete_leases(leases)
        n += self.store.delete_old_runs(KEEP_ORACLE_RUNS)
        return n


def _wire(key, tier) -> dict:
    return {"object": [str(x) for x in key], "tier": tier}
