"""`foresight` (`policies/foresight.py`): the lease planner told the trace's future. What it
foresees must be what then happens where nothing queues, a cancelled branch must drop out, and its
answers must keep the shape the planner reads."""

import math

import pytest

from statebudget.policies.foresight import FLOOR, Foresight
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from tests.helpers import call, catalog, cluster, program, tool, trace

TOOL_S, SIDE_S, LATER_S = 100.0, 5.0, 500.0
LONG_OUT = 8000  # the call before c4 decodes for seconds: its end is foreseen from its compute


class _Watched(Foresight):
    """Keeps what the predictor foresaw for program p at some of its events."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, tuple] = {}

    def _keep(self, sim, what):
        if what not in self.seen:
            pred = self.core.predictor
            self.seen[what] = (sim.now, sorted(pred.future.get("p", [])), pred.need_within(sim.now, 30.0)[1].copy(),
                               pred.model_need_within(sim.now, 30.0).copy(), pred.model_need_within(sim.now, 200.0).copy())

    def on_tool_start(self, sim, prog, node, tool_name):
        out = super().on_tool_start(sim, prog, node, tool_name)
        if prog.program == "p" and node == "t":
            self._keep(sim, "tool t starts")
        return out

    def on_call_end(self, sim, c):
        out = super().on_call_end(sim, c)
        if (c.program, c.node) == ("p", "side"):
            self._keep(sim, "side ends")
        return out

    def on_call_cancelled(self, sim, c):
        out = super().on_call_cancelled(sim, c)
        if (c.program, c.node) == ("p", "spec"):
            self._keep(sim, "spec cancelled")
        return out

    def on_call_admitted(self, sim, c):
        out = super().on_call_admitted(sim, c)
        if (c.program, c.node) == ("p", "c3"):
            self._keep(sim, "c3 admitted")
        return out


def _trace():
    # p: c1 (a), then a 100 s tool t and, beside it, a short tool and a call on b ("side"); after t
    # c2 (b), then c3 (c, long), then c4 (a). After side ends, "spec" (on c) is cancelled.
    # q starts later and calls c at once.
    return trace(program("p", [call("c1", "a"), tool("t", ["c1"], duration=TOOL_S),
                               tool("s", ["c1"], duration=SIDE_S), call("side", "b", ["s"]),
                               tool("w", ["c1"], duration=SIDE_S * 4), call("spec", "c", ["w"]),
                               call("c2", "b", ["t"]), call("c3", "c", ["c2"], out=LONG_OUT), call("c4", "a", ["c3"])],
                         cancel=[{"node": "spec", "at_after": "side"}]),
                 program("q", [call("d1", "c")], start=LATER_S))


def _run():
    pol = _Watched()
    sim = Simulator(cluster(gpus=1, hbm_gb=80.0), catalog(("a", 10.0), ("b", 10.0), ("c", 10.0)), _trace(), pol,
                    config=SimConfig(seed=1, start="warm"))
    sim.run()
    return pol, sim


@pytest.fixture(scope="module")
def run():
    return _run()


def test_the_call_after_a_tool_is_foreseen_when_the_tool_ends_even_from_another_branch(run):
    pol, sim = run
    idx = pol.core._model_index
    calls = sim.programs["p"].calls
    t_start, future, *_ = pol.seen["tool t starts"]
    assert (pytest.approx(t_start + TOOL_S), idx["b"]) in future, "c2 on b when t ends"
    # side ends seconds later: t is still running, and c2 still comes when t ends, not 100 s on
    t_side, future, *_ = pol.seen["side ends"]
    assert t_side > t_start + 1.0
    c2 = [t for t, m in future if m == idx["b"]]
    assert c2 == [pytest.approx(t_start + TOOL_S)]
    assert calls["c2"].arrive == pytest.approx(t_start + TOOL_S), "and it arrives then: nothing queues here"


def test_a_cancelled_branch_drops_out_of_the_future(run):
    pol, sim = run
    idx = pol.core._model_index
    assert sim.programs["p"].node_state["spec"] == "cancelled"
    _, before, *_ = pol.seen["side ends"]
    _, after, *_ = pol.seen["spec cancelled"]
    assert len([t for t, m in before if m == idx["c"]]) == 2, "cancels are not foreseen: spec and c3 on c"
    assert len([t for t, m in after if m == idx["c"]]) == 1, f"only c3 is left once spec is cancelled: {after}"


def test_the_call_after_a_running_one_is_foreseen_from_its_compute(run):
    pol, sim = run
    idx = pol.core._model_index
    calls = sim.programs["p"].calls
    t_adm, future, *_ = pol.seen["c3 admitted"]
    compute = calls["c3"].end - calls["c3"].start
    assert compute > 5.0, "the test needs a call that runs for a while"
    c4 = [t for t, m in future if m == idx["a"]]
    assert c4 == [pytest.approx(t_adm + compute, abs=0.01)], "admitted, not yet started: from now"
    # c3 loads its weights before it starts, which foresight does not see
    assert 0.0 <= calls["c4"].arrive - c4[0] < 2.0


def test_need_is_one_within_the_horizon_and_falls_past_it(run):
    pol, _ = run
    idx = pol.core._model_index
    t0, future, near, models_near, models_far = pol.seen["tool t starts"]
    assert near.shape == (1, 3), "one live program (p) by three models"
    assert near[0, idx["b"]] == 1.0, "side's call on b is due within 30 s"
    assert near[0, idx["c"]] == pytest.approx(math.exp(-(SIDE_S * 4 - 30.0) / 30.0) if SIDE_S * 4 > 30 else 1.0)
    # q starts at 500 s and calls c at once: 30 s ahead hardly, 200 s ahead on the tail
    dt = LATER_S - t0
    assert models_far[idx["c"]] >= math.exp(-(dt - 200.0) / 200.0) - 1e-12
    (c4,) = [t for t, m in future if m == idx["a"]]
    assert c4 - t0 > 120.0, "a is due only after c2 and c3"
    assert models_near[idx["a"]] == pytest.approx(max(FLOOR, math.exp(-(c4 - t0 - 30.0) / 30.0)))
    assert models_near[idx["a"]] < 0.1


def test_a_future_re_read_is_never_answered_from_the_memo():
    pol = Foresight()
    sim = Simulator(cluster(gpus=1, hbm_gb=80.0), catalog(("a", 10.0), ("b", 10.0)), _two_model_trace(), pol,
                    config=SimConfig(seed=1, start="warm"))
    pred = pol._core(sim).predictor
    pred.program_started("x", "t0", 0.0)
    pred.future["x"] = [(5.0, 1)]
    assert pred.need_within(0.0, 30.0)[1][0, 1] == 1.0
    pol._foresee(sim, "x")  # x is no program of the replay: nothing is foreseen for it
    assert pred.need_within(0.0, 30.0)[1][0, 1] == 0.0


def _two_model_trace():
    return trace(program("p", [call("c1", "a"), tool("t", ["c1"], duration=10.0), call("c2", "b", ["t"])]))
