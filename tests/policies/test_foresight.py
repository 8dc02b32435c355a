"""`foresight` (`policies/foresight.py`): the lease planner told the trace's future. What it
foresees must be what then happens where nothing queues, a cancelled branch must drop out, and its
answers must keep the shape the planner reads."""

import math

import pytest

from statebudget.policies.foresight import FLOOR, Foresight
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from tests.helpers import call, catalog, cluster, program, tool, trace

TOOL_S, SIDE_S, U_S, LATER_S = 100.0, 5.0, 10.0, 500.0
LONG_OUT = 8000  # the call before c4 decodes for seconds: its end is foreseen from its compute
R_START, Z_OUT = TOOL_S + 15.0, 3000  # r's call on z holds the GPU while c3 arrives
V_S = 80.0  # v ends while c3 runs


# (hook, node of program p, name): after the hook has run on that node, what was foreseen is kept
WATCHED = [("on_tool_start", "t", "tool t starts"), ("on_tool_end", "v", "v ends"), ("on_call_end", "side", "side ends"),
           ("on_call_cancelled", "spec", "spec cancelled"), ("on_call_admitted", "c3", "c3 admitted")]


class _Watched(Foresight):
    """Keeps what the predictor foresaw for program p at the events in `WATCHED`."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, tuple] = {}

    def _keep(self, sim, what):
        if what not in self.seen:
            pred = self.core.predictor
            self.seen[what] = (sim.now, sorted(pred.future.get("p", [])), pred.need_within(sim.now, 30.0)[1].copy(),
                               pred.model_need_within(sim.now, 30.0).copy(), pred.model_need_within(sim.now, 200.0).copy())


def _watching(hook: str, node: str, what: str):
    def watched(self, sim, first, *rest):
        out = getattr(Foresight, hook)(self, sim, first, *rest)
        # a call hook gets the call; a tool hook the program, then the node
        program, nid = (first.program, first.node) if hasattr(first, "node") else (first.program, rest[0])
        if (program, nid) == ("p", node):
            self._keep(sim, what)
        return out
    return watched


for _hook, _node, _what in WATCHED:
    setattr(_Watched, _hook, _watching(_hook, _node, _what))


def _trace():
    # p: c1 (a), then a 100 s tool t and, beside it, a short tool and a call on b ("side"); after t
    # c2 (b), a short tool u, then c3 (c, long), then c4 (a); beside them a tool v ends while c3
    # runs. After side ends, "spec" (on c) is cancelled. r's long call on z fills the GPU while u
    # runs, so c3 waits for HBM room.
    # q starts later and calls d, which nothing else calls.
    return trace(program("p", [call("c1", "a"), tool("t", ["c1"], duration=TOOL_S),
                               tool("s", ["c1"], duration=SIDE_S), call("side", "b", ["s"]),
                               tool("w", ["c1"], duration=SIDE_S * 4), call("spec", "c", ["w"]),
                               call("c2", "b", ["t"]), tool("u", ["c2"], duration=U_S),
                               tool("v", ["c2"], duration=V_S),
                               call("c3", "c", ["u"], out=LONG_OUT), call("c4", "a", ["c3"])],
                         cancel=[{"node": "spec", "at_after": "side"}]),
                 program("r", [call("z1", "z", out=Z_OUT)], start=R_START),
                 program("q", [call("d1", "d")], start=LATER_S))


def _run():
    pol = _Watched()
    cat = catalog(("a", 10.0), ("b", 10.0), ("c", 10.0), ("d", 10.0), ("z", 25.0))
    sim = Simulator(cluster(gpus=1, hbm_gb=30.0), cat, _trace(), pol, config=SimConfig(seed=1, start="warm"))
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


def test_the_call_after_a_waiting_one_is_foreseen_from_its_admission(run):
    pol, sim = run
    idx = pol.core._model_index
    calls = sim.programs["p"].calls
    c3 = calls["c3"]
    assert c3.admitted > c3.arrive + 5.0, "the test needs c3 to wait for HBM room (r's call holds it)"
    t_adm, future, *_ = pol.seen["c3 admitted"]
    assert t_adm == pytest.approx(c3.admitted)
    compute = c3.end - c3.start
    assert compute > 5.0, "the test needs a call that runs for a while"
    c4 = [t for t, m in future if m == idx["a"]]
    assert c4 == [pytest.approx(t_adm + compute, abs=0.01)], "admitted, not yet started: from now"
    # c3 then loads c's weights before it starts, which foresight does not see
    assert c3.start > c3.admitted
    assert 0.0 <= calls["c4"].arrive - c4[0] < 2.0


def test_the_call_after_a_running_one_is_foreseen_from_its_start(run):
    pol, sim = run
    idx = pol.core._model_index
    calls = sim.programs["p"].calls
    c3 = calls["c3"]
    t_v, future, *_ = pol.seen["v ends"]
    assert c3.start < t_v < c3.end, "the test needs v to end while c3 runs"
    c4 = [t for t, m in future if m == idx["a"]]
    assert c4 == [pytest.approx(c3.start + (c3.end - c3.start), abs=0.01)]
    assert calls["c4"].arrive == pytest.approx(c4[0], abs=0.01)


def test_need_is_one_within_the_horizon_and_falls_past_it(run):
    pol, _ = run
    idx = pol.core._model_index
    t0, future, near, models_near, models_far = pol.seen["tool t starts"]
    assert near.shape == (1, 5), "one live program (p) by five models"
    assert near[0, idx["b"]] == 1.0, "side's call on b is due within 30 s"
    assert near[0, idx["c"]] == 1.0, "spec on c is due within 30 s: its cancel is not foreseen"
    (c4,) = [t for t, m in future if m == idx["a"]]
    assert c4 - t0 > 120.0, "a is due only after c2 and c3"
    assert models_near[idx["a"]] == pytest.approx(max(FLOOR, math.exp(-(c4 - t0 - 30.0) / 30.0)))
    assert models_near[idx["a"]] < 0.1


def test_programs_to_come_are_foreseen_from_their_start(run):
    pol, _ = run
    idx = pol.core._model_index
    t0, _, near, models_near, models_far = pol.seen["tool t starts"]
    assert near[0, idx["d"]] == 0.0, "no live program calls d"
    dt = LATER_S - t0  # q starts then and calls d at once
    assert 200.0 < dt < 4 * 200.0
    assert models_far[idx["d"]] == pytest.approx(math.exp(-(dt - 200.0) / 200.0)), "on the tail 200 s ahead"
    assert models_near[idx["d"]] == FLOOR, "30 s ahead it is too far to count"


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
