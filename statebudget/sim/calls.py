"""Calls: a call from ready to end. Once its state is on its group it queues for compute (the
queue discipline orders the queue), runs its prefill and decode as flows on its GPUs, and at its
end leaves its KV grown on the group. An attempt may fail (`SimConfig.call_failure_rate`) and is
then retried; a cancelled call lets go of everything it held."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from ..core.books import GpuCopy
from ..core.estimates import OutputEstimate
from ..core.programs import queue_key, tenant_excess
from ..models.state import kv_key
from ..models.trace import ttft_bound
from .loop import PRIO_NODE, PRIO_QUEUE

KV_CHUNK_TOKENS = 512  # `kv_reserve` paged: output tokens of KV room a running call takes at a time


@dataclass(slots=True, eq=False)
class CallRec:
    """A call as the simulator runs it. `max_tokens` is what it asked for (policies may read it);
    `output_tokens` is the trace's truth, for the execution only (decode time, the KV it leaves):
    no policy reads it, before or after the call ends (DESIGN.md §5; `output_estimate`)."""
    program: str
    node: str
    model: str
    context_tokens: int
    output_tokens: int
    max_tokens: int
    tenant: str
    slo: str
    handoff: bool
    hinted: bool
    pages: tuple[int, ...] = ()
    group: tuple[int, ...] | None = None
    state: str = "pending"  # pending waiting loading queued running done cancelled unplaceable
    arrive: float = -1.0
    admitted: float = -1.0  # when it got its HBM: of its stall, `admitted - arrive` waited for room
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
    est_run: tuple = ()        # (expected output, reused KV, group, run s) of its last plain `_est_end`
    loads_at: float = -1.0     # when its own loads could start (the drains for its room done); admission if none
    last_load: str = ""        # kind of the state it waited for last ("w", "e", "kv"; "": none)
    refused: tuple = ()        # groups whose engines refused it: its own pages could not fit there
    fits: tuple = ()           # (group, its program's KV tokens, whether it fits there at all) last asked
    kv_room_tokens: int = 0    # output tokens its KV room covers now (`kv_reserve` paged grows it)
    preempted: bool = False    # an engine preempted an attempt of it (`kv_reserve` paged)


class CallsMixin:
    """The compute side of a call: queue, start, prefill, decode, end, failure, cancel."""

    @property
    def output_estimate(self) -> OutputEstimate:
        """The per-model estimate of a call's output (`core/estimates.py`), fed at each call's end:
        what policies and the admission use before a call ends, in place of its true output."""
        est = getattr(self, "_output_estimate", None)
        if est is None:
            est = self._output_estimate = OutputEstimate()
        return est

    def expected_output(self, c: CallRec) -> float:
        return self.output_estimate.expected(c.model, c.max_tokens)

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
        self._joined += 1
        c.seq = self._joined
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
        self.recorder.dirty = True
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
        self.recorder.failed_attempts += 1
        self.recorder.failed_service_s += self.now - c.start
        return self._restart(c)

    def _restart(self, c: CallRec, then=None, later: bool = False) -> list:
        """The running call's attempt ends before its end (it failed, or its engine preempted it)
        and it arrives again as its next attempt, as `_call_failed` says. `then()` runs once its
        room is free, before any hook or waiting call can take that room. `later`: it arrives
        again as the next event, and the calls waiting for room are left for the caller to retry
        (an engine that preempts finishes its step first)."""
        ran = self.now - c.start
        pr = self.programs[c.program]
        self.tenant_service[pr.prog.tenant] += ran
        if self.retry_keeps_service:
            pr.service += ran
            c.path_service += ran
        else:
            pr.service, c.path_service = 0.0, 0.0
        group = c.group
        events = self._stop_run(c)
        copy = self.tiers.gpu.get((kv_key(c.program, c.model), group))
        if copy is not None and copy.ready and copy.pins == 0:
            copy.used = True  # lost, not a wasted promotion
            self._remove_copy(copy)
        if then is not None:
            then()
        self.recorder.dirty = True
        self._apply(self._hook("on_call_cancelled", c))  # the attempt is over for the policy too
        c.attempt += 1
        c.state, c.admitted, c.ready, c.start, c.first_token, c.flow, c.kv_reused_tokens = \
            "pending", -1.0, -1.0, -1.0, -1.0, None, 0
        c.loads_at, c.last_load, c.kv_room_tokens = -1.0, "", 0
        if later:
            return events + [(self.now, PRIO_NODE, self._arrive_again, (c, c.attempt))]
        self._retry_waiting()  # the room it freed goes first to the calls already waiting for it
        events += self._call_arrive(c) or []
        events += self._start_queued()
        return events

    def _prefill_done(self, c: CallRec):
        if c.state != "running":
            return None
        c.first_token = self.now
        self._end_prefill(c)
        if self.kv_reserve == "paged":
            events = self._decode_part(c, 0)
        else:
            m = self.catalog.by_name[c.model]
            amount = self.cost.decode_s(m, c.output_tokens, c.context_tokens, c.group)
            c.flow = self.flows._next
            events = self.flows_add(amount, tuple(f"gpu:{i}" for i in c.group), lambda now: self._call_end(c), c.model)
        return events + (self._start_queued() if self.prefill_slots is not None else [])

    def _arrive_again(self, c: CallRec, attempt: int):
        """A preempted call arrives again, unless something (a cancel) ended it meanwhile."""
        if c.state == "pending" and c.attempt == attempt:
            return self._call_arrive(c)
        return None

    def _decode_part(self, c: CallRec, done: int, attempt: int | None = None) -> list:
        """`kv_reserve` paged: decode the call's tokens from `done` to the next chunk's end, first
        taking that chunk's KV room from free HBM (a paged engine allocates blocks as tokens come;
        it does not evict other state). Where there is none, the engine preempts (`_preempt_for`).
        The parts' decode times add up to the whole decode's (`decode_s` is linear in the tokens
        given the KV before them)."""
        if c.state != "running" or (attempt is not None and c.attempt != attempt):
            return []  # a part of an attempt that has ended
        c.flow = None
        if done >= c.output_tokens:
            return self._call_end(c)
        events = []
        m = self.catalog.by_name[c.model]
        end = min(done + KV_CHUNK_TOKENS, c.output_tokens)
        if c.kv_room_tokens < end:
            target = min(c.kv_room_tokens + KV_CHUNK_TOKENS, c.max_tokens)
            add = (target - c.kv_room_tokens) * m.kv_bytes_per_token / len(c.group)
            if self.tiers.fits_gpu(c.group, add):
                self._take_kv(c, add, target)
            else:
                events, goes_on = self._preempt_for(c, add, target)
                if not goes_on:
                    return events
        amount = self.cost.decode_s(m, end - done, c.context_tokens + done, c.group)
        c.flow = self.flows._next
        return events + self.flows_add(amount, tuple(f"gpu:{i}" for i in c.group),
                                       lambda now, a=c.attempt: self._decode_part(c, end, a), c.model)

    def _take_kv(self, c: CallRec, add: float, target: int) -> None:
        self.tiers.alloc_gpu(c.group, add)
        group, held = self.tiers.private[id(c)]
        self.tiers.private[id(c)] = (group, held + add)
        c.kv_room_tokens = target
        self.recorder.dirty = True

    def _preempt_for(self, c: CallRec, add: float, target: int) -> tuple[list, bool]:
        """No free HBM for `add` more bytes of `c`'s KV: its engine (its model on its group)
        preempts its newest running call, as vLLM does, until the bytes fit (taken at once, before
        anything else can take the freed room) or `c` itself is the one preempted; (events,
        whether `c` goes on). Why every run still ends: `_admit_tokens`."""
        events = []
        while True:
            mates = [a for a in self.active.values() if a.state == "running" and a.model == c.model and a.group == c.group]
            victim = max(mates, key=lambda a: (a.start, a.seq))

            def take():
                if victim is not c and self.tiers.fits_gpu(c.group, add):
                    self._take_kv(c, add, target)
            self.recorder.preemptions += 1
            victim.preempted = True
            events += self._restart(victim, then=take, later=True)
            if victim is c or c.kv_room_tokens >= target:
                self._retry_waiting()  # what the preempted calls freed beyond the chunk
                return events + self._start_queued(), victim is not c

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
        self.recorder.dirty = True

    def _call_end(self, c: CallRec):
        self._release(c, finished=True)
        c.end = self.now
        c.state = "done"
        self.output_estimate.observe(c.model, c.output_tokens)  # known now that it has ended
        self.output_estimate.observe_asked(c.model, c.context_tokens + c.max_tokens)
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
            self.waiting_sums.discard(c)
        elif c.state == "queued":
            self.queued.remove(c)
        events = self._stop_run(c)
        c.state = "cancelled"
        self._apply(self._hook("on_call_cancelled", c))
        events += self._start_queued()
        self._retry_waiting()
        return events
