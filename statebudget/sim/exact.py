"""The exact optimum of a tiny instance by exhaustive search over the simulator's decisions,
independently of any solver: the yardstick for the lower bound (`solvers/bound.py`) and the
oracle's replay.

The decision menu (`Scripted`):
    placement: each call may run on any group of its model's width where it could ever fit;
    initial placement: at t = 0, for each model, nothing or one group to load it onto;
    prefetch: at each program start, call end and tool start, the policy may do nothing or
        promote one model's weights onto one group where they are not (the simulator
        evicts least recently used state to make room, unpinned only; evicted weights sleep in
        host DRAM, so a later promote there is a wake-up).
Every sequence of choices is one closed-loop replay; a depth-first enumeration replays each
sequence once (a replay past its prefix takes the first option everywhere, and reports how many
options each later point had). The result is the least `stall_total_s` over the menu: an upper
bound on the true optimum (a richer menu can only do better) and, where the lower bound meets it,
the optimum itself. The search grows as the menu's size to the number of decision points: keep
it to one or two GPUs, two or three models and a handful of calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.decisions import Promote
from ..models.state import weights_key
from ..policies.base import Policy
from .config import SimConfig
from .engine import Simulator
from .metrics import total_stall


class Scripted(Policy):
    """Takes the choices of `prefix` at the decision points in order, the first option past it,
    and records each point's number of options (`arity`) and the choice taken (`taken`)."""
    name = "scripted"
    demote_to = "host"
    tick_s = 1e9  # one tick, at t = 0

    def __init__(self, prefix: list[int]):
        self.prefix, self.arity, self.taken = prefix, [], []

    def _choose(self, n: int) -> int:
        if n <= 1:
            return 0
        i = len(self.arity)
        c = self.prefix[i] if i < len(self.prefix) else 0
        self.arity.append(n)
        self.taken.append(c)
        return c

    def place(self, sim, call):
        m = sim.catalog.by_name[call.model]
        groups = [g for g in sim.model_groups(m) if sim.fits_at_all(call, g)]
        return groups[self._choose(len(groups))] if groups else None

    def _targets(self, sim, models):
        return [(m.name, g) for m in models for g in sim.model_groups(m)
                if (weights_key(m.name), g) not in sim.tiers.gpu
                and all(m.dense_bytes / m.tp + sim.tiers.engine_overhead[i] <= sim.tiers.hbm_cap[i] for i in g)]

    def _prefetch(self, sim):
        options = [None] + self._targets(sim, sim.catalog.models)
        pick = options[self._choose(len(options))]
        return [Promote(weights_key(pick[0]), pick[1])] if pick else None

    def on_tick(self, sim):
        """The initial placement: for each model, nothing or one group."""
        out = []
        for m in sim.catalog.models:
            options = [None] + self._targets(sim, [m])
            pick = options[self._choose(len(options))]
            if pick:
                out.append(Promote(weights_key(pick[0]), pick[1]))
        return out

    def on_program_start(self, sim, program):
        return self._prefetch(sim)

    def on_call_end(self, sim, call):
        return self._prefetch(sim)

    def on_tool_start(self, sim, program, node, tool):
        return self._prefetch(sim)


@dataclass(frozen=True)
class ExactResult:
    stall_total_s: float   # the least over the menu (over the finished calls that count)
    choices: tuple         # a sequence that reaches it
    runs: int              # replays made
    complete: bool         # every sequence was replayed (else: the best of `runs`)


def exact_optimum(cluster, catalog, trace, config: SimConfig = SimConfig(start="warm"),
                  max_runs: int = 20000) -> ExactResult:
    best, best_choices, runs = float("inf"), (), 0
    stack: list[list[int]] = [[]]
    while stack:
        if runs >= max_runs:
            return ExactResult(round(best, 9), best_choices, runs, False)
        prefix = stack.pop()
        pol = Scripted(prefix)
        res = Simulator(cluster, catalog, trace, pol, config=config).run()
        runs += 1
        stall = total_stall(res)
        if stall < best - 1e-12:
            best, best_choices = stall, tuple(pol.taken)
        # every sibling of the choices this replay took past its prefix
        for j in range(len(pol.arity) - 1, len(prefix) - 1, -1):
            for c in range(pol.arity[j] - 1, 0, -1):
                stack.append(pol.taken[:j] + [c])
    return ExactResult(round(best, 9), best_choices, runs, True)
