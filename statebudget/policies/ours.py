"""Our policies: the planner core (`statebudget.planner`) behind the policy interface. The
simulator calls these hooks; the service feeds the same core from runtime events."""

from __future__ import annotations

import numpy as np

from ..models.state import kv_key
from ..planner.config import PlannerConfig, lease_config
from ..planner.core import PlannerCore
from ..planner.predictor import Predictor
from ..planner.target import TargetTracker, TrackConfig
from ..planner.leases import LeaseRequest
from .base import (Policy, default_place, number_map, place_under_load, ready_by_group, ready_s,
                   room_keeping_weights, stay_with_copy, wait_s)
from .baselines import place_model
from ..core.decisions import Cancel, Promote

MOVE_LOOK = 16  # waiting calls looked at a pass, in the queue's order, one per model: bounds the hook's time


class StateBudget(Policy):
    """Online greedy residency over weights, KV and expert pages, driven by the Markov switch
    matrix and the tool-wait model (no runtime hints)."""
    name = "statebudget"
    demote_to = "host"
    tick_s = 5.0
    use_hints = False
    plan_on_events = True
    base_config = staticmethod(PlannerConfig)  # its settings, with fields overridden by keyword

    # (a `Predictor.state_dict`, the time it was taken up at) the predictor starts from when the
    # first hook builds it (`take_up` before then), instead of the uniform prior
    history: tuple[dict, float] | None = None

    def __init__(self, config: PlannerConfig | None = None):
        self.config = config
        self.core: PlannerCore | None = None

    def replan(self, sim) -> list:
        """A planning step after an event: in the simulator at call admission, call end, tool start
        and (the lease planner) hints, besides `on_tick` every 5 s; the service sets
        `plan_on_events = False` and coalesces the events of a few milliseconds into one `on_tick`."""
        return self._core(sim).plan(sim, sim.now) if self.plan_on_events else []

    def place(self, sim, call):
        """Where the call's state is ready soonest, its prefill there weighted in by
        `PlannerConfig.place_prefill_weight` (BENCHMARKS.md: the stall / TTFT trade-off); with
        `place_queue_wait`, room now elsewhere is weighed against the queue ahead too. Past
        capacity there (`planner/overload.py`), where restore + the wait for the calls queued
        ahead is least: the group holding the weights may have a queue that others could drain
        (while its longest wait is under `spread_until_s`)."""
        core = self._core(sim)
        w = core.cfg.place_prefill_weight
        load = core.pressure(sim)
        ready = ready_by_group(sim, call, w)  # both rankings below read the same estimates
        group = default_place(sim, call, compute=w, load=load if core.cfg.place_queue_wait else None, ready=ready)
        keep = core.cfg.place_keeps_weights
        if group is not None and keep:
            stay = stay_with_copy(sim, call, group, ready, None if keep is True else float(keep))
            if stay != group:  # past capacity too: spreading there would evict the same weights
                return stay
        if group is None or load is None or not load.past_capacity(group):
            return group
        until = core.cfg.spread_until_s
        if until is not None and load.longest_wait_s(group) >= until:
            return group
        return place_under_load(sim, call, load, w, ready) or group

    def on_waiting(self, sim, calls):
        """A call waiting for HBM moves to another ready copy of its model's weights with room for
        it now (evicting no other model's weights) where its first token comes in under
        `move_waiting_share` of the time it would where it waits: `ready_s` there, against
        `ready_s` + `wait_s` where it waits. That wait is the latest expected end of the calls on
        its group or, with calls queued there, the queued work per running call, this call's and
        that of the calls behind it included: an upper end, hence the share. Only the first
        waiting call of each model is looked at; the next moves at the next pass."""
        core = self._core(sim)
        share = core.cfg.move_waiting_share
        if share is None:
            return None
        load = core.pressure(sim)
        out, seen = [], set()
        ends = None  # `latest_ends`, read once, at the first model with another ready copy
        for c in calls[:MOVE_LOOK]:
            if c.state != "waiting" or c.model in seen:
                continue
            seen.add(c.model)
            others = [copy.group for copy in sim.copies_of(c.model) if copy.ready and copy.group != c.group]
            if not others:
                continue
            if ends is None:
                ends = sim.latest_ends()
            best, best_s = None, share * (ready_s(sim, c, c.group, 1.0) + wait_s(sim, c.group, load, ends))
            for g in others:
                s = ready_s(sim, c, g, 1.0)
                if s < best_s and sim.could_ever_fit(c, g) and room_keeping_weights(sim, c, g):
                    best, best_s = g, s
            if best is not None:
                out.append((c.program, c.node, best))
        return out

    def learnt(self, now: float) -> dict | None:
        """The predictor's `state_dict` (switch counts, start rate, tool waits); before the first
        hook, what it took up (None: nothing)."""
        if self.core is None:
            return None if self.history is None else self.history[0]
        return self.core.predictor.state_dict(now)

    def take_up(self, state: dict, now: float) -> None:
        if self.core is not None:
            self.core.predictor.load_state_dict(state, now)
        else:  # the predictor is built at the first hook, from the view's catalog
            Predictor.check_state(state)
            self.history = (state, now)

    def _core(self, sim) -> PlannerCore:
        if self.core is None:
            self.core = PlannerCore(sim.catalog, sim.cost, self.config, use_hints=self.use_hints)
            if self.history is not None:
                self.core.predictor.load_state_dict(*self.history)
        return self.core

    # ---- events into the predictor, plans out ---------------------------------------------------
    def on_program_start(self, sim, program):
        pred = self._core(sim).predictor
        if getattr(program, "resumed", False):  # the service's, after a restart
            pred.program_resumed(program.program, program.tenant, sim.now, program.last_model, program.waits)
        else:
            pred.program_started(program.program, program.tenant, sim.now)

    def on_call_arrive(self, sim, call):
        core = self._core(sim)
        m = sim.catalog.by_name[call.model]
        groups = sim.model_groups(m)
        out = sim.output_estimate.expected(call.model, call.max_tokens)  # never the call's true output (§5)
        expected = sim.cost.call_s(m, call.context_tokens, out, groups[0]) if groups else 0.0
        core.predictor.call_arrived(call.program, call.model, sim.now, expected)

    def on_call_admitted(self, sim, call):
        return self.replan(sim)

    def on_call_end(self, sim, call):
        core = self._core(sim)
        core.predictor.call_finished(call.program, sim.now)
        return self.replan(sim)

    def on_tool_start(self, sim, program, node, tool):
        core = self._core(sim)
        core.predictor.tool_started(program.program, tool, sim.now)
        return self.replan(sim)

    def on_tool_end(self, sim, program, node, tool, duration_s):
        self._core(sim).predictor.tool_finished(program.program, tool, duration_s, sim.now)

    def on_program_end(self, sim, program):
        self._core(sim).predictor.program_finished(program.program, sim.now)

    def on_tick(self, sim):
        return self._core(sim).plan(sim, sim.now)

    # ---- eviction --------------------------------------------------------------------------------
    def evict_priority(self, sim, copy):
        return (self._core(sim).evict_priority(copy), copy.last_use)

    def may_evict_for_prefetch(self, sim, victim, key, group):
        """A promotion evicts only state worth less per byte; an admitted lease evicts anything
        no live lease holds (it was admitted against the deadline, not against the others)."""
        core = self._core(sim)
        if core._leased(key):
            return not core._leased(victim.key)
        mine = max((d for (k, _), d in core.density.items() if k == key), default=0.0)
        return core.evict_priority(victim) < mine


class StateBudgetLease(StateBudget):
    """StateBudget plus HandoffLeases made from the runtime's hints: each hint becomes a lease
    (deadline = a low quantile of the remaining tool wait), quoted, ranked and admitted; accepted
    leases prepare their state ahead; cancels and version changes stop their transfers."""
    name = "statebudget-lease"
    use_hints = True
    base_config = staticmethod(lease_config)

    def __init__(self, config: PlannerConfig | None = None):
        super().__init__(config or self.base_config())
        self.group_of: dict[str, tuple] = {}
        self.tool_of: dict[str, tuple[str, float]] = {}  # program -> (tool running, since)

    def on_tool_start(self, sim, program, node, tool):
        self.tool_of[program.program] = (tool, sim.now)
        return super().on_tool_start(sim, program, node, tool)

    def on_hints(self, sim, program, hints):
        core = self._core(sim)
        reqs = []
        for h in hints:
            if h.model not in sim.catalog.by_name:
                continue
            core.predictor.hinted(program.program, h.model, h.confidence, h.for_)
            tool, since = self.tool_of.get(program.program, ("shell", sim.now))
            wait = core.predictor.tools.quantile_remaining(tool, sim.now - since, core.cfg.lease_deadline_q)
            kvk = kv_key(program.program, h.model)
            kv = sim.kv_tokens.get(kvk) or None
            group = place_model(sim, h.model, program=program.program)
            if group is None:
                continue
            version = sim.catalog.by_name[h.model].version
            reqs.append((LeaseRequest(program=program.program, tenant=program.tenant, model=h.model, version=version,
                                      deadline_s=sim.now + wait, confidence=h.confidence,
                                      cancel_token=f"{program.program}/{h.for_}", earliest_s=sim.now,
                                      kv_version=kv, for_call=h.for_), group))
        leases, out = self.request_leases(sim, reqs)
        return out + self.replan(sim)

    def request_leases(self, sim, reqs: list[tuple[LeaseRequest, tuple]]) -> tuple[list, list]:
        """Quote, rank and admit competing lease requests [(request, group)]; returns the leases
        and the promotions that prepare the admitted ones (the service calls this too)."""
        core = self._core(sim)
        leases, out = [], []
        for lease, group in core.admit(sim, reqs, sim.now):
            leases.append(lease)
            if not lease.state.live:
                continue
            self.group_of[lease.lease_id] = group
            for key in lease.objects:
                core.ledger.begin(lease.lease_id, key)
                out.append(Promote(key, group, lease.lease_id))
        return leases, out

    def holds_kv(self, sim, kvk) -> bool:
        return self._core(sim).ledger.covers_kv(kvk[1], kvk[2])

    def on_copy_ready(self, sim, copy):
        core = self._core(sim)
        version = sim.kv_tokens.get(copy.key) if copy.key[0] == "kv" else sim.catalog.by_name[copy.key[1]].version
        for lid in copy.lease or ():
            core.ledger.commit(lid, copy.key, version, sim.now)
        copy.lease = None

    def on_call_arrive(self, sim, call):
        super().on_call_arrive(sim, call)
        core = self._core(sim)
        lid = core.lease_of_call.pop((call.program, call.node), None)
        if lid is not None:
            core.ledger.consume(lid, sim.now)

    def stop_leases(self, sim, stopped) -> list:
        """Cancel decisions for the transfers of leases that were cancelled or went stale."""
        core = self._core(sim)
        out = []
        for lid, keys in stopped:
            group = self.group_of.get(lid)
            for key in keys:
                if group is not None and not core._leased(key):  # another live lease still needs it
                    out.append(Cancel(key, group))
        return out

    def on_call_cancelled(self, sim, call):
        core = self._core(sim)
        core.predictor.call_cancelled(call.program, call.node, call.arrive >= 0, sim.now)
        return self.stop_leases(sim, core.ledger.cancel_token(f"{call.program}/{call.node}", sim.now, call.program))

    def on_call_end(self, sim, call):
        core = self._core(sim)
        kvk = kv_key(call.program, call.model)
        out = self.stop_leases(sim, core.ledger.version_changed(kvk, sim.kv_tokens.get(kvk), sim.now))
        return out + (super().on_call_end(sim, call) or [])

    def on_tick(self, sim):
        self._core(sim).ledger.expire(sim.now)
        return super().on_tick(sim)


class StateBudgetTrack(StateBudgetLease):
    """statebudget-lease tracking the forecast MILP (`planner/target.py`): every `replan_s` the
    simulator runs `on_replan` off the decision path (timed as a solve, not a decision); the
    target it returns applies `charge_s` later, and every planning step repairs toward it."""
    name = "statebudget-track"

    def __init__(self, config: PlannerConfig | None = None, track: TrackConfig | None = None):
        super().__init__(config)
        self.track_cfg = track or TrackConfig()
        self.replan_s = self.track_cfg.replan_s
        self.tracker: TargetTracker | None = None
        self._rates: dict | None = None  # the tracker's rates taken up before it was built (`take_up`)

    def _tracker(self, sim) -> TargetTracker:
        if self.tracker is None:
            self.tracker = TargetTracker(sim.catalog, sim.cost, self.track_cfg)
            if self._rates is not None:
                self._set_rates(self._rates)
        return self.tracker

    def learnt(self, now: float) -> dict | None:
        """The predictor's state and, under `tracker`, the tracker's call rates and contexts."""
        state = super().learnt(now)
        rates = self._rates if self.tracker is None else {"rate": dict(self.tracker.rate), "ctx": dict(self.tracker.ctx)}
        return state if state is None or rates is None else {**state, "tracker": rates}

    def take_up(self, state: dict, now: float) -> None:
        rates = state.get("tracker") if isinstance(state, dict) else None
        if rates is not None:  # checked before anything is taken up
            if not isinstance(rates, dict):
                raise ValueError("tracker state: must hold 'rate' and 'ctx'")
            rates = {k: number_map(rates.get(k), f"tracker state: {k!r}") for k in ("rate", "ctx")}
        super().take_up(state, now)
        self._rates = rates
        if self.tracker is not None and rates is not None:
            self._set_rates(rates)

    def _set_rates(self, rates: dict) -> None:
        known = set(self.tracker.models)
        self.tracker.rate = {m: v for m, v in rates["rate"].items() if m in known}
        self.tracker.ctx = {m: v for m, v in rates["ctx"].items() if m in known}

    def on_call_arrive(self, sim, call):
        self._tracker(sim).call_arrived(call.model, call.context_tokens)
        return super().on_call_arrive(sim, call)

    def on_replan(self, sim) -> None:
        """One solve in line, charged `charge_s` (the simulator); its record (wall time included)
        stays in `tracker.solves`, out of anything a replay's decisions could read."""
        self._tracker(sim).replan(sim, *self.live_demand(sim), sim.now)

    def target_problem(self, view):
        """The problem of one solve, built from the books (the service then solves it off the loop)."""
        return self._tracker(view).prepare(view, *self.live_demand(view), view.now)

    def live_demand(self, view):
        """(calls per model the live programs are expected to make within the planner's horizon, that horizon)."""
        core = self._core(view)
        h = core.cfg.horizon_s
        _, p = core.predictor.need_within(view.now, h, core.use_hints)
        return (p.sum(axis=0) if len(p) else np.zeros(len(core.models))), h

    def _retarget(self, sim) -> None:
        core = self._core(sim)
        core.target = self._tracker(sim).target(sim.now)
        core.target_p = self.track_cfg.target_p
        core.target_homes = self.track_cfg.target_homes

    def replan(self, sim) -> list:
        self._retarget(sim)
        return super().replan(sim)

    def on_tick(self, sim):
        self._retarget(sim)
        return super().on_tick(sim)
