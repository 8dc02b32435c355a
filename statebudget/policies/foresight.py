"""`foresight`: the production planner (statebudget-lease) with the trace's future in place of its
forecast. A reference, like the oracle: it SEES THE FUTURE and is never a contender.

It answers one question the fair table cannot: how much of the gap to the best baseline is
prediction, and how much is what the planner does with a prediction (its layout, its budget, its
eviction order). Everything but the predictor's answer is statebudget-lease's, unchanged.

What it knows that the forecast does not: for each live program, which models its pending calls
are on and when each will arrive (the trace's tool durations and DAG, its calls' true compute on
their model's first group, from the program's progress in the replay), and which programs will
start and when (their zero-stall timeline). P(model m is needed within h) is then 1 or 0. What it
does not know: how long calls will queue or stall, so an arrival time is an estimate, and a call
already due (its estimate past) counts as needed now. Cancelled branches are not foreseen.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ..planner.predictor import Predictor
from ..traces.timeline import nominal_timeline
from .ours import StateBudgetLease


# A model no foreseen call needs keeps a little worth: with room to spare the planner keeps what is
# warm (as under the forecast, whose prior is never 0) rather than moving it out and back.
FLOOR = 1e-3


def _soon(dt: float, h: float) -> float:
    """1 for a call due within the horizon, then falling by e every horizon past it: a call just
    past the horizon is worth keeping for too, as the forecast's smooth tail would say."""
    return 1.0 if dt <= h else math.exp(-(dt - h) / h)


class ForesightPredictor(Predictor):
    """`need_within` and `model_need_within` read `future` (program -> [(arrival, model index)])
    and `starts` (sorted program starts with their calls' zero-stall arrivals) instead of the
    switch matrix and the tool-wait model; the rest (leases' deadlines, hints' bookkeeping) is the
    forecast's."""

    def __init__(self, models: list[str]):
        super().__init__(models)
        self.future: dict[str, list[tuple[float, int]]] = {}
        self.start_times: list[float] = []
        self.start_calls: list[list[tuple[float, int]]] = []

    def _need_within(self, now: float, horizons: list, use_hints: bool) -> list:
        progs, _ = self.next_model_probs(now, use_hints)
        out = []
        for h in horizons:
            p = np.zeros((len(progs), len(self.models)))
            for k, pid in enumerate(progs):
                row = p[k]
                for t, mi in self.future.get(pid, ()):
                    row[mi] = max(row[mi], _soon(t - now, h))
            out.append((progs, p))
        return out

    def model_need_within(self, now: float, horizon_s: float, use_hints: bool = True) -> np.ndarray:
        _, p = self.need_within(now, horizon_s, use_hints)
        need = p.max(axis=0) if len(p) else np.zeros(len(self.models))
        lo = bisect.bisect_right(self.start_times, now)
        hi = bisect.bisect_right(self.start_times, now + 4 * horizon_s)
        for calls in self.start_calls[lo:hi]:
            for t, mi in calls:
                need[mi] = max(need[mi], _soon(t - now, horizon_s))
        return np.maximum(need, FLOOR)


class Foresight(StateBudgetLease):
    """statebudget-lease whose predictor is told the future (module docstring)."""
    name = "foresight"
    sees_future = True

    def __init__(self, config=None):
        super().__init__(config)
        self.ended: dict[tuple[str, str], float] = {}    # (program, node) -> when it ended
        self.started: dict[tuple[str, str], float] = {}  # (program, tool node) -> when it started

    def _core(self, sim):
        if self.core is None:
            core = super()._core(sim)
            pred = ForesightPredictor(core.models)
            pred.lookahead = core.predictor.lookahead
            core.predictor = pred
            idx = {m: i for i, m in enumerate(core.models)}
            by_prog: dict[str, list] = {}
            for (pid, nid), (t, _) in nominal_timeline(sim.trace, sim.catalog).items():
                by_prog.setdefault(pid, []).append((t, nid))
            rows = []
            for p in sim.trace.programs:
                model = {n.id: n.model for n in p.nodes if n.kind == "call"}
                rows.append((p.start, [(t, idx[model[nid]]) for t, nid in by_prog.get(p.program, ())
                                       if nid in model and model[nid] in idx]))
            rows.sort(key=lambda r: r[0])
            pred.start_times = [r[0] for r in rows]
            pred.start_calls = [r[1] for r in rows]
        return self.core

    def _foresee(self, sim, pid: str) -> None:
        """The arrivals of the program's pending calls, from where the replay has it now."""
        pr = sim.programs.get(pid)
        pred = self._core(sim).predictor
        if pr is None or pr.end >= 0:
            pred.future.pop(pid, None)
            return
        idx = sim.catalog.by_name
        nodes = {n.id: n for n in pr.prog.nodes}
        end: dict[str, float] = {}
        arrivals = []

        def end_of(nid: str) -> float:
            t = end.get(nid)
            if t is not None:
                return t
            st = pr.node_state[nid]
            n = nodes[nid]
            if st == "cancelled":
                t = math.inf
            elif st == "done" or (pid, nid) in self.ended:
                t = self.ended.get((pid, nid), sim.now)
            elif st == "running" and n.kind == "tool":
                t = self.started.get((pid, nid), sim.now) + n.duration
            elif st == "running":
                c = pr.calls[nid]
                t = max(sim.now, (c.start if c.start >= 0 else sim.now) + self._call_s(sim, n, c.group))
            else:  # pending
                deps = [end_of(a) for a in n.after]
                t0 = max(deps, default=pr.prog.start)
                if t0 == math.inf:
                    t = math.inf
                else:
                    t0 = max(t0, sim.now)
                    if n.kind == "call" and n.model in idx:
                        arrivals.append((t0, self._model_index[n.model]))
                    t = t0 + (n.duration if n.kind == "tool" else self._call_s(sim, n, None))
            end[nid] = t
            return t

        for nid in nodes:
            end_of(nid)
        pred.future[pid] = arrivals
        pred._version += 1  # what `need_within` memoised no longer holds

    @staticmethod
    def _call_s(sim, n, group) -> float:
        """The call's true compute on its group, or, not yet placed, on the fastest group holding
        its model's weights (else the fastest it may run on)."""
        m = sim.catalog.by_name.get(n.model)
        if m is None:
            return 0.0
        groups = [group] if group else ([c.group for c in sim.copies_of(n.model)] or sim.model_groups(m))
        return min((sim.cost.call_s(m, n.context_tokens, n.output_tokens, g) for g in groups), default=0.0)

    @property
    def _model_index(self):
        return self.core._model_index

    # every event that moves a program re-reads its future
    def on_program_start(self, sim, program):
        super().on_program_start(sim, program)
        self._foresee(sim, program.program)

    def on_call_arrive(self, sim, call):
        super().on_call_arrive(sim, call)
        self._foresee(sim, call.program)

    def on_call_end(self, sim, call):
        self.ended[(call.program, call.node)] = sim.now
        self._foresee(sim, call.program)
        return super().on_call_end(sim, call)

    def on_tool_start(self, sim, program, node, tool):
        self.started[(program.program, node)] = sim.now
        self._foresee(sim, program.program)
        return super().on_tool_start(sim, program, node, tool)

    def on_tool_end(self, sim, program, node, tool, duration_s):
        self.ended[(program.program, node)] = sim.now
        super().on_tool_end(sim, program, node, tool, duration_s)
        self._foresee(sim, program.program)

    def on_program_end(self, sim, program):
        super().on_program_end(sim, program)
        self._core(sim).predictor.future.pop(program.program, None)
