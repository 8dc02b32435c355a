"""Programs: a trace program's DAG of calls and tool waits as it runs, node by node, with cancel
propagation, and what a tool wait does to the program's KV (seed 003 §10-§12, §21)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from ..core.books import GpuCopy
from ..core import kvwait
from ..core.costs import page_touch_probs
from ..core.toolwait import BACKGROUND_SHARE
from ..models.trace import Program
from ..traces.graph import children_of, descendants, handoff_calls, hinted_calls
from .calls import CallRec
from .loop import PRIO_NODE, PRIO_TIMER


@dataclass(slots=True, eq=False)
class ProgRun:
    prog: Program
    remaining_deps: dict[str, int]
    children: dict[str, list[str]]
    node_state: dict[str, str]
    hints_at: dict[str, list]
    cancels_at: dict[str, list[str]]
    calls: dict[str, CallRec]
    durations: dict[str, float]
    tools: dict[str, str]
    after: dict[str, list]
    open_nodes: int
    end: float = -1.0
    service: float = 0.0  # attained service: compute seconds of its finished calls
    path_in: dict = field(default_factory=dict)   # node -> attained service on the path into it
    path_out: dict = field(default_factory=dict)  # node -> ... out of it
    tool_wait: dict = field(default_factory=dict)  # running tool node -> (start, predicted wait or None)


class ProgramsMixin:
    """Program start, node ready and done, cancel propagation, and the tool-wait KV rule applied
    (`core/kvwait.py`, shared with the live planner: the simulator is its `KvWaitMechanism`)."""

    def _program_start(self, prog: Program):
        children = children_of(prog)
        handoffs, hinted = handoff_calls(prog), hinted_calls(prog)
        calls = {}
        for n in prog.nodes:
            if n.kind != "call":
                continue
            rec = CallRec(prog.program, n.id, n.model, n.context_tokens, n.output_tokens, n.requested_tokens,
                          prog.tenant, prog.slo,
                          n.id in handoffs, n.id in hinted, pages=self._pages_for(prog.program, n.id, n.model))
            calls[n.id] = rec
            self.calls.append(rec)
        hints_at: dict[str, list] = {}
        for h in prog.hints:
            hints_at.setdefault(h.issued_at, []).append(h)
        cancels_at: dict[str, list[str]] = {}
        for c in prog.cancel:
            cancels_at.setdefault(c.at_after, []).append(c.node)
        pr = ProgRun(prog, {n.id: len(n.after) for n in prog.nodes}, children, {n.id: "pending" for n in prog.nodes},
                     hints_at, cancels_at, calls, {n.id: n.duration for n in prog.nodes},
                     {n.id: n.tool or "tool" for n in prog.nodes if n.kind == "tool"}, {n.id: n.after for n in prog.nodes},
                     len(prog.nodes))
        self.programs[prog.program] = pr
        self.kv_of_program[prog.program] = set()
        self._apply(self._hook("on_program_start", prog))
        return [(self.now, PRIO_NODE, self._node_ready, (pr, n.id)) for n in prog.nodes if not n.after]

    def _pages_for(self, program: str, node: str, model: str) -> tuple[int, ...]:
        moe = self.catalog.by_name[model].moe
        if moe is None:
            return ()
        rng = np.random.default_rng([self.seed, zlib.crc32(f"{program}/{node}".encode())])
        u = rng.random(moe.pages)
        return tuple(int(i) for i in np.nonzero(u < page_touch_probs(moe))[0])

    def _node_ready(self, pr: ProgRun, nid: str):
        if pr.node_state[nid] != "pending":
            return None
        pr.node_state[nid] = "running"
        pr.path_in[nid] = max((pr.path_out.get(a, 0.0) for a in pr.after[nid]), default=0.0)
        if nid in pr.calls:
            pr.calls[nid].path_service = pr.path_in[nid]
        else:  # a tool wait
            self._apply(self._hook("on_tool_start", pr.prog, nid, pr.tools[nid]))
        hints = pr.hints_at.get(nid)
        if hints:
            self._apply(self._hook("on_hints", pr.prog, hints))
        if nid not in pr.calls:
            # after the hints: a lease they make for this program's KV keeps it (`Policy.holds_kv`),
            # as in the service, where the runtime's leases come before its tool_started
            self._tool_wait_kv(pr, nid)
            return [(self.now + pr.durations[nid], PRIO_NODE, self._node_done, (pr, nid))]
        return self._call_arrive(pr.calls[nid])

    def _node_done(self, pr: ProgRun, nid: str):
        if pr.node_state[nid] != "running":
            return None
        pr.node_state[nid] = "done"
        pr.open_nodes -= 1
        call = pr.calls.get(nid)
        svc = call.end - call.start if call is not None and call.end >= 0 and call.start >= 0 else 0.0
        pr.service += svc
        if svc:
            self.tenant_service[pr.prog.tenant] += svc
        # a call's path service includes its failed attempts (`_call_failed`), as the live planner's does
        pr.path_out[nid] = (call.path_service if call is not None else pr.path_in.get(nid, 0.0)) + svc
        if call is None:
            self._tool_end_kv(pr, nid)
            self._apply(self._hook("on_tool_end", pr.prog, nid, pr.tools[nid], pr.durations[nid]))
        events = []
        for victim in pr.cancels_at.get(nid, ()):
            events += self._cancel_from(pr, victim)
        for child in pr.children.get(nid, ()):
            pr.remaining_deps[child] -= 1
            if pr.remaining_deps[child] == 0 and pr.node_state[child] == "pending":
                events.append((self.now, PRIO_NODE, self._node_ready, (pr, child)))
        self._maybe_finish_program(pr)
        return events

    def _cancel_from(self, pr: ProgRun, root: str) -> list:
        events = []
        for nid in descendants(pr.prog, root):
            st = pr.node_state[nid]
            if st in ("done", "cancelled"):
                continue
            pr.node_state[nid] = "cancelled"
            pr.open_nodes -= 1
            if nid in pr.calls:
                events += self._cancel_call(pr.calls[nid])
        return events

    def _maybe_finish_program(self, pr: ProgRun):
        if pr.open_nodes > 0 or pr.end >= 0:
            return
        pr.end = self.now
        self._open_programs -= 1
        if self.queue == "auto":
            self.sizes.observe(pr.service, self.now)
        for kvk in sorted(self.kv_of_program.get(pr.prog.program, ())):
            self.kvw.outcome(kvk, False)
        for kvk in sorted(self.kv_of_program.pop(pr.prog.program, ())):
            self._drop_everywhere(kvk)
        self._apply(self._hook("on_program_end", pr.prog))
        self._retry_waiting()

    # ---- tool waits: what happens to the program's KV (`core/kvwait.py`) ------------------------
    # The simulator as a `KvWaitMechanism`: a program is its `ProgRun`, a tool wait its tool node.

    def _tool_wait_kv(self, pr: ProgRun, nid: str) -> None:
        pr.tool_wait[nid] = (self.now, kvwait.tool_started(self, pr, nid, pr.tools[nid], self.now))

    def _tool_end_kv(self, pr: ProgRun, nid: str) -> None:
        start, predicted = pr.tool_wait.pop(nid, (self.now, None))
        # another of its tools still running keeps its KV suspended
        kvwait.tool_ended(self, pr, pr.tools[nid], self.now - start, predicted, bool(pr.tool_wait))

    def kv_copies(self, pr: ProgRun) -> list[GpuCopy]:
        """By KV key, then GPU group."""
        return [c for kvk in sorted(self.kv_of_program.get(pr.prog.program, ()))
                for g in sorted(self.tiers.groups_of.get(kvk, ()))
                if not (c := self.tiers.gpu[(kvk, g)]).pins and c.ready]

    def kv_in_hbm(self, pr: ProgRun) -> list[GpuCopy]:
        return [self.tiers.gpu[(kvk, g)] for kvk in sorted(self.kv_of_program.get(pr.prog.program, ()))
                for g in sorted(self.tiers.groups_of.get(kvk, ()))]

    def kv_program_busy(self, pr: ProgRun) -> bool:
        return any(c.state in ("waiting", "loading", "queued", "running") for c in pr.calls.values())

    def kv_wait_goes_on(self, pr: ProgRun, nid: str, kind: str) -> tuple[str, float] | None:
        """A recheck acts while the tool's wait is on the books (a cancelled tool node's stays); a
        swap-in only while the tool node runs."""
        on = nid in pr.tool_wait if kind == kvwait.RECHECK else pr.node_state.get(nid) == "running"
        return (pr.tools[nid], pr.tool_wait[nid][0]) if on else None

    def kv_swap_out(self, copy: GpuCopy) -> None:
        self._evict(copy, "host", weight=BACKGROUND_SHARE)

    def kv_drop(self, copy: GpuCopy) -> None:
        self._evict(copy, "none")

    def kv_swap_in(self, kvk, group) -> None:
        self._prefetch(kvk, group, background=True)

    def kv_swap_in_once_written(self, pr: ProgRun, nid: str, kvk, group, hc) -> None:
        hc.waiters.append(lambda now: kvwait.swap_back(self, pr, nid, kvk, group))

    def kv_set_timer(self, at: float, kind: str, pr: ProgRun, nid: str, kvk, group) -> None:
        """On the event heap; a recheck judges the very copy it was set for (not a later one of the
        same KV and group)."""
        copy = self.tiers.gpu[(kvk, group)] if kind == kvwait.RECHECK else None
        self.push(at, PRIO_TIMER, self._kv_timer_due, (kind, pr, nid, kvk, group, copy))

    def _kv_timer_due(self, kind: str, pr: ProgRun, nid: str, kvk, group, copy):
        if copy is None or self.tiers.gpu.get((kvk, group)) is copy:
            kvwait.timer_due(self, kind, pr, nid, kvk, group)
        return None

    def kv_on_action(self, rule: str, new: bool) -> None:
        pass  # the rule counts its actions (`ToolWaitKV.actions`); the report takes them from there

    def kv_end_suspension(self, copy: GpuCopy) -> None:
        self._end_suspension(copy)

    def _keep_kv(self, kvk) -> None:
        """A call came back to this KV while a tool-wait swap-out still writes it to host DRAM:
        where the room it freed is still free, the move stops and its source, which never left
        HBM, is ready again (the live planner does the same with its open ops)."""
        for n in self.cluster.nodes:
            hc = self.tiers.host.get((kvk, n.name))
            if hc is None or hc.source is None:
                continue
            token, src = hc.source
            if (kvk, src.group) in self.tiers.gpu or not self.tiers.alloc_gpu(src.group, src.per_gpu):
                continue
            self.cancel_transfer(token)
            hc.source = None
            self.tiers.add_gpu_copy(GpuCopy(kvk, src.group, src.per_gpu, True, src.created, self.now, used=src.used))
            self._remove_host(hc)  # whoever waited for it being written stops waiting
            self.recorder.dirty = True
