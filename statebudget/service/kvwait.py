"""What happens to a program's KV in HBM while it waits on a tool, as a part of `LivePlanner`.

The rule is the simulator's (`core/toolwait.py`, `ToolWaitKV`: preserve, swap, discard, adaptive);
here its decisions become ops. A preserved KV is judged again when its TTL runs out; a swapped-out
KV comes back (a background swap-in) before the tool's predicted return. Timers are named by the
tool wait (thread, since) they belong to and act only while that same wait goes on; they are not
kept on disk: a restart takes each tool wait up again (`_resume_tool_wait`).
"""

from __future__ import annotations

import heapq

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
        return [r for r in self.ops.values() if r.op.kind in ("demote", "drop") and object_key(r.op.object) == kvk
                and r.op.src.startswith("gpu:") and (group is None or r.op.src == gpu_tier(group))
                and (r.op.background or not background_only)]

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

    def _kv_copies(self, program: str) -> list[GpuCopy]:
        """The program's KV copies in HBM that are ready and that no running call pins."""
        return [c for kvk in self._kv_keys(program) for g in sorted(self.tiers.groups_of.get(kvk, ()))
                if (c := self.tiers.gpu[(kvk, g)]).ready and not c.pins]

    def _tool_wait_kv(self, rec: ProgramRec, thread: str) -> None:
        """A tool started on `thread`: the rule for each KV copy of the program, unless another of
        its calls still runs (then its KV is not suspended)."""
        tool, since, _ = rec.tools[thread]
        predicted = self.kv_waits[(rec.program, thread)] = self.kvw.started(tool)
        if self._busy(rec):
            return
        copies = self._kv_copies(rec.program)
        for kvk in sorted({c.key for c in copies}):
            self.kvw.suspended(kvk, tool)
        for c in copies:
            self._suspend_kv(rec, c, predicted, thread)

    def _awaited(self, program: str, wait: tuple) -> list | None:
        """The tool wait `wait` = (thread, since) of a running program, if it still goes on."""
        rec = self.programs.get(program)
        w = rec.tools.get(wait[0]) if rec is not None and rec.status == ProgramStatus.RUNNING else None
        return w if w is not None and w[1] == wait[1] else None

    def _suspend_kv(self, rec: ProgramRec, c: GpuCopy, predicted: float | None, thread: str) -> None:
        tool, since, _ = rec.tools[thread]
        act = self.kvw.decide_copy(self, tool, c, predicted, since)
        if act.new:  # /metrics counts what the books' `actions` count
            self.telemetry.kv_action(act.rule)
        if act.rule == "preserve":
            if c.suspended_since is None:
                c.suspended_since = self.now
            if act.recheck_at is not None:
                self._kv_timer(act.recheck_at, "recheck", rec, thread, c.key, c.group)
        elif act.rule == "swap":
            self._demote(c.key, c.group, "host", background=True)
            if act.swap_in_at is not None:
                self._kv_timer(act.swap_in_at, "swap_in", rec, thread, c.key, c.group)
        else:
            self._demote(c.key, c.group, "none")

    def _kv_timer(self, at: float, kind: str, rec: ProgramRec, thread: str, kvk, group) -> None:
        """A recheck or swap-in at `at`, for the tool wait now running on `thread`."""
        wait = (thread, rec.tools[thread][1])
        heapq.heappush(self.kv_timers, (at, next(self._timer_seq), kind, rec.program, wait, kvk, group))

    def _kv_due(self) -> None:
        """Timers that are due: a preserved KV whose TTL ran out is judged again on the wait still
        expected; a swapped-out KV comes back before the predicted return. Both only while the
        same tool wait goes on."""
        while self.kv_timers and self.kv_timers[0][0] <= self.now:
            _, _, kind, program, wait, kvk, group = heapq.heappop(self.kv_timers)
            w = self._awaited(program, wait)
            if w is None:
                continue
            if kind == "swap_in":
                self._kv_back(program, wait, kvk, group)
                continue
            rec = self.programs[program]
            c = self.tiers.gpu.get((kvk, group))
            if c is None or c.suspended_since is None or c.pins or not c.ready:
                continue
            left = self.kvw.remaining(w[0], self.now - wait[1])
            if self._busy(rec):  # another thread's call runs: judge it again later, as the simulator does
                self._kv_timer(self.kvw.next_check(self.now, wait[1], left), "recheck", rec, wait[0], kvk, group)
                continue
            self._suspend_kv(rec, c, left, wait[0])

    def _kv_back(self, program: str, wait: tuple, kvk, group) -> None:
        """Swap a KV back in from host DRAM as a background op that evicts nothing; once the
        swap-out is written if it is still on its way."""
        if self._awaited(program, wait) is None or kvk not in self.kv_tokens or (kvk, group) in self.tiers.gpu:
            return
        hc = self.tiers.host.get((kvk, self.gpus[group[0]].node))
        if hc is None:
            return
        if not hc.ready:
            self.swap_in_after[kvk] = (program, wait, group)
            return
        if self.best_source(kvk, group).startswith("host:"):  # a swap-in, not a recompute
            self._promote(kvk, group, background=True)

    def _end_suspensions(self, program: str) -> None:
        """No thread of the program waits on a tool any more: its KV copies are no longer suspended."""
        for kvk in self._kv_keys(program):
            for g in self.tiers.groups_of.get(kvk, ()):
                self.tiers.gpu[(kvk, g)].suspended_since = None

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
        for c in self._kv_copies(rec.program):  # (a KV whose swap-out is open has left the books' HBM)
            self.kvw.suspended(c.key, tool)
            c.suspended_since = since  # held since the wait began: a preserve is not counted again
            self._suspend_kv(rec, c, left, thread)
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
                self._kv_timer(at, "swap_in", rec, thread, kvk, group)

