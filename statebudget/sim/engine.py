"""The discrete-event simulator: closed-loop replay of a v1 trace on the physical model of
DESIGN.md §3, under one policy.

The loop is ten lines: pop `(time, priority, seq, handler, args)`, set the clock, run the handler,
push the events it returns. Ties break by priority then sequence, so a seed gives one history.

A call's life (DESIGN.md §4 names in brackets):

    node ready ─▶ arrive ─▶ place (policy) ─▶ admit: pin what is resident, evict (policy order),
    allocate, start loads ─▶ [ready] when weights, expert pages and the program's KV are on the
    group ─▶ compute queue ─▶ [start] prefill ─▶ [first_token] decode ─▶ [end]: KV grows, pins go

Policies return decisions (`place`, eviction order, demotion tier, prefetch/demote ops); only this
module moves bytes or touches the books (`Tiers`), and it checks the books as it goes.
"""

from __future__ import annotations

import heapq
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.state import expert_key, kv_key, weights_key
from ..models.trace import Program, Trace, ttft_bound
from ..core.programs import ADMIT_STARVE_S, ProgramSizes, queue_key, tenant_excess
from ..core.toolwait import BACKGROUND_SHARE, ToolWaitKV
from ..core.view import ResidencyView
from ..core.costs import CostModel, page_touch_probs
from ..traces.graph import children_of, descendants, handoff_calls, hinted_calls
from .flows import FairShare
from ..core.books import GpuCopy, HostCopy, Tiers
from ..core.decisions import Cancel, Demote, Promote, PromoteHost, apply

PRIO_FLOW, PRIO_TIMER, PRIO_NODE, PRIO_PROGRAM, PRIO_TICK, PRIO_QUEUE = range(6)


@dataclass(slots=True, eq=False)
class CallRec:
    program: str
    node: str
    model: str
    context_tokens: int
    output_tokens: int
    tenant: str
    slo: str
    handoff: bool
    hinted: bool
    pages: tuple[int, ...] = ()
    group: tuple[int, ...] | None = None
    state: str = "pending"  # pending waiting loading queued running done cancelled unplaceable
    arrive: float = -1.0
    ready: float = -1.0
    start: float = -1.0
    first_token: float = -1.0
    end: float = -1.0
    pins: list = field(default_factory=list)
    waiting_on: int = 0
    kv_reused_tokens: int = 0
    flow: int | None = None
    path_service: float = 0.0  # attained service along the DAG path that leads to this call
    prefilling: bool = False   # holds a prefill slot on its GPUs
    attempt: int = 0           # retries after a failed attempt (`call_failure_rate`) count up
    seq: int = 0               # when it joined the list it waits in (admission or compute): FCFS's order


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


@dataclass
class SimResult:
    calls: list[CallRec]
    programs: dict[str, ProgRun]
    bytes_by_pair: Counter
    bytes_by_link: dict[str, float]
    wasted_bytes: float
    warm_tax: float
    hbm_samples: list[tuple[float, float, float, float]]  # t, weights, experts, kv bytes in HBM
    decision_ms: list[float]
    events: int
    stale_events: int
    sim_end: float
    hbm_total: float
    kv_actions: Counter = field(default_factory=Counter)
    kv_hbm_byte_s: float = 0.0
    recomputed_tokens: int = 0
    ttl_errors: list = field(default_factory=list)
    failed_attempts: int = 0      # call attempts that failed (`call_failure_rate`) and were retried
    failed_service_s: float = 0.0  # compute seconds those attempts had run: lost, yet attained service
    queue_switches: list = field(default_factory=list)  # `auto`'s switches (`ProgramSizes.changes`)


class Transfer:
    """The flows that move one copy; cancelling it stops them, including those not yet started.
    `weight` is theirs on the links (below 1: a background transfer), also for those not yet started.
    `moving`: bytes are still on their way over a link (not a recompute, not only a wake-up left)."""
    __slots__ = ("fids", "cancelled", "weight", "moving")

    def __init__(self, weight: float = 1.0, moving: bool = True):
        self.fids: list[int] = []
        self.cancelled = False
        self.weight = weight
        self.moving = moving


class _Barrier:
    """Runs `fn` once `n` things have finished."""
    __slots__ = ("n", "fn")

    def __init__(self, n, fn):
        self.n, self.fn = n, fn

    def hit(self, now):
        self.n -= 1
        return self.fn(now) if self.n == 0 else None


class Simulator(ResidencyView):
    def __init__(self, cluster: Cluster, catalog: Catalog, trace: Trace, policy, cost: CostModel | None = None,
                 seed: int = 0, check_invariants: bool = False, max_batch: int = 32, sample_dt: float = 15.0,
                 queue: str = "fcfs", kv_rule: str | None = None, prefill_slots: int | None = None,
                 admit_starve_s: float | None = ADMIT_STARVE_S, call_failure_rate: float = 0.0,
                 retry_keeps_service: bool = True):
        self.cluster, self.catalog, self.trace, self.policy = cluster, catalog, trace, policy
        self.cost = cost or CostModel(cluster, catalog)
        self.seed, self.check_invariants, self.max_batch, self.sample_dt = seed, check_invariants, max_batch, sample_dt
        self.queue = queue
        self.sizes = ProgramSizes()  # the finished programs' service, for `auto`
        self._seq = 0  # counts the calls that joined a waiting list (`CallRec.seq`)
        # The chance that a call attempt fails while it runs (an engine error, a preempted or lost
        # worker: seed 003 §16, §26), at a uniform point of its uncontended run, drawn per (program,
        # node, attempt) from the seed. Its KV on that group is lost; the call is retried at once
        # and its program keeps the service the failed attempt attained.
        if not 0.0 <= call_failure_rate < 1.0:
            raise ValueError(f"call_failure_rate must be in [0, 1), got {call_failure_rate}")
        self.call_failure_rate = call_failure_rate
        # False only for the ablation (benchmarks/bench_failures.py): a retry as a new program id
        # would have it, starting again from no attained service.
        self.retry_keeps_service = retry_keeps_service
        self.failed_attempts, self.failed_service_s = 0, 0.0
        # Prefills a GPU runs at once (None: any number, sharing its FLOP/s). With a limit, calls
        # queue for compute and the queue discipline decides who goes first (vLLM's token budget
        # per step serialises prefills in the same way).
        self.prefill_slots = prefill_slots
        self.kv_rule = kv_rule or getattr(policy, "kv_rule", "preserve")
        self.kvw = ToolWaitKV(self.kv_rule)  # the tool-wait KV rule, shared with the live planner
        self.kv_hbm_byte_s = 0.0
        self.recomputed_tokens = 0
        self.gpus = cluster.gpus
        self._groups: dict[int, list] = {}
        self._group_cap: dict[tuple, float] = {}
        self.tiers = Tiers(cluster)
        cap = dict(self.cost.link_bw)
        cap.update({f"gpu:{g.index}": 1.0 for g in self.gpus})
        self.flows = FairShare(cap)
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self.programs: dict[str, ProgRun] = {}
        self.calls: list[CallRec] = []
        self.waiting: list[CallRec] = []  # admitted nowhere yet, FCFS
        # The oldest call that has waited `admit_starve_s` for HBM holds its GPUs: no other call
        # is admitted there and nothing is prefetched there until it is in (None: no reservation).
        self.admit_starve_s = admit_starve_s
        self.reserved: CallRec | None = None
        self._reserve_deadline = 0.0  # backfill on its GPUs must end by then
        self.active: dict[int, CallRec] = {}  # admitted calls not yet finished or cancelled
        self.queued: list[CallRec] = []   # ready, waiting for a compute slot
        self.running_on = [0] * len(self.gpus)
        self.prefilling = [0] * len(self.gpus)
        self._settle_pending = self._settling = False
        self.tenant_service: Counter = Counter()  # compute seconds given to each tenant's calls
        self.running_models: Counter = Counter()  # (model, group) -> running calls
        self.kv_tokens: dict[tuple, int] = {}     # latest KV length per (program, model)
        self.kv_of_program: dict[str, set] = {}
        self.last_use: dict[str, float] = {}      # model -> last call arrival
        self.bytes_by_pair: Counter = Counter()
        self.wasted_bytes = 0.0
        self.decision_ms: list[float] = []
        self.events = 0
        self.stale_events = 0
        self._dirty = True
        self._wt_value = 0.0
        self._wt_integral = 0.0
        self._wt_last = 0.0
        self.hbm_samples: list = []
        self._last_sample = -1e18
        self._open_programs = 0
        from ..policies.base import Policy as _Base
        overridden = {name for name in dir(_Base)
                      if name.startswith("on_") and getattr(type(policy), name, None) is not getattr(_Base, name)}
        if "on_hint" in overridden:
            overridden.add("on_hints")  # the base on_hints hands each hint to on_hint
        self._hooks = {name: getattr(policy, name) for name in overridden}
        self.stock_model_store(preload=True)

    # ---- set-up ---------------------------------------------------------------------------------
    # ---- the loop -------------------------------------------------------------------------------
    def push(self, t, prio, fn, args=()):
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, fn, args))

    def _push_all(self, events):
        """Schedule events `(time, priority, handler, args)`."""
        if events:
            for t, prio, fn, args in events:
                self._seq += 1
                heapq.heappush(self._heap, (t, prio, self._seq, fn, args))

    def run(self, progress=None) -> SimResult:
        for prog in sorted(self.trace.programs, key=lambda p: (p.start, p.program)):
            self.push(prog.start, PRIO_PROGRAM, self._program_start, (prog,))
        self._open_programs = len(self.trace.programs)
        tick = getattr(self.policy, "tick_s", None)
        if tick:
            self.push(0.0, PRIO_TICK, self._tick, (tick,))
        heap, pop = self._heap, heapq.heappop
        next_report = 0.0
        end = None  # when the last program finished; later events only finish transfers
        while heap or self.waiting:
            if not heap:
                self._push_all(self._unstick(force=True))
                continue
            t, _, _, fn, args = pop(heap)
            if t > self.now:
                # HBM metrics are piecewise constant: computed once per instant, from the state
                # all events at the previous instant left behind.
                if self._dirty:
                    self._refresh_hbm_metrics()
                if end is None:
                    self._wt_integral += self._wt_value * (t - self.now)
                self.now = t
            self.events += 1
            out = fn(*args)
            if out:
                self._push_all(out)
            if self.check_invariants and self._dirty:
                self.tiers.check()
            if end is None and self._open_programs == 0:
                end = self.now
            if progress is not None and t >= next_report:
                progress(t)
                next_report = t + 60.0
        if self.check_invariants:
            self.tiers.check()
        return SimResult(
            calls=self.calls, programs=self.programs, bytes_by_pair=self.bytes_by_pair,
            bytes_by_link={k: v for k, v in sorted(self.flows.work_done.items()) if not k.startswith("gpu:")},
            wasted_bytes=self.wasted_bytes, warm_tax=self._wt_integral / end if end else 0.0,
            hbm_samples=self.hbm_samples, decision_ms=self.decision_ms, events=self.events,
            stale_events=self.stale_events, sim_end=end or 0.0,
            hbm_total=sum(self.tiers.hbm_cap), kv_actions=self.kvw.actions, kv_hbm_byte_s=self.kv_hbm_byte_s,
            recomputed_tokens=self.recomputed_tokens, ttl_errors=self.kvw.ttl_errors,
            failed_attempts=self.failed_attempts, failed_service_s=self.failed_service_s,
            queue_switches=self.sizes.changes)

    def _refresh_hbm_metrics(self):
        self._dirty = False
        idle = w = e = kv = 0.0
        running = self.running_models
        for c in self.tiers.gpu.values():
            kind = c.key[0]
            nb = c.per_gpu * len(c.group)
            if kind == "kv":
                kv += nb
                continue
            if kind == "w":
                w += nb
            else:
                e += nb
            if not running.get((c.key[1], c.group)):
                idle += nb
        self._wt_value = idle / sum(self.tiers.hbm_cap)
        if self.now - self._last_sample >= self.sample_dt:
            self._last_sample = self.now
            self.hbm_samples.append((self.now, w, e, kv))

    def _hook(self, name: str, *args):
        """A policy hook, timed as a decision; hooks the policy does not override cost nothing."""
        fn = self._hooks.get(name)
        return self._decide(fn, *args) if fn is not None else None

    def _decide(self, fn, *args):
        """Every policy call goes through here: it is timed as one decision."""
        t0 = time.perf_counter()
        out = fn(self, *args)
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    def _tick(self, period):
        if self._open_programs == 0:
            return None
        if not self._heap:
            self._push_all(self._unstick())
        self._apply(self._hook("on_tick"))
        return [(self.now + period, PRIO_TICK, self._tick, (period,))]

    # ---- programs and nodes ------------------------------------------------------------------
    def _program_start(self, prog: Program):
        children = children_of(prog)
        handoffs, hinted = handoff_calls(prog), hinted_calls(prog)
        calls = {}
        for n in prog.nodes:
            if n.kind != "call":
                continue
            rec = CallRec(prog.program, n.id, n.model, n.context_tokens, n.output_tokens, prog.tenant, prog.slo,
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

    # ---- calls ----------------------------------------------------------------------------------
    def _call_arrive(self, c: CallRec):
        c.arrive = self.now
        c.state = "waiting"
        self.kvw.outcome(kv_key(c.program, c.model), True)
        self._keep_kv(kv_key(c.program, c.model))
        self._apply(self._hook("on_call_arrive", c))
        c.group = self._decide(self.policy.place, c)
        self.last_use[c.model] = self.now
        if c.group is None or not self.could_ever_fit(c, c.group):
            return self._unplaceable(c)
        self._reserve()
        if not self._admit(c):
            self._join(self.waiting, c)
        return None

    def _reserve(self) -> None:
        """Keep `reserved` the oldest call that has waited `admit_starve_s` for admission."""
        if self.reserved is not None and self.reserved.state == "waiting":
            return
        self.reserved = None
        if self.admit_starve_s is not None and self.waiting:
            old = min(self.waiting, key=lambda w: (w.arrive, w.program, w.node))
            if self.now - old.arrive >= self.admit_starve_s:
                self.reserved = old
                # Backfill must end before the calls there now should: fixed once, so that a queue
                # of calls not yet started cannot push it forward with the clock.
                self._reserve_deadline = self._drain_end(old.group)

    def _est_end(self, c: CallRec, new_per_gpu: float = 0.0) -> float:
        """When a call should end, by the cost model's uncontended load (`new_per_gpu` bytes from
        the slowest tier, NVMe), prefill and decode."""
        m = self.catalog.by_name[c.model]
        g0 = self.gpus[c.group[0]]
        run = self.cost.prefill_s(m, max(0, c.context_tokens - c.kv_reused_tokens), c.group) + \
            self.cost.decode_s(m, c.output_tokens, c.context_tokens, c.group) + \
            self.cost.transfer_s(new_per_gpu, f"nvme:{g0.node}", f"gpu:{g0.index}")
        return (c.start if c.state == "running" else self.now) + run

    def _drain_end(self, group) -> float:
        """When the calls holding room on `group` should all have ended."""
        gs = set(group)
        return max((self._est_end(a) for a in self.active.values() if not gs.isdisjoint(a.group)), default=self.now)

    def _held_for_another(self, group) -> bool:
        r = self.reserved
        return r is not None and r.state == "waiting" and not set(r.group).isdisjoint(group)

    def _unplaceable(self, c: CallRec):
        c.state = "unplaceable"
        pr = self.programs[c.program]
        pr.node_state[c.node] = "cancelled"
        pr.open_nodes -= 1
        events = []
        for child in pr.children.get(c.node, ()):
            events += self._cancel_from(pr, child)
        self._maybe_finish_program(pr)
        return events

    def call_need(self, c: CallRec, group) -> tuple[list, float, float]:
        """(state keys the call needs on `group`, per-GPU bytes of the new copies, per-GPU bytes of
        the call's own new KV)."""
        m = self.catalog.by_name[c.model]
        tp = len(group)
        keys = [weights_key(m.name)] + [expert_key(m.name, p) for p in c.pages]
        kvk = kv_key(c.program, c.model)
        T = self.kv_tokens.get(kvk, 0)
        if T > 0:
            keys.append(kvk)
        new = sum(self.size_of(k) for k in keys if (k, group) not in self.tiers.gpu) / tp
        private = max(0, c.context_tokens + c.output_tokens - T) * m.kv_bytes_per_token / tp
        return keys, new, private

    def call_footprint(self, c: CallRec) -> float:
        """Bytes the call needs in HBM at once: weights, its expert pages, its program's KV."""
        m = self.catalog.by_name[c.model]
        pages = len(c.pages) * (m.moe.page_bytes if m.moe else 0.0)
        kv = max(self.kv_tokens.get(kv_key(c.program, c.model), 0), c.context_tokens + c.output_tokens)
        return m.dense_bytes + pages + kv * m.kv_bytes_per_token

    def group_capacity(self, group) -> float:
        """HBM bytes of the smallest GPU of a group (cached)."""
        cap = self._group_cap.get(group)
        if cap is None:
            cap = self._group_cap[group] = min(self.tiers.hbm_cap[i] for i in group)
        return cap

    def could_ever_fit(self, c: CallRec, group, footprint: float | None = None) -> bool:
        """Whether the call's weights, pages and KV fit an empty `group` at all."""
        need = self.call_footprint(c) if footprint is None else footprint
        return need / len(group) <= self.group_capacity(group)

    def _admit(self, c: CallRec) -> bool:
        group = c.group
        held = c is not self.reserved and self._held_for_another(group)
        keys, new, private = self.call_need(c, group)
        if held and self._est_end(c, new) > self._reserve_deadline:
            return False  # on held GPUs only a call that ends before the drain goes in (backfill)
        victims = self._victims_for_room(group, keys, new, private)
        if victims is None or (held and victims):
            return False
        drains = []
        for v in victims:
            if not v.ready:
                self.cancel_load(v)
                continue
            drains += self._evict(v, self.policy.demote_tier(self, v))
        c.state = "loading"
        loads = []
        for key in keys:
            copy = self.tiers.gpu.get((key, group))
            if copy is None:
                copy = self._new_gpu_copy(key, group, prefetch=False)
                loads.append(copy)
            copy.pins += 1
            c.pins.append(copy)
            self._end_suspension(copy)  # another thread's call uses it: no longer suspended
            if not copy.ready:
                c.waiting_on += 1
                copy.waiters.append(c)
                self._foreground(copy)  # a call waits for it now: full weight on the link
        self.tiers.alloc_gpu(group, private)
        self.tiers.private[id(c)] = (group, private)
        self.active[id(c)] = c
        kvk = kv_key(c.program, c.model)
        c.kv_reused_tokens = self.kv_tokens.get(kvk, 0)
        self._dirty = True
        self._apply(self._hook("on_call_admitted", c))
        events = self._after(drains, lambda now: self._start_loads(loads))
        self._push_all(events)
        if c.waiting_on == 0:
            self._push_all(self._on_ready(c))
        return True

    def _victims_for_room(self, group, keys, new: float, private: float) -> list | None:
        """The copies to evict or cancel so that a call's need (`call_need`) fits on `group`, None
        if it does not fit now: the one admission rule of `_admit` and `has_room_now`."""
        return self.plan_eviction(group, new + private, protect={(k, group) for k in keys}, cancel=self._cancel_rule())

    def _cancel_rule(self):
        """Which loads a call that needs room may cancel (`plan_eviction`), under a policy whose
        speculation yields: promoted without a lease, no call waiting, bytes still moving over a
        link. Not one still waiting for the demotions that make its room (no transfer yet: that
        room is not free until their bytes are out), not a recompute (compute, not a link), and not
        one whose bytes are all in (only its wake-up is left). A tool-wait swap-in is such a load
        too; its host copy stays."""
        if not self.policy.speculation_yields:
            return None
        return lambda c: (c.from_prefetch and c.lease is None and not c.waiters and c.transfer is not None
                          and c.transfer.moving)

    def _foreground(self, copy: GpuCopy) -> None:
        """A background load (a tool-wait swap-in, speculation) that a call or a lease now needs
        goes on at full weight on its links."""
        if not copy.background:
            return
        copy.background = False
        if copy.transfer is not None:
            copy.transfer.weight = 1.0
            for fid in copy.transfer.fids:
                self._push_all(self._flow_events(self.flows.reweight(self.now, fid, 1.0)))

    def _new_gpu_copy(self, key, group, prefetch: bool) -> GpuCopy:
        per_gpu = self.size_of(key) / len(group)
        ok = self.tiers.alloc_gpu(group, per_gpu)
        assert ok, "allocation planned by plan_eviction must succeed"
        copy = GpuCopy(key, group, per_gpu, False, self.now, self.now, from_prefetch=prefetch)
        self.tiers.add_gpu_copy(copy)
        if key[0] == "kv":
            self.kv_of_program[key[1]].add(key)
        return copy

    def _after(self, drains: list[HostCopy], fn):
        """Run `fn(now)` once the given host copies are written (now if none): HBM that a demotion
        frees is not overwritten before its bytes are out."""
        if not drains:
            return fn(self.now)
        barrier = _Barrier(len(drains), fn)
        for hc in drains:
            hc.waiters.append(barrier.hit)
        return None

    def _start_loads(self, loads: list[GpuCopy]):
        events = []
        for copy in loads:
            events += self._load_copy(copy)
        return events

    def _load_copy(self, copy: GpuCopy) -> list:
        if copy.transfer is not None and copy.transfer.cancelled:
            return []
        key, group = copy.key, copy.group
        src = self.best_source(key, group)
        kind = src.split(":", 1)[0]
        # A background swap-in yields the link; a recompute batches with its model's calls at full weight.
        copy.transfer = token = Transfer(BACKGROUND_SHARE if copy.background and kind != "none" else 1.0,
                                         moving=kind != "none")
        if kind == "none":  # KV recompute: a prefill of the tokens it held, on the group
            m = self.catalog.by_name[key[2]]
            self.recomputed_tokens += self.kv_tokens.get(key, 0)
            amount = self.cost.prefill_s(m, self.kv_tokens.get(key, 0), group)
            return self.flows_add(amount, tuple(f"gpu:{i}" for i in group), lambda now: self._copy_ready(copy), key[2],
                                  token=token)
        if kind == "host":
            self.tiers.host[(key, src.split(":", 1)[1])].last_use = self.now
        delay = self.cost.reconfig_s(group, kind) if key[0] == "w" else 0.0
        src_gpu_copy = None
        if kind == "gpu":
            src_group = next(g for g in sorted(self.tiers.groups_of[key]) if g[0] == int(src.split(":")[1]))
            src_gpu_copy = self.tiers.gpu[(key, src_group)]
            src_gpu_copy.pins += 1

        copy.src_copy = src_gpu_copy

        def done(now):
            token.moving = False  # every byte is in; at most a wake-up is left
            if src_gpu_copy is not None:  # a KV move: the old copy goes once the new one is whole
                copy.src_copy = None
                src_gpu_copy.pins -= 1
                if src_gpu_copy.pins == 0 and (key, src_gpu_copy.group) in self.tiers.gpu:
                    self._drop_gpu_copy(src_gpu_copy)
            if delay > 0:
                return [(now + delay, PRIO_TIMER, self._copy_ready, (copy,))]
            return self._copy_ready(copy)

        barrier = _Barrier(len(group), done)
        events = []
        tier_pair = f"{kind}->gpu"
        for i in group:
            path = self.cost.path(src, f"gpu:{i}")
            events += self.flows_add(copy.per_gpu, path, barrier.hit, None, latency=self.cost.latency_s(src),
                                     tag=tier_pair, token=token)
        return events

    def flows_add(self, amount, resources, on_done, share_key, latency: float = 0.0, tag=None, token=None) -> list:
        """Start a flow now, or after `latency` (a transfer's fixed set-up time). `tag` names the
        tier pair its bytes count under; `token` lets the owner cancel it, and its weight below 1
        makes it a background flow (`flows.py`)."""
        if latency > 0:
            return [(self.now + latency, PRIO_TIMER, self._start_flow, (amount, resources, on_done, share_key, tag, token))]
        return self._start_flow(amount, resources, on_done, share_key, tag, token)

    def _start_flow(self, amount, resources, on_done, share_key, tag=None, token=None):
        weight = 1.0
        if token is not None:
            if token.cancelled:
                return None
            token.fids.append(self.flows._next)
            weight = token.weight
        return self._flow_events(self.flows.add(self.now, amount, resources, on_done, share_key, tag, weight))

    def _flow_events(self, evs) -> list:
        """The flow table's completion estimates `(eta, fid, version)` as events to schedule."""
        return [(t, PRIO_FLOW, self._flow_done, (fid, v)) for t, fid, v in evs]

    def _flow_done(self, fid, version):
        events, f = self.flows.finish(self.now, fid, version)
        out = self._flow_events(events)
        if f is None:
            self.stale_events += 1  # a completion superseded by a re-pricing of its flow
        else:
            if f.tag is not None:
                self.bytes_by_pair[f.tag] += f.done
            r = f.on_done(self.now)
            if r:
                out += r
        return out

    def cancel_transfer(self, token: Transfer) -> float:
        """Stop a transfer; returns the bytes its flows had moved."""
        token.cancelled = True
        done = 0.0
        for fid in token.fids:
            events, f = self.flows.cancel(self.now, fid)
            if f is not None and f.tag is not None:
                done += f.done
                self.bytes_by_pair[f.tag] += f.done
            self._push_all(self._flow_events(events))
        return done

    def cancel_load(self, copy: GpuCopy) -> bool:
        """Abandon a copy still being written into HBM that no call waits for: its flows stop, its
        space is freed, and it never becomes ready (half-moved state is never usable)."""
        if copy.ready or copy.pins > 0 or self.tiers.gpu.get((copy.key, copy.group)) is not copy:
            return False
        moved = self.cancel_transfer(copy.transfer) if copy.transfer is not None else 0.0
        if copy.transfer is None:
            copy.transfer = Transfer()
            copy.transfer.cancelled = True  # waiting for drains: never start
        if copy.src_copy is not None:
            copy.src_copy.pins -= 1
            copy.src_copy = None
        self.wasted_bytes += moved
        self._remove_copy(copy)
        self._dirty = True
        return True

    def _copy_ready(self, copy: GpuCopy):
        if (copy.key, copy.group) not in self.tiers.gpu or self.tiers.gpu[(copy.key, copy.group)] is not copy:
            return None  # dropped while loading (its call was cancelled)
        copy.ready = True
        self._dirty = True
        if copy.lease is not None:
            self._apply(self._hook("on_copy_ready", copy))
        events = []
        waiters, copy.waiters = copy.waiters, []
        for c in waiters:
            if c.state != "loading":
                continue
            c.waiting_on -= 1
            if c.waiting_on == 0:
                events += self._on_ready(c, start=False)  # all the calls this copy completes queue first,
        events += self._start_queued()                    # then the discipline picks among them
        self._retry_waiting()  # a copy that was loading can now be evicted for a waiting call
        return events

    def _on_ready(self, c: CallRec, start: bool = True):
        c.ready = self.now
        c.state = "queued"
        for copy in c.pins:
            copy.used = True
            copy.last_use = self.now
        self._join(self.queued, c)
        return self._start_queued() if start else []

    def _join(self, waiting: list, c: CallRec) -> None:
        """`c` joins a list it waits in (admission or compute), last: FCFS's order (`CallRec.seq`)."""
        self._seq += 1
        c.seq = self._seq
        waiting.append(c)

    def _order(self, calls: list) -> list:
        """The queue discipline (`core/programs.py`): FCFS by arrival; PLAS by the program's
        attained service, ATLAS by the attained service on the call's critical path, both with
        aging, a bounded TTFT-slack boost, the tenant's fair-share excess and starvation promotion;
        `auto` one of atlas and fcfs by the tail of the finished programs' service (`ProgramSizes`)."""
        queue = self.sizes.discipline(self.queue)
        if self.queue == "fcfs" or len(calls) < 2:
            return calls  # the lists are kept in FCFS order
        if queue == "fcfs":  # auto, after a spell of atlas: back to the order the calls joined in
            return sorted(calls, key=lambda c: c.seq)
        now, slo = self.now, self.trace.header.slo_classes
        weights = self.trace.header.tenant_weights

        def key(c):
            m = self.catalog.by_name[c.model]
            slack = c.arrive + ttft_bound(slo, c.slo) - now - \
                self.cost.prefill_s(m, max(0, c.context_tokens - c.kv_reused_tokens), c.group)
            return queue_key(queue, c.arrive, now, self.programs[c.program].service, c.path_service, slack,
                             tenant_excess(self.tenant_service, weights, c.tenant)) + (c.program, c.node)
        return sorted(calls, key=key)

    def _start_queued(self):
        if self.prefill_slots is not None and not self._settling:
            # With compute slots the discipline must see every call that is ready at this instant
            # (several copies and calls complete at one time, one event each): one settling
            # event after all of them picks.
            if self._settle_pending:
                return []
            self._settle_pending = True
            return [(self.now, PRIO_QUEUE, self._settle, ())]
        events = []
        keep = []
        slots = self.prefill_slots
        for c in self._order(self.queued):
            if all(self.running_on[i] < self.max_batch and (slots is None or self.prefilling[i] < slots)
                   for i in c.group):
                events += self._start(c)
            else:
                keep.append(c)
        self.queued = keep
        return events

    def _settle(self):
        self._settle_pending, self._settling = False, True
        try:
            return self._start_queued()
        finally:
            self._settling = False

    def _start(self, c: CallRec):
        c.start = self.now
        c.state = "running"
        for i in c.group:
            self.running_on[i] += 1
            self.prefilling[i] += 1
        c.prefilling = True
        self.running_models[(c.model, c.group)] += 1
        self._dirty = True
        m = self.catalog.by_name[c.model]
        new_tokens = max(0, c.context_tokens - c.kv_reused_tokens)
        amount = self.cost.prefill_s(m, new_tokens, c.group)
        res = tuple(f"gpu:{i}" for i in c.group)
        c.flow = self.flows._next
        events = self.flows_add(amount, res, lambda now: self._prefill_done(c), c.model)
        if self.call_failure_rate > 0.0:
            rng = np.random.default_rng([self.seed, zlib.crc32(f"fail/{c.program}/{c.node}/{c.attempt}".encode())])
            fails, at = rng.random(2)
            if fails < self.call_failure_rate:
                run = amount + self.cost.decode_s(m, c.output_tokens, c.context_tokens, c.group)
                events.append((self.now + at * run, PRIO_NODE, self._call_failed, (c, c.attempt)))
        return events

    def _call_failed(self, c: CallRec, attempt: int):
        """The attempt fails: its flows stop, its hold on its state goes, its KV on that group is
        lost (host copies survive; the retry loads one or recomputes), and the call arrives again
        as its next attempt. What it ran counts as attained service (seed 003 §16)."""
        if c.state != "running" or c.attempt != attempt:
            return None
        ran = self.now - c.start
        pr = self.programs[c.program]
        self.tenant_service[pr.prog.tenant] += ran
        if self.retry_keeps_service:
            pr.service += ran
            c.path_service += ran
        else:
            pr.service, c.path_service = 0.0, 0.0
        self.failed_attempts += 1
        self.failed_service_s += ran
        group = c.group
        events = self._stop_run(c)
        copy = self.tiers.gpu.get((kv_key(c.program, c.model), group))
        if copy is not None and copy.ready and copy.pins == 0:
            copy.used = True  # lost, not a wasted promotion
            self._remove_copy(copy)
        self._dirty = True
        self._apply(self._hook("on_call_cancelled", c))  # the attempt is over for the policy too
        c.attempt += 1
        c.state, c.ready, c.start, c.first_token, c.flow, c.kv_reused_tokens = "pending", -1.0, -1.0, -1.0, None, 0
        self._retry_waiting()  # the room it freed goes first to the calls already waiting for it
        events += self._call_arrive(c) or []
        events += self._start_queued()
        return events

    def _prefill_done(self, c: CallRec):
        if c.state != "running":
            return None
        c.first_token = self.now
        self._end_prefill(c)
        m = self.catalog.by_name[c.model]
        amount = self.cost.decode_s(m, c.output_tokens, c.context_tokens, c.group)
        c.flow = self.flows._next
        events = self.flows_add(amount, tuple(f"gpu:{i}" for i in c.group), lambda now: self._call_end(c), c.model)
        return events + (self._start_queued() if self.prefill_slots is not None else [])

    def _end_prefill(self, c: CallRec) -> None:
        if c.prefilling:
            c.prefilling = False
            for i in c.group:
                self.prefilling[i] -= 1

    def _release(self, c: CallRec, finished: bool):
        for copy in c.pins:
            copy.pins -= 1
            if finished:
                copy.last_use = self.now
        c.pins = []
        group, private = self.tiers.private.pop(id(c), (None, 0.0))
        self.active.pop(id(c), None)
        if group is not None and private > 0:
            kvk = kv_key(c.program, c.model)
            m = self.catalog.by_name[c.model]
            if finished and c.program in self.kv_of_program:
                new_tokens = c.context_tokens + c.output_tokens
                copy = self.tiers.gpu.get((kvk, group))
                target = max(new_tokens, self.kv_tokens.get(kvk, 0)) * m.kv_bytes_per_token / len(group)
                grow = target - (copy.per_gpu if copy else 0.0)
                grow = min(max(grow, 0.0), private)
                if copy is None:
                    copy = GpuCopy(kvk, group, grow, True, self.now, self.now, used=True)
                    self.tiers.add_gpu_copy(copy)
                    self.kv_of_program[c.program].add(kvk)
                else:
                    copy.per_gpu += grow
                private -= grow
                self.kv_tokens[kvk] = max(new_tokens, self.kv_tokens.get(kvk, 0))
                self._drop_stale_kv(kvk, keep=copy)
            self.tiers.free_gpu(group, private)
        if c.state == "running":
            self._end_prefill(c)
            for i in c.group:
                self.running_on[i] -= 1
            self.running_models[(c.model, c.group)] -= 1
        self._dirty = True

    def _call_end(self, c: CallRec):
        self._release(c, finished=True)
        c.end = self.now
        c.state = "done"
        pr = self.programs[c.program]
        self._apply(self._hook("on_call_end", c))
        events = self._node_done(pr, c.node) or []
        events += self._start_queued()
        self._retry_waiting()
        return events

    def _stop_run(self, c: CallRec) -> list:
        """A call stops before its end (cancelled, or its attempt failed): its flows stop, and its
        hold on its state, its prefill and its place on the GPUs go."""
        events = []
        if c.state == "running" and c.flow is not None:
            evs, _ = self.flows.cancel(self.now, c.flow)
            events += self._flow_events(evs)
        if c.state in ("loading", "queued", "running"):
            self._release(c, finished=False)
        return events

    def _cancel_call(self, c: CallRec) -> list:
        if c.state == "waiting":
            self.waiting.remove(c)
        elif c.state == "queued":
            self.queued.remove(c)
        events = self._stop_run(c)
        c.state = "cancelled"
        self._apply(self._hook("on_call_cancelled", c))
        events += self._start_queued()
        self._retry_waiting()
        return events

    def _unstick(self, force: bool = False) -> list:
        """Nothing left to happen but calls still wait for HBM: retry them, and report the first
        that still cannot be admitted as unplaceable rather than wait forever."""
        self._retry_waiting()
        idle = not self.flows.flows and not self.queued and not any(self.running_on)
        if self.waiting and (force or idle):
            c = self.waiting.pop(0)
            return self._unplaceable(c) or []
        return []

    def _retry_waiting(self):
        if not self.waiting:
            return
        while True:
            self._reserve()
            held = self.reserved
            still = []
            for c in self._order(self.waiting):
                if not self._admit(c):
                    still.append(c)
            self.waiting = still
            if held is None or held.state == "waiting" or not self.waiting:
                return
            # The starving call got in: the next one, if any, holds its GPUs, and the calls it
            # held back try again under the new reservation.

    # ---- eviction, demotion, prefetch ---------------------------------------------------------
    def _evict(self, copy: GpuCopy, to: str, weight: float = 1.0) -> list[HostCopy]:
        """Demote a copy out of HBM (`host` or `none`); returns the host copies being written,
        which must be whole before the freed HBM is written. `weight` < 1: a background copy-out."""
        if not copy.used:
            self.wasted_bytes += copy.nbytes
        key = copy.key
        node = self.gpus[copy.group[0]].node
        drains = []
        if to == "host" and (key, node) not in self.tiers.host and self._make_host_room(node, copy.nbytes):
            self.tiers.alloc_host(node, copy.nbytes)
            hc = HostCopy(key, node, copy.nbytes, False, self.now)
            self.tiers.host[(key, node)] = hc
            barrier = _Barrier(len(copy.group), lambda now: self._host_ready(hc))
            token = Transfer(weight)
            if weight < 1.0:  # a tool-wait swap-out: a call that comes back may stop it (`_keep_kv`)
                hc.source = (token, copy)
            for i in copy.group:
                self._push_all(self.flows_add(copy.per_gpu, self.cost.path(f"gpu:{i}", f"host:{node}"),
                                              barrier.hit, None, latency=self.cost.latency_s("gpu"), tag="gpu->host",
                                              token=token))
            drains.append(hc)
        self._remove_copy(copy)
        self._dirty = True
        return drains

    def _remove_copy(self, copy: GpuCopy) -> None:
        """Every HBM copy leaves through here: suspended KV stops counting its byte-seconds."""
        self._end_suspension(copy)
        self.tiers.remove_gpu_copy(copy)

    def _end_suspension(self, copy: GpuCopy) -> None:
        """A suspended KV copy stops being suspended: its byte-seconds in HBM are counted."""
        if copy.suspended_since is not None:
            self.kv_hbm_byte_s += copy.nbytes * (self.now - copy.suspended_since)
            copy.suspended_since = None

    # ---- tool waits: what happens to the program's KV (seed 003 §10-§12, §21) ------------------
    def _program_busy(self, pr: ProgRun) -> bool:
        return any(c.state in ("waiting", "loading", "queued", "running") for c in pr.calls.values())

    def _tool_wait_kv(self, pr: ProgRun, nid: str) -> None:
        tool = pr.tools[nid]
        predicted = self.kvw.started(tool)
        pr.tool_wait[nid] = (self.now, predicted)
        if self._program_busy(pr):
            return  # another thread of the program still runs: its KV is not suspended
        for kvk in sorted(self.kv_of_program.get(pr.prog.program, ())):
            copies = [self.tiers.gpu[(kvk, g)] for g in sorted(self.tiers.groups_of.get(kvk, ()))]
            copies = [c for c in copies if not c.pins and c.ready]
            if copies:
                self.kvw.suspended(kvk, tool)
            for copy in copies:
                self._suspend_kv(pr, nid, copy, predicted)

    def _suspend_kv(self, pr: ProgRun, nid: str, copy: GpuCopy, predicted: float | None) -> None:
        """Apply the tool-wait rule to one KV copy; `predicted` is the wait still expected (adaptive)."""
        act = self.kvw.decide_copy(self, pr.tools[nid], copy, predicted, pr.tool_wait[nid][0])
        if act.rule == "preserve":
            if copy.suspended_since is None:
                copy.suspended_since = self.now
            if act.recheck_at is not None:
                self.push(act.recheck_at, PRIO_TIMER, self._kv_reconsider, (pr, nid, copy))
        elif act.rule == "swap":
            self._evict(copy, "host", weight=BACKGROUND_SHARE)
            if act.swap_in_at is not None:
                self.push(act.swap_in_at, PRIO_TIMER, self._kv_back, (pr, nid, copy.key, copy.group))
        else:
            self._evict(copy, "none")

    def _kv_reconsider(self, pr: ProgRun, nid: str, copy: GpuCopy):
        """The TTL of a preserved KV ran out with the tool still running: decide again on the
        remaining wait given how long it has lasted (§12: preserve first, offload once it is long)."""
        if nid not in pr.tool_wait or copy.suspended_since is None or copy.pins or \
                self.tiers.gpu.get((copy.key, copy.group)) is not copy:
            return None
        start, _ = pr.tool_wait[nid]
        left = self.kvw.remaining(pr.tools[nid], self.now - start)
        if self._program_busy(pr):
            # Another thread's call runs (on another model: this KV stays suspended). Judge it again
            # once that call may be over, rather than hold it until the tool returns.
            self.push(self.kvw.next_check(self.now, start, left), PRIO_TIMER, self._kv_reconsider, (pr, nid, copy))
            return None
        self._suspend_kv(pr, nid, copy, left)
        return None

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
            self._dirty = True

    def _kv_back(self, pr: ProgRun, nid: str, kvk, group):
        if pr.node_state.get(nid) != "running" or kvk not in self.kv_tokens or (kvk, group) in self.tiers.gpu:
            return None
        hc = self.tiers.host.get((kvk, self.gpus[group[0]].node))
        if hc is not None and not hc.ready:  # the swap-out is still being written: swap in once it is
            hc.waiters.append(lambda now: self._kv_back(pr, nid, kvk, group))
        elif self.best_source(kvk, group).startswith("host:"):  # a swap-in, not a recompute
            self._prefetch(kvk, group, background=True)
        return None

    def _tool_end_kv(self, pr: ProgRun, nid: str) -> None:
        start, predicted = pr.tool_wait.pop(nid, (self.now, None))
        self.kvw.ended(pr.tools[nid], self.now - start, predicted)
        if pr.tool_wait:
            return  # another of its tools still runs: its KV stays suspended
        for kvk in sorted(self.kv_of_program.get(pr.prog.program, ())):
            for g in sorted(self.tiers.groups_of.get(kvk, ())):
                self._end_suspension(self.tiers.gpu[(kvk, g)])

    def _host_ready(self, hc: HostCopy):
        hc.source = None
        if self.tiers.host.get((hc.key, hc.node)) is hc:
            hc.ready = True
        events = []
        waiters, hc.waiters = hc.waiters, []
        for fn in waiters:
            events += fn(self.now) or []
        return events

    def _remove_host(self, hc: HostCopy):
        """Drop a host copy; whoever waits for it being written stops waiting."""
        self.tiers.remove_host_copy(hc)
        waiters, hc.waiters = hc.waiters, []
        for fn in waiters:
            self._push_all(fn(self.now))

    def _make_host_room(self, node: str, nbytes: float) -> bool:
        """Make room in a node's DRAM by dropping ready host copies, least recently used first
        (weights and experts stay in the NVMe store; KV goes to NVMe when it has room)."""
        free = self.tiers.host_cap[node] - self.tiers.host_used[node]
        if free >= nbytes:
            return True
        cands = sorted((hc for (k, n), hc in self.tiers.host.items() if n == node and hc.ready),
                       key=lambda hc: (hc.last_use, hc.key))
        if free + sum(hc.nbytes for hc in cands) < nbytes:
            return False
        for hc in cands:
            if free >= nbytes:
                break
            self.tiers.remove_host_copy(hc)
            free += hc.nbytes
            if hc.key[0] == "kv" and (hc.key, node) not in self.tiers.nvme and self.tiers.alloc_nvme(hc.key, node, hc.nbytes):
                self._push_all(self.flows_add(hc.nbytes, self.cost.path(f"host:{node}", f"nvme:{node}"),
                                              lambda now: None, None, latency=self.cost.latency_s("host"), tag="host->nvme"))
        return True

    def _drop_gpu_copy(self, copy: GpuCopy):
        if not copy.used:
            self.wasted_bytes += copy.nbytes
        self._remove_copy(copy)
        self._dirty = True

    def _drop_stale_kv(self, kvk, keep: GpuCopy):
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            copy = self.tiers.gpu[(kvk, g)]
            if copy is not keep and copy.pins == 0:
                if not copy.ready:
                    self.cancel_load(copy)
                else:
                    self._drop_gpu_copy(copy)
        for (k, n), hc in list(self.tiers.host.items()):
            if k == kvk:
                self._remove_host(hc)
        for (k, n) in [kn for kn in self.tiers.nvme if kn[0] == kvk]:
            self.tiers.remove_nvme(k, n)

    def _drop_everywhere(self, kvk):
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            copy = self.tiers.gpu[(kvk, g)]
            copy.used = True  # KV of a finished program is not a wasted promotion
            if not copy.ready and copy.transfer is not None:
                self.cancel_transfer(copy.transfer)
            self._remove_copy(copy)
        for (k, n), hc in list(self.tiers.host.items()):
            if k == kvk:
                self._remove_host(hc)
        for (k, n) in [kn for kn in self.tiers.nvme if kn[0] == kvk]:
            self.tiers.remove_nvme(k, n)
        self.kv_tokens.pop(kvk, None)
        self._dirty = True

    def _apply(self, decisions):
        apply(decisions, self)

    # ---- the Mechanism (core/decisions.py): a policy's decisions carried out ---------------------
    def promote(self, d: Promote) -> None:
        self._prefetch(d.key, d.group, d.lease_id)

    def promote_host(self, d: PromoteHost) -> None:
        self._prefetch_host(d.key, d.node)

    def demote(self, d: Demote) -> None:
        copy = self.tiers.gpu.get((d.key, d.group))
        if copy is not None and copy.pins == 0 and copy.ready:
            self._evict(copy, d.to)

    def cancel(self, d: Cancel) -> None:
        """Stop a load nobody waits for."""
        copy = self.tiers.gpu.get((d.key, d.group))
        if copy is not None:
            self.cancel_load(copy)

    def _prefetch(self, key, group, lease=None, background: bool = False) -> bool:
        """Bring a copy into HBM ahead of use, evicting only what the policy allows. A lease id
        rides on the copy: the policy hears when the copy is whole (`on_copy_ready`). A
        `background` load (a tool-wait swap-in) evicts nothing and yields the link (BACKGROUND_SHARE).
        Under a policy whose speculation yields (`Policy.speculation_yields`), a promote no lease
        asked for also loads in the background, and a call that needs its room may cancel it
        while its bytes are still moving (`_cancel_rule`)."""
        existing = self.tiers.gpu.get((key, group))
        if existing is not None:
            if lease is not None:
                existing.lease = (existing.lease or ()) + (lease,)
                if self.policy.speculation_yields:  # a lease's deadline rides on it now: no longer speculation
                    self._foreground(existing)
                if existing.ready:
                    self._apply(self._hook("on_copy_ready", existing))
            return False
        if key[0] == "kv" and self.kv_tokens.get(key, 0) == 0:
            return False
        per_gpu = self.size_of(key) / len(group)
        if self._held_for_another(group):
            return False
        allow = (lambda v: False) if background else (lambda v: self.policy.may_evict_for_prefetch(self, v, key))
        victims = self.plan_eviction(group, per_gpu, protect={(key, group)}, allow=allow)
        if victims is None:
            return False
        drains = []
        for v in victims:
            drains += self._evict(v, self.policy.demote_tier(self, v))
        copy = self._new_gpu_copy(key, group, prefetch=True)
        copy.background = background or (lease is None and self.policy.speculation_yields)
        if lease is not None:
            copy.lease = (lease,)
        load = self._load_drained if drains else self._load_copy
        self._push_all(self._after(drains, lambda now: load(copy)))
        return True

    def _load_drained(self, copy: GpuCopy) -> list:
        """A promote's load starts once its victims' bytes are out. Calls waiting for room look
        again: a speculative load may be cancelled only from now on (`_cancel_rule`)."""
        events = self._load_copy(copy)
        if self.policy.speculation_yields and not copy.transfer.cancelled:
            self._retry_waiting()
        return events

    def _prefetch_host(self, key, node) -> bool:
        if (key, node) in self.tiers.host or key[0] == "kv":
            return False
        nbytes = self.size_of(key)
        if self.tiers.host_cap[node] - self.tiers.host_used[node] < nbytes:
            return False
        self.tiers.alloc_host(node, nbytes)
        hc = HostCopy(key, node, nbytes, False, self.now)
        self.tiers.host[(key, node)] = hc
        self._push_all(self.flows_add(nbytes, self.cost.path(f"nvme:{node}", f"host:{node}"),
                                      lambda now: self._host_ready(hc), None, latency=self.cost.latency_s("nvme"),
                                      tag="nvme->host"))
        return True

    # ---- views for policies ---------------------------------------------------------------------
    def link_backlog(self) -> dict[str, float]:
        """Bytes still queued on each link by transfers in flight."""
        out: dict[str, float] = {}
        now = self.now
        for f in self.flows.flows.values():
            if f.tag is None:
                continue
            rem = f.remaining - f.rate * (now - f.t_last)
            if rem > 0:
                for r in f.resources:
                    out[r] = out.get(r, 0.0) + rem
        return out

    def has_room_now(self, c: CallRec, group) -> bool:
        """Whether the call could be admitted on `group` now, evicting only unpinned ready state (and
        cancelling speculative loads, as `_admit` does)."""
        return self._victims_for_room(group, *self.call_need(c, group)) is not None
