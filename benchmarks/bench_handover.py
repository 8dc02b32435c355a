"""How much of a trace is decided by its first minutes' layout: one policy (`--first`, default
forecast-prewarm) decides for the first T simulated seconds, then another (`--then`, default
statebudget-lease) takes over. Both see every event from the start (the second's predictor learns
through the first's reign); before T the second's decisions are dropped, after T the first's.
hetero16 + agent-team, 2-hour traces, warm start, 30-minute warm-up, tuning seeds 1-10 (seeds >= 100
are for evaluation). A diagnostic, not a policy: the hand-over time is not something an online
planner could choose by looking at the trace. The second's books assume its dropped decisions were
applied: a lease it admitted before T holds its state (as leased) until its deadline passes, about
one tool wait; a hand-over inside the warm-up leaves that out of every figure.

    .venv/bin/python benchmarks/bench_handover.py --trace mapreduce --at 0,150,600

At 0 it replays `--then` alone, exactly; at a time past the trace's end it replays `--first` alone
but for the shared tick (checked equal on mapreduce seeds 1 and 8 with forecast-prewarm;
docs/experiments.md, "The prior and the first minutes").
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from bench_policies import parse_seeds
from statebudget.policies import REGISTRY, make_policy
from statebudget.policies.base import Policy
from statebudget.sim import sweep as sw

EVENTS = ("on_call_arrive", "on_call_admitted", "on_call_end", "on_hints", "on_program_start", "on_tool_start",
          "on_tool_end", "on_call_cancelled", "on_copy_ready", "on_program_end", "on_waiting")
QUERIES = ("place", "evict_priority", "demote_tier", "may_evict_for_prefetch", "holds_kv")


def handover(first: str, then: str, at_s: float) -> type[Policy]:
    """A policy class: `first` decides before `at_s`, `then` from it on; both hear every event."""

    class Handover(Policy):
        name = "handover"
        demote_to = "host"

        def __init__(self):
            self.a, self.b = make_policy(first), make_policy(then)
            for attr in ("speculation_yields", "kv_rule", "sees_future"):  # read by the simulator, not forwarded
                if getattr(self.a, attr, None) != getattr(self.b, attr, None):
                    raise ValueError(f"{first} and {then} differ in {attr}: the hand-over cannot switch it")
            if all(type(p).on_copy_ready is not Policy.on_copy_ready for p in (self.a, self.b)):
                # both would commit leases from one copy's ids, numbered alike in their two ledgers
                raise ValueError(f"{first} and {then} both track copies for leases (on_copy_ready)")
            ticks = sorted(t for t in (self.a.tick_s, self.b.tick_s) if t)
            if len(ticks) == 2 and abs(ticks[1] / ticks[0] - round(ticks[1] / ticks[0])) > 1e-9:
                raise ValueError(f"tick periods {ticks} are not multiples: the slower policy would tick late")
            self.tick_s = ticks[0] if ticks else None
            self.ticked: dict[int, float] = {}  # id(policy) -> its last tick
            # a policy that re-plans off the decision path (statebudget-track's MILP) keeps its period
            periods = {p.replan_s for p in (self.a, self.b) if getattr(p, "replan_s", None)}
            if len(periods) > 1:
                raise ValueError(f"{first} and {then} re-plan on different periods: {sorted(periods)}")
            self.replan_s = periods.pop() if periods else None

        def on_replan(self, sim):
            for p in (self.a, self.b):
                if getattr(p, "replan_s", None):
                    p.on_replan(sim)

        def _deciding(self, sim) -> Policy:
            return self.b if sim.now >= at_s else self.a

        def on_tick(self, sim):
            # each policy ticks at its own period: a rate forecast counts arrivals per its tick
            out = {id(p): p.on_tick(sim) for p in (self.a, self.b) if self._due(p, sim.now)}
            return out.get(id(self._deciding(sim)))

        def _due(self, p: Policy, now: float) -> bool:
            if not p.tick_s or now - self.ticked.get(id(p), -float("inf")) < p.tick_s - 1e-9:
                return False
            self.ticked[id(p)] = now
            return True

    def event(name):
        def hook(self, sim, *args):
            ra, rb = getattr(self.a, name)(sim, *args), getattr(self.b, name)(sim, *args)
            return rb if self._deciding(sim) is self.b else ra
        return hook

    def query(name):
        return lambda self, sim, *args: getattr(self._deciding(sim), name)(sim, *args)

    for n in EVENTS:
        setattr(Handover, n, event(n))
    for n in QUERIES:
        setattr(Handover, n, query(n))
    return Handover


def _register(first: str, then: str, at_s: float) -> None:
    """A worker's initializer: the sweep's jobs find the hand-over in the registry by its name."""
    REGISTRY["handover"] = handover(first, then, at_s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="mapreduce")
    ap.add_argument("--first", default="forecast-prewarm")
    ap.add_argument("--then", default="statebudget-lease")
    ap.add_argument("--at", default="150", help="comma-separated hand-over times, simulated seconds")
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    if any(s >= 100 for s in seeds):
        ap.error("seeds >= 100 are evaluation seeds: tune on 1-10")
    for name in (args.first, args.then):
        if name not in REGISTRY:
            ap.error(f"unknown policy {name!r} (known: {', '.join(REGISTRY)})")

    try:  # a pair the hand-over cannot serve fails here, not in a worker
        handover(args.first, args.then, 0.0)()
    except ValueError as e:
        ap.error(str(e))
    jobs = sw.jobs(["hetero16"], [args.trace], seeds, ["handover"], "agent-team", 2.0, start="warm",
                   warmup_s=1800.0, load=args.load)
    for at in (float(x) for x in args.at.split(",")):
        with ProcessPoolExecutor(max_workers=args.workers, initializer=_register,
                                 initargs=(args.first, args.then, at)) as pool:
            rows = [{"seed": r["seed"], "p95": r["handoff_p95_s"], "stall": r["stall_total_s"], "ttft": r["ttft_p95_s"]}
                    for r in pool.map(sw.run_job, jobs)]
        for r in rows:
            print(f"{args.trace} seed {r['seed']} {args.first} -> {args.then} at {at:g} s: handoff p95 "
                  f"{r['p95']:.3f} s, total stall {r['stall']:.0f} s, TTFT p95 {r['ttft']:.2f} s", flush=True)
        mean = {k: float(np.mean([r[k] for r in rows])) for k in ("p95", "stall", "ttft")}
        print(f"MEAN {args.trace} {args.first} -> {args.then} at {at:g} s: handoff p95 {mean['p95']:.3f} s, "
              f"total stall {mean['stall']:.0f} s, TTFT p95 {mean['ttft']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
