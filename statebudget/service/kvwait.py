"""What happens to a program's KV in HBM while it waits on a tool, as a part of `LivePlanner`.

The rule is the simulator's (`core/toolwait.py`, `ToolWaitKV`: preserve, swap, discard, adaptive),
carried out by the same code (`core/kvwait.py`); the planner is its `KvWaitMechanism`: its
actions become ops, and its timers (a preserved KV's recheck at its TTL, a swapped-out KV's
swap-in before the tool's predicted return) wait on the heap `kv_timers` until `_kv_due`. Timers
are named by the tool wait (thread, since) they belong to and act only while that same wait goes
on; they are not kept on disk: a restart takes each tool wait up again (`_resume_tool_wait`).
"""

from __future__ import annotations

import heapq

from ..core import kvwait
from ..core.books import GpuCopy
from ..core.decisions import Demote
from ..core.toolwait import host_link_bps
from ..models.state import kv_key
from .journal import OpRec, OpStatus, gpu_tier, object_key, tier_group
from .programs import CallStatus, ProgramRec, ProgramStatus


class ToolWaitKVPart:
    """Suspends, swaps and drops a waiting program's KV, and releases a program's KV at its end."""

    def _moves_out(self, kvk, group=None, background_only: bool = False) -> list[OpRec]:
        """Open moves (demotions and drops) of a KV out of HBM (of one GPU group, or of any; or only
        tool-wait swaps)."""
        recs = sorted((self.ops[i] for i in self.ops_of.get(tuple(kvk), ())), key=lambda r: r.order)
        return [r for r in recs if r.op.kind in ("demote", "drop") and r.op.src.startswith("gpu:")
                and (group is None or r.op.src == gpu_tier(group)) and (r.op.background or not background_only)]

    def _keep_kv(self, kvk) -> None:
        """A call came back to this KV: its tool-wait swap-outs still in flight stop where the
        room they freed is still free, and their sources, which never left HBM, are ready again:
        the call does not wait for a round trip (the simulator's `_keep_kv`). Where the room went
        to something else, the move goes on."""
        for rec in self._moves_out(kvk, background_only=True):
            g = tier_group(rec.op.src)
            if (kvk, g) not in self.tiers.gpu and self.tiers.fits_gpu(g, rec.op.bytes / len(g)):
                self._close(rec, OpStatus.CANCELLED, "its call came back before the move ended")

    def _drop_all(self, kvk) -> list:
        """Release every copy of a KV: open ops writing it are cancelled, ready copies dropped."""
        for tier, op_id in [(t, o) for (k, t), o in self.writer.items() if k == kvk]:
            self._close(self.ops[op_id], OpStatus.CANCELLED, f"{kvk[0]} {kvk[1]}/{kvk[2]} released")
        out = []
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            c = self.tiers.gpu[(kvk, g)]
            if c.ready:
                c.pins = 0
                out.append(Demote(kvk, g, "none"))
        for (k, node), hc in list(self.tiers.host.items()):
            if k == kvk:
                self.tiers.remove_host_copy(hc)
                self.store.delete_copy(kvk, f"host:{node}")
                self._new_op("drop", kvk, f"host:{node}", "none", hc.nbytes, node)
        if kvk in {k for k, _ in self.tiers.nvme}:
            for (k, node) in [x for x in self.tiers.nvme if x[0] == kvk]:
                self.tiers.remove_nvme(kvk, node)
        return out

    def _busy(self, rec: ProgramRec) -> bool:
        """A call of the program waits or runs: its KV is in use, not suspended."""
        return any(c["status"] in (CallStatus.ARRIVED, CallStatus.STARTED) for c in rec.calls.values())

    def _kv_keys(self, program: str) -> list[tuple]:
        """The keys a program's KV may have: one per model of the catalog."""
        return [kv_key(program, m.name) for m in self.catalog.models]

    # ---- the planner as a `KvWaitMechanism` (`core/kvwait.py`): a program is its `ProgramRec`, a
    # tool wait the (thread, since) it began on

    def _tool_wait_kv(self, rec: ProgramRec, thread: str) -> None:
        """A tool started on `thread`."""
        tool, since, _ = rec.tools[thread]
        self.kv_waits[(rec.program, thread)] = kvwait.tool_started(self, rec, (thread, since), tool, since)

    def kv_copies(self, rec: ProgramRec) -> list[GpuCopy]:
        """By the catalog's models, then GPU group."""
        return [c for kvk in self._kv_keys(rec.program) for g in sorted(self.tiers.groups_of.get(kvk, ()))
                if (c := self.tiers.gpu[(kvk, g)]).ready and not c.pins]

    def kv_in_hbm(self, rec: ProgramRec) -> list[GpuCopy]:
        return [self.tiers.gpu[(kvk, g)] for kvk in self._kv_keys(rec.program)
                for g in self.tiers.groups_of.get(kvk, ())]

    def kv_program_busy(self, rec: ProgramRec) -> bool:
        return self._busy(rec)

    def kv_wait_goes_on(self, rec: ProgramRec, wait: tuple, kind: str) -> tuple[str, float] | None:
        """While the program runs and its thread still waits on the tool call that began then."""
        w = rec.tools.get(wait[0]) if rec.status == ProgramStatus.RUNNING else None
        return (w[0], w[1]) if w is not None and w[1] == wait[1] else None

    def kv_swap_out(self, c: GpuCopy) -> None:
        self._demote(c.key, c.group, "host", background=True)

    def kv_drop(self, c: GpuCopy) -> None:
        self._demote(c.key, c.group, "none")

    def kv_swap_in(self, kvk, group) -> None:
        """Only from the host DRAM of the group's node (the promote op runs there)."""
        if (kvk, self.gpus[group[0]].node) in self.tiers.host:
            self._promote(kvk, group, background=True)

    def kv_swap_in_once_written(self, rec: ProgramRec, wait: tuple, kvk, group, hc) -> None:
        self.swap_in_after[kvk] = (rec.program, wait, group)  # `_kv_back` once the op commits

    def kv_set_timer(self, at: float, kind: str, rec: ProgramRec, wait: tuple, kvk, group) -> None:
        """On `kv_timers`, named by the program and its wait; `_kv_due` fires it."""
        heapq.heappush(self.kv_timers, (at, next(self._timer_seq), kind, rec.program, wait, kvk, group))

    def kv_on_action(self, rule: str, new: bool) -> None:
        if new:  # /metrics counts what the books' `actions` count
            self.telemetry.kv_action(rule)

    def kv_end_suspension(self, c: GpuCopy) -> None:
        c.suspended_since = None

    def _kv_due(self) -> None:
        """Timers that are due (a program that is gone has no wait that goes on)."""
        while self.kv_timers and self.kv_timers[0][0] <= self.now:
            _, _, kind, program, wait, kvk, group = heapq.heappop(self.kv_timers)
            rec = self.programs.get(program)
            if rec is not None:
                kvwait.timer_due(self, kind, rec, wait, kvk, group)

    def _kv_back(self, program: str, wait: tuple, kvk, group) -> None:
        """A swap-out a swap-in waited for is written (`swap_in_after`)."""
        rec = self.programs.get(program)
        if rec is not None:
            kvwait.swap_back(self, rec, wait, kvk, group)

    def _resume_tool_wait(self, rec: ProgramRec) -> None:
        """After a restart, a tool wait that goes on is taken up where it is (its timers were not on
        disk): a KV still in HBM is judged on the wait still expected, one swapped out to host DRAM
        gets its swap-in again, on the thread whose wait began last (the one that left the program
        idle). The rule's counts and predictions start afresh, as at any restart."""
        for th, (tool, since, _) in rec.tools.items():
            self.kv_waits[(rec.program, th)] = self.kvw.started(tool)
        thread = max(rec.tools, key=lambda th: rec.tools[th][1])
        tool, since, _ = rec.tools[thread]
        left = self.kvw.remaining(tool, self.now - since) if self.kv_waits[(rec.program, thread)] is not None else None
        for c in self.kv_copies(rec):  # (a KV whose swap-out is open has left the books' HBM)
            self.kvw.suspended(c.key, tool)
            c.suspended_since = since  # held since the wait began: a preserve is not counted again
            kvwait.suspend(self, rec, (thread, since), tool, since, c, left)
        for kvk in self._kv_keys(rec.program):
            group = next((tuple(call["group"]) for call in reversed(list(rec.calls.values()))
                          if call["model"] == kvk[2] and call["group"] is not None), None)
            if kvk not in self.kv_tokens or kvk in self.tiers.groups_of or group is None or \
                    (kvk, self.gpus[group[0]].node) not in self.tiers.host:
                continue
            at = self.kvw.swap_in_at(tool, kvk[2], self.tiers.host[(kvk, self.gpus[group[0]].node)].nbytes, left,
                                     host_link_bps(self, group), self.now)
            if at is not None:
                self.kvw.suspended(kvk, tool)
                self.kv_set_timer(at, kvwait.SWAP_IN, rec, (thread, since), kvk, group)

