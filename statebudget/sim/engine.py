"""The discrete-event simulator: closed-loop replay of a v1 trace on the physical model of
DESIGN.md §3, under one policy.

A call's life (DESIGN.md §4 names in brackets):

    node ready ─▶ arrive ─▶ place (policy) ─▶ admit: pin what is resident, evict (policy order),
    allocate, start loads ─▶ [ready] when weights, expert pages and the program's KV are on the
    group ─▶ compute queue ─▶ [start] prefill ─▶ [first_token] decode ─▶ [end]: KV grows, pins go

Policies return decisions (`place`, eviction order, demotion tier, prefetch/demote ops); only the
simulator moves bytes or touches the books (`Tiers`), and it checks the books as it goes.

The parts: `loop.py` (clock, heap, the loop), `programs.py` (program DAGs, tool waits),
`admission.py` and `calls.py` (a call's life), `transfers.py` (the Mechanism: bytes on links),
`recorder.py` (what is measured, `SimResult`). `Simulator` joins them and is the read-only view
(`ResidencyView`) that policies receive.
"""

from __future__ import annotations

import math
import time
from collections import Counter

from ..core.books import Tiers
from ..core.costs import CostModel
from ..core.decisions import apply
from ..core.programs import ProgramSizes
from ..core.toolwait import ToolWaitKV
from ..core.view import ResidencyView
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.trace import Trace
from ..planner.overload import QueueLoad
from .admission import AdmissionMixin
from ..policies.base import Policy
from .calls import CallRec, CallsMixin
from .config import SimConfig
from .flows import FairShare
from .loop import PRIO_PROGRAM, PRIO_TICK, EventLoop
from .programs import ProgRun, ProgramsMixin
from .recorder import Recorder, SimResult
from .transfers import TransfersMixin
from .waiting import WaitingSums

__all__ = ["SimResult", "Simulator"]


class Simulator(ProgramsMixin, AdmissionMixin, CallsMixin, TransfersMixin, EventLoop, ResidencyView):
    """One run of `trace` under `policy` on `cluster`, as `config` says; `run()` returns its
    `SimResult`. Policies receive the simulator itself as their read-only view: its clock `now`,
    books `tiers`, `kv_tokens`, `running_on`, `running_models`, `last_use`, and the recorder's
    `recorder` with what is measured."""

    def __init__(self, cluster: Cluster, catalog: Catalog, trace: Trace, policy, cost: CostModel | None = None,
                 config: SimConfig = SimConfig()):
        self.cluster, self.catalog, self.trace, self.policy = cluster, catalog, trace, policy
        self.cost = cost or CostModel(cluster, catalog)
        self.seed, self.check_invariants = config.seed, config.check_invariants
        self.start = config.start  # the state at t = 0 (DESIGN.md §4), for an offline schedule to assume
        self.max_batch, self.sample_dt = config.max_batch, config.sample_dt
        self.queue = config.queue
        self.prefill_slots = config.prefill_slots
        self.admit_starve_s = config.admit_starve_s
        self.call_failure_rate = config.call_failure_rate
        self.kv_reserve = config.kv_reserve
        self.retry_keeps_service = config.retry_keeps_service
        self.kv_rule = config.kv_rule or getattr(policy, "kv_rule", "preserve")
        self.kvw = ToolWaitKV(self.kv_rule)  # the tool-wait KV rule, shared with the live planner
        self.sizes = ProgramSizes()  # the finished programs' service, for `auto`
        self.gpus = cluster.gpus
        self._groups: dict[str, list] = {}
        self._group_cap: dict[tuple, float] = {}
        self._median_pages: dict[str, int] = {}  # model -> pages its calls touch, the median
        self.tiers = Tiers(cluster)
        cap = dict(self.cost.link_bw)
        cap.update({f"gpu:{g.index}": 1.0 for g in self.gpus})
        self.flows = FairShare(cap)
        self._init_loop()
        self._joined = 0  # counts the calls that joined a waiting list (`CallRec.seq`)
        self.programs: dict[str, ProgRun] = {}
        self.calls: list[CallRec] = []
        self.waiting: list[CallRec] = []  # admitted nowhere yet, FCFS
        self.waiting_sums = WaitingSums(len(self.gpus))  # the same calls summed per group (`queue_load`)
        self.reserved: CallRec | None = None  # the starving call that holds its GPUs (`_reserve`)
        self._draining: dict[int, list] = {}  # GPU -> host copies a policy's demotion still writes out of it
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
        self.recorder = Recorder(self.tiers, self.running_models, self.sample_dt)
        if config.timeline:
            self.recorder.timeline = []
        self._open_programs = 0
        overridden = {name for name in dir(Policy)
                      if name.startswith("on_") and getattr(type(policy), name, None) is not getattr(Policy, name)}
        if "on_hint" in overridden:
            overridden.add("on_hints")  # the base on_hints hands each hint to on_hint
        self._hooks = {name: getattr(policy, name) for name in overridden}
        self.recorder.measure_from(config.warmup_s, self.flows, self.cost)  # SimConfig.warmup_s (`metrics.py`)
        self.stock_model_store(preload=config.start)  # DESIGN.md §4: cold or warm host DRAM

    def run(self, progress=None) -> SimResult:
        """Replay the trace; `progress(sim_time)` is called about once a simulated minute."""
        for prog in sorted(self.trace.programs, key=lambda p: (p.start, p.program)):
            self.push(prog.start, PRIO_PROGRAM, self._program_start, (prog,))
        self._open_programs = len(self.trace.programs)
        tick = getattr(self.policy, "tick_s", None)
        if tick:
            self.push(0.0, PRIO_TICK, self._tick, (tick,))
        replan = getattr(self.policy, "replan_s", None)
        if replan:
            self.push(0.0, PRIO_TICK, self._replan, (replan,))
        self._run_loop(progress)
        if self.check_invariants:
            self.tiers.check()
        return self.recorder.result(self.calls, self.programs, self.flows, self.kvw, self.sizes)

    def _check_books(self, dirty: bool) -> None:
        """`check_invariants`: the tiers' books when an event changed them, and the admission queue's
        kept sums (`waiting.py`) against the waiting calls summed afresh, after every event."""
        if dirty:
            self.tiers.check()
        waiting = [c for c in self.waiting if c.state == "waiting"]
        assert {id(c) for c in waiting} == set(self.waiting_sums.calls), "the queue's sums hold other calls"
        by_group: dict[tuple, tuple] = {}
        for c in waiting:
            n, run, first = by_group.get(c.group, (0, 0.0, math.inf))
            by_group[c.group] = (n + 1, run + self._queued_run(c), min(first, c.arrive))
        kept = self.queue_load()
        if kept is None:
            assert not waiting, "calls wait but the queue's sums are empty"
            return
        fresh = QueueLoad.of(len(self.gpus), by_group)
        assert kept.waiting == fresh.waiting and kept.first_s == fresh.first_s, "the queue's sums drifted"
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) for a, b in zip(kept.queued_s, fresh.queued_s))

    def _hook(self, name: str, *args):
        """A policy hook, timed as a decision; hooks the policy does not override cost nothing."""
        fn = self._hooks.get(name)
        return self._decide(fn, *args) if fn is not None else None

    def _decide(self, fn, *args):
        """Every policy call goes through here: it is timed as one decision."""
        t0 = time.perf_counter()
        out = fn(self, *args)
        self.recorder.decision_ms.append((time.perf_counter() - t0) * 1e3)
        return out

    def _apply(self, decisions):
        apply(decisions, self)

    def _replan(self, period):
        """A periodic solve off the decision path (`policies/ours.py:StateBudgetTrack`): it returns
        no decisions, and its time is the policy's to charge, not a decision's."""
        if self._open_programs == 0:
            return None
        self.policy.on_replan(self)
        return [(self.now + period, PRIO_TICK, self._replan, (period,))]

    def _tick(self, period):
        if self._open_programs == 0:
            return None
        if not self._heap:
            self._push_all(self._unstick())
        self._apply(self._hook("on_tick"))
        return [(self.now + period, PRIO_TICK, self._tick, (period,))]
