"""Admission: a call that has arrived is placed by the policy, then admitted on its group when its
weights, expert pages, KV and new KV fit there (evicting in the policy's order, cancelling loads
the policy lets go), or waits. The oldest call that has waited `admit_starve_s` holds its GPUs:
only calls that end before the drain backfill there."""

from __future__ import annotations

import numpy as np

from ..core.costs import expected_missing_pages, median_page_count, touched_pages
from ..models.state import expert_key, kv_key, weights_key
from .calls import KV_CHUNK_TOKENS, CallRec


class AdmissionMixin:
    """Arrival, placement, the admission rule, the reservation against starvation, and the retry
    of waiting calls whenever room may have been freed."""

    def _call_arrive(self, c: CallRec):
        c.arrive = self.now
        c.state = "waiting"
        self.kvw.outcome(kv_key(c.program, c.model), True)
        self._keep_kv(kv_key(c.program, c.model))
        self._apply(self._hook("on_call_arrive", c))
        return self._route(c)

    def _route(self, c: CallRec):
        """The policy places the call, which is admitted there or waits for HBM; a group that
        refuses it (`_maybe_refuse`) is left out and the policy places it again. The events of a
        call no group takes (`_unplaceable`), else None. A call routed again joins the queue anew:
        its place in the old group's queue is lost with the time it waited. The policy hears of a
        refusal (`on_call_refused`) just before it places the call again, on the state it places on."""
        while True:
            if c.group is not None and c.group in c.refused:
                self._apply(self._hook("on_call_refused", c))
            c.group = self._decide(self.policy.place, c)
            self.last_use[c.model] = self.now
            if c.group is None or c.group in c.refused:
                return self._unplaceable(c)
            self._reserve()
            if self._admit(c):
                return None
            if c.group not in c.refused:
                self._join(self.waiting, c)
                self.waiting_sums.add(c, self._queued_run(c))
                if c is self.reserved:  # it holds its new group's GPUs: backfill ends by their drain
                    self._reserve_deadline = self._drain_end(c.group)
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

    def _est_end(self, c: CallRec, new_per_gpu: float = 0.0, tokens: float | None = None) -> float:
        """When a call should end, by the cost model's uncontended load (`new_per_gpu` bytes from
        the slowest tier, NVMe), prefill and decode of `tokens`, by default the output it is
        expected to write (`output_estimate`: its true output is not known before it ends)."""
        base = c.start if c.state == "running" else self.now
        out = self.expected_output(c) if tokens is None else tokens
        plain = tokens is None and new_per_gpu == 0.0
        if plain:  # asked of every active call at every placement: kept per call while its inputs hold
            last = c.est_run
            if last and last[0] == out and last[1] == c.kv_reused_tokens and last[2] == c.group:
                return base + last[3]
        m = self.catalog.by_name[c.model]
        run = self.cost.prefill_s(m, max(0, c.context_tokens - c.kv_reused_tokens), c.group) + \
            self.cost.decode_s(m, out, c.context_tokens, c.group)
        if new_per_gpu > 0:
            g0 = self.gpus[c.group[0]]
            run += self.cost.transfer_s(new_per_gpu, f"nvme:{g0.node}", f"gpu:{g0.index}")
        if plain:
            c.est_run = (out, c.kv_reused_tokens, c.group, run)
        return base + run

    def _drain_end(self, group) -> float:
        """The latest the calls holding room on `group` can end: each writes at most its
        `max_tokens`, which the runtime asked for (backfill by expected ends fits under it)."""
        gs = set(group)
        return max((self._est_end(a, tokens=a.max_tokens) for a in self.active.values() if not gs.isdisjoint(a.group)),
                   default=self.now)

    def expected_wait_s(self, group, ends: list | None = None) -> float:
        """Seconds until the calls holding room on `group` are expected to end (placement's guess
        at the wait for a busy group; estimates only, no call's true output). `ends`: `latest_ends`
        read once for many groups."""
        ends = self.latest_ends() if ends is None else ends
        return max((ends[i] for i in group if ends[i] is not None), default=self.now) - self.now

    def latest_ends(self) -> list[float | None]:
        """Per GPU: the latest expected end of the calls holding room on it (None: no call)."""
        ends: list[float | None] = [None] * len(self.gpus)
        for a in self.active.values():
            end = self._est_end(a)
            for i in a.group:
                if ends[i] is None or end > ends[i]:
                    ends[i] = end
        return ends

    def admission_queue(self) -> list[tuple[str, tuple[int, ...], float, float]]:
        """(model, group, expected run seconds, seconds waited) of each call waiting for HBM
        (`ResidencyView`); the run is `_est_end`'s, from the output estimate, never a call's true
        output. The planner reads the same queue summed per GPU (`queue_load`), which is kept."""
        now, run = self.now, self._queued_run
        return [(c.model, c.group, run(c), now - c.arrive) for c in self.waiting if c.state == "waiting"]

    def queue_load(self):
        """`admission_queue` summed per GPU (`planner/overload.py:QueueLoad`), or None when no call
        waits. It does not read the clock and is kept as calls join and leave (`waiting.py`): the
        planner asks at every step and placement, over queues hundreds long."""
        return self.waiting_sums.load(self.output_estimate.count, self._queued_runs)

    def queue_oldest(self) -> dict[tuple, float]:
        """(model, group) -> the arrival of its longest-waiting call, for every model and group
        with a call waiting for HBM (`planner/homes.py:scale_out`), without a pass over the queue."""
        return self.waiting_sums.oldest()

    def queue_depth(self) -> dict[tuple, int]:
        """(model, group) -> its calls waiting for HBM there (`planner/homes.py:scale_out`)."""
        return self.waiting_sums.depth()

    def _queued_runs(self, model: str, groups: list, calls: list[CallRec]):
        """`_queued_run` of waiting calls of one model (`groups`: each one's), in one numpy pass: a
        moved output estimate changes every one of their runs (`sim/waiting.py`)."""
        m, expected, n = self.catalog.by_name[model], self.output_estimate.expected, len(calls)
        ctx = np.fromiter((c.context_tokens for c in calls), float, n)
        new = ctx - np.fromiter((c.kv_reused_tokens for c in calls), float, n)
        out = expected(model, np.fromiter((c.max_tokens for c in calls), float, n))
        return self.cost.prefill_s(m, new, groups) + self.cost.decode_s(m, out, ctx, groups)

    def _queued_run(self, c: CallRec) -> float:
        """A waiting call's expected run (`_est_end`, which keeps it on the call while its inputs
        hold)."""
        return self._est_end(c) - self.now

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

    def _reserved_tokens(self, c: CallRec) -> int:
        """Output tokens a call needs KV room for by its end (`SimConfig.kv_reserve`): all it
        asked for (`max_tokens`), or with `written` those it will write. Only the admission
        reads this; a policy judges room by `max_tokens` (`expected_need`, `could_ever_fit`)."""
        return min(c.output_tokens, c.max_tokens) if self.kv_reserve == "written" else c.max_tokens

    def _admit_tokens(self, c: CallRec) -> int:
        """Output tokens the admission holds KV room for at once: `_reserved_tokens`, or with
        `paged` one chunk (the rest is taken as the decode reaches it, `_decode_part`). A call
        preempted before comes back holding room for all it asked for (`fits_at_all` has checked
        that it fits): the room a call grows into comes from free HBM only, so one alone on its
        engine beside others' idle state would otherwise be preempted at the same chunk for ever.
        So a call preempts itself at most once, and an engine's oldest call is never preempted
        for a newer one: every run ends."""
        if self.kv_reserve != "paged":
            return self._reserved_tokens(c)
        return c.max_tokens if c.preempted else min(KV_CHUNK_TOKENS, c.max_tokens)

    def call_need(self, c: CallRec, group, pages=None, tokens: int | None = None) -> tuple[list, float, float]:
        """(state keys the call needs on `group`, per-GPU bytes of the new copies, per-GPU bytes of
        the call's own new KV). The new KV is reserved for the context and `tokens` of output
        (default `max_tokens`: all the call asked for, as an engine that must not run out of KV
        mid-call does); at its end what it did not write is freed (`_release`). `pages`: the
        expert pages counted (default: the call's own, which only the admission itself may read)."""
        m = self.catalog.by_name[c.model]
        tp = len(group)
        keys = [weights_key(m.name)] + [expert_key(m.name, p) for p in (c.pages if pages is None else pages)]
        kvk = kv_key(c.program, c.model)
        T = self.kv_tokens.get(kvk, 0)
        if T > 0:
            keys.append(kvk)
        new = sum(self.size_of(k) for k in keys if (k, group) not in self.tiers.gpu) / tp \
            + self.tiers.engine_need(keys[0], group)
        out = c.max_tokens if tokens is None else tokens
        private = max(0, c.context_tokens + out - T) * m.kv_bytes_per_token / tp
        return keys, new, private

    def expected_need(self, c: CallRec, group) -> tuple[list, float, float]:
        """`call_need` as a policy can know it before the call runs: which expert pages it will
        touch is not known (its router picks them as its tokens run), so each page missing on
        `group` counts by how often calls touch it, and of the pages there only those a call more
        likely touches than not are kept; the others may go for room, as the admission may evict
        any page the call does not touch."""
        m = self.catalog.by_name[c.model]
        if m.moe is None:
            return self.call_need(c, group)
        gpu = self.tiers.gpu
        kept = [p for p, _ in touched_pages(m, 0.5) if (expert_key(m.name, p), group) in gpu]
        keys, new, private = self.call_need(c, group, pages=kept)
        return keys, new + expected_missing_pages(m, group, gpu) * m.moe.page_bytes / len(group), private

    def call_footprint(self, c: CallRec, pages: int | None = None, tokens: int | None = None) -> float:
        """Bytes the call needs in HBM at once: weights, `pages` expert pages (default: its own),
        its program's KV with room for `tokens` of output (default all the call asked for,
        `max_tokens`)."""
        m = self.catalog.by_name[c.model]
        n = len(c.pages) if pages is None else pages
        out = c.max_tokens if tokens is None else tokens
        kv = max(self.kv_tokens.get(kv_key(c.program, c.model), 0), c.context_tokens + out)
        return m.dense_bytes + n * (m.moe.page_bytes if m.moe else 0.0) + kv * m.kv_bytes_per_token

    def group_capacity(self, group) -> float:
        """HBM bytes of the smallest GPU of a group (cached)."""
        cap = self._group_cap.get(group)
        if cap is None:
            cap = self._group_cap[group] = min(self.tiers.hbm_cap[i] for i in group)
        return cap

    def _fits_empty(self, need: float, group) -> bool:
        return need / len(group) + max(self.tiers.engine_overhead[i] for i in group) <= self.group_capacity(group)

    def fits_at_all(self, c: CallRec, group) -> bool:
        """Whether the call's weights, own pages and KV fit an empty `group`: what the admission
        finds once the call's router has picked its pages (and a policy that sees the future may
        read). Kept on the call while its group and its program's KV stay: asked at every retry."""
        kv = self.kv_tokens.get(kv_key(c.program, c.model), 0)
        last = c.fits
        if last and last[0] == group and last[1] == kv:
            return last[2]
        ok = self._fits_empty(self.call_footprint(c, tokens=self._reserved_tokens(c)), group)
        c.fits = (group, kv, ok)
        return ok

    def could_ever_fit(self, c: CallRec, group) -> bool:
        """Whether the call could fit an empty `group`, as placement can judge it before the call's
        router runs: more likely than not, its pages counted as the median of its model's calls
        (`median_page_count`); never a group that has refused it (`_maybe_refuse`)."""
        if group in c.refused:
            return False
        m = self.catalog.by_name[c.model]
        median = self._median_pages.get(m.name)
        if median is None:
            median = self._median_pages[m.name] = median_page_count(m)
        return self._fits_empty(self.call_footprint(c, median), group)

    def _maybe_refuse(self, c: CallRec, held: bool) -> None:
        """Refuse a call whose own pages never fit its group once the engine takes it: at once if
        by what the engine knows no room could ever be made (`could_ever_fit`), else when its
        weights and KV have room (an engine admits on its KV blocks; the pages load as the router
        picks them), not while the group is held for a starving call. The runtime then routes it
        again (`_route`). Optimistic: the refusal costs no compute, where an engine would find out
        during the prefill."""
        group = c.group
        if group in c.refused:
            return
        if not self.could_ever_fit(c, group) or (
                not held and self._victims_for_room(group, *self.call_need(c, group, pages=(),
                                                                             tokens=self._reserved_tokens(c))) is not None):
            c.refused += (group,)
            self.recorder.page_refusals += 1

    def _admit(self, c: CallRec) -> bool:
        group = c.group
        held = c is not self.reserved and self._held_for_another(group)
        if not self.fits_at_all(c, group):
            self._maybe_refuse(c, held)
            return False
        tokens = self._admit_tokens(c)
        keys, new, private = self.call_need(c, group, tokens=tokens)
        if held and self._est_end(c, new) > self._reserve_deadline:
            return False  # on held GPUs only a call that ends before the drain goes in (backfill)
        victims = self._victims_for_room(group, keys, new, private)
        if victims is None or (held and victims):
            return False
        drains = []
        why = f"call {c.program}/{c.node} ({c.model})"  # for the timeline
        for v in victims:
            if not v.ready:
                self.cancel_load(v, cause=why)
                continue
            drains += self._evict(v, self.policy.demote_tier(self, v), cause=why)
        c.state, c.admitted, c.loads_at = "loading", self.now, self.now
        loads = []
        for key in keys:
            copy = self.tiers.gpu.get((key, group))
            if copy is None:
                copy = self._new_gpu_copy(key, group, prefetch=False, cause=why)
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
        c.kv_room_tokens = tokens
        self.active[id(c)] = c
        kvk = kv_key(c.program, c.model)
        c.kv_reused_tokens = self.kv_tokens.get(kvk, 0)
        self.waiting_sums.discard(c)  # in `waiting` until the retry pass ends, no longer summed
        self.recorder.dirty = True
        self._apply(self._hook("on_call_admitted", c))
        if loads:
            drains = self._outgoing(group, drains)

        def start(now):  # the call's own loads start once the copies evicted for its room are out
            if loads:
                c.loads_at = now
            return self._start_loads(loads)
        events = self._after(drains, start)
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

    def _unstick(self, force: bool = False) -> list:
        """Nothing left to happen but calls still wait for HBM: retry them, and report the first
        that still cannot be admitted as unplaceable rather than wait forever."""
        self._retry_waiting()
        idle = not self.flows.flows and not self.queued and not any(self.running_on)
        if self.waiting and (force or idle):
            c = self.waiting.pop(0)
            self.waiting_sums.discard(c)
            return self._unplaceable(c) or []
        return []

    def _when_idle(self) -> bool:
        """The heap is empty: while calls still wait for HBM, retry them and give up on the first
        that cannot be admitted (`_unstick`). True if that scheduled anything."""
        while not self._heap and self.waiting:
            self._push_all(self._unstick(force=True))
        return bool(self._heap)

    def _retry_waiting(self):
        if not self.waiting:
            return
        while True:
            self._reserve()
            held = self.reserved
            still, refused = [], []
            for c in self._order(self.waiting):
                if not self._admit(c):
                    (refused if c.group in c.refused else still).append(c)
            self.waiting = still
            for c in refused:
                self.waiting_sums.discard(c)
                self._push_all(self._route(c) or [])
            if held is not None and held.state != "waiting" and self.waiting:
                continue  # the starving call got in: the calls it held back try again
            if not self._move_waiting(held) or not self.waiting:
                return
            # The starving call moved and got in elsewhere: the same again.

    def _move_waiting(self, held: CallRec | None) -> bool:
        """The policy may move calls still waiting to another group (`Policy.on_waiting`); a move
        is carried out only where the call is admitted at once, else it stays where it waits.
        True if `held`, the call holding its GPUs against starvation, moved (and got in)."""
        moves = self._hook("on_waiting", self.waiting) if self.waiting else None
        moved = set()
        for program, node, group in moves or ():
            c = self.programs[program].calls.get(node)
            if c is None or c.state != "waiting" or group == c.group or self._held_for_another(group):
                continue
            old, c.group = c.group, group
            if not self._admit(c):  # no room there now: it waits where it was
                c.group = old
                continue
            self.recorder.moved_calls += 1
            moved.add(id(c))
        if moved:
            self.waiting = [w for w in self.waiting if id(w) not in moved]
        return held is not None and id(held) in moved

    def has_room_now(self, c: CallRec, group) -> bool:
        """Whether the call could be admitted on `group` now, evicting only unpinned ready state (and
        cancelling speculative loads, as `_admit` does), as a policy can judge it (`expected_need`)."""
        return self._victims_for_room(group, *self.expected_need(c, group)) is not None
