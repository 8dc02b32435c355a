"""`foresight`: the production planner (statebudget-lease) with the trace's future in place of its
forecast. A reference, like the oracle: it SEES THE FUTURE and is never a contender.

It answers one question the fair table cannot: how much of the gap to the best baseline is
prediction, and how much is what the planner does with a prediction (its layout, its budget, its
eviction order). Everything but the predictor's answer is statebudget-lease's, unchanged.

What it knows that the forecast does not: for each live program, which models its pending calls
are on and when each will arrive, from the program's progress in the replay, its DAG and tool
durations, and its calls' true compute (on their group once admitted, before that on the fastest
group holding the model's weights); and which programs will start, with their calls' arrivals
as if nothing queued. P(model m is needed within h) is 1 for a call due within h and falls past
it (`_soon`). What it does not know: how long calls will queue or stall, so an arrival time is an
estimate, re-read at each of the program's events, and a call already due counts as needed now.
Cancels are not foreseen: a cancelled branch drops out when it is cancelled.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ..planner.predictor import Predictor
from ..traces.graph import in_order
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
    and `start_times` / `start_calls` (the programs to come, by start, with their calls' arrivals
    if nothing queued) instead of the switch matrix and the tool-wait model; the rest (leases'
    deadlines, hints' bookkeeping) is the forecast's."""

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
        # programs starting more than four horizons ahead are left out: each would add under e^-3
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
        self.started: dict[str, dict[str, float]] = {}  # program -> tool node -> when it started
        self.order: dict[str, list] = {}                # program -> its nodes, each after its dependencies

    def _core(self, sim):
        if self.core is None:
            core = super()._core(sim)
            pred = ForesightPredictor(core.models)
            pred.lookahead = core.predictor.lookahead
            core.predictor = pred
            rows = sorted(((p.start, p.program, self._arrivals(sim, p, None, p.start)) for p in sim.trace.programs),
                          key=lambda r: (r[0], r[1]))
            pred.start_times = [r[0] for r in rows]
            pred.start_calls = [r[2] for r in rows]
        return self.core

    def _arrivals(self, sim, prog, pr, now: float) -> list[tuple[float, int]]:
        """(arrival, model index) of each call of `prog` not yet arrived, as the replay has the
        program now (`pr`, its `ProgRun`; None: not started, every node pending): a pending node
        comes when its last dependency ends, a tool ends its duration after it started, a call its
        compute after it started (or from now, not started yet)."""
        idx = self.core._model_index
        pid = prog.program
        started = self.started.get(pid, {})
        end: dict[str, float] = {}
        out = []
        for n in self._topological(prog):
            st = pr.node_state[n.id] if pr is not None else "pending"
            if st == "cancelled":
                t = math.inf
            elif st == "done":  # in the past: what depends on it comes from now on
                t = now
            elif st == "running" and n.kind == "tool":
                t = started.get(n.id, now) + n.duration
            elif st == "running":
                c = pr.calls[n.id]
                t = max(now, (c.start if c.start >= 0 else now) + self._call_s(sim, n, c.group))
            else:  # pending
                t0 = max((end[a] for a in n.after), default=prog.start)
                if t0 < math.inf:  # at or after now: what is done or running ends no earlier
                    if n.kind == "call" and n.model in idx:
                        out.append((t0, idx[n.model]))
                    t = t0 + (n.duration if n.kind == "tool" else self._call_s(sim, n, None))
                else:
                    t = math.inf
            end[n.id] = t
        return out

    def _topological(self, prog) -> list:
        order = self.order.get(prog.program)
        if order is None:
            order = self.order[prog.program] = in_order(prog)
        return order

    def _foresee(self, sim, pid: str) -> None:
        """Re-reads the program's pending calls; the predictor's memo no longer holds."""
        pr = sim.programs.get(pid)
        pred = self._core(sim).predictor
        if pr is None or pr.end >= 0:
            pred.future.pop(pid, None)
        else:
            pred.future[pid] = self._arrivals(sim, pr.prog, pr, sim.now)
        pred._version += 1

    @staticmethod
    def _call_s(sim, n, group) -> float:
        """The call's true compute on its group, or, not yet placed, on the fastest group holding
        its model's weights (else the fastest it may run on)."""
        m = sim.catalog.by_name.get(n.model)
        if m is None:
            return 0.0
        groups = [group] if group else ([c.group for c in sim.copies_of(n.model)] or sim.model_groups(m))
        return min((sim.cost.call_s(m, n.context_tokens, n.output_tokens, g) for g in groups), default=0.0)

    # every event that moves a program re-reads its future
    def on_program_start(self, sim, program):
        super().on_program_start(sim, program)
        self._foresee(sim, program.program)

    def on_call_arrive(self, sim, call):
        super().on_call_arrive(sim, call)
        self._foresee(sim, call.program)

    def on_call_admitted(self, sim, call):
        self._foresee(sim, call.program)
        return super().on_call_admitted(sim, call)

    def on_call_end(self, sim, call):
        self._foresee(sim, call.program)
        return super().on_call_end(sim, call)

    def on_call_cancelled(self, sim, call):
        out = super().on_call_cancelled(sim, call)
        self._foresee(sim, call.program)
        return out

    def on_tool_start(self, sim, program, node, tool):
        self.started.setdefault(program.program, {})[node] = sim.now
        self._foresee(sim, program.program)
        return super().on_tool_start(sim, program, node, tool)

    def on_tool_end(self, sim, program, node, tool, duration_s):
        super().on_tool_end(sim, program, node, tool, duration_s)
        self._foresee(sim, program.program)

    def on_program_end(self, sim, program):
        super().on_program_end(sim, program)
        for book in (self.started, self.order):
            book.pop(program.program, None)
        self._foresee(sim, program.program)
