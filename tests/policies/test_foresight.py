"""`foresight` (`policies/foresight.py`): the lease planner told the trace's future. What it
foresees must be what then happens where nothing queues, and its answers must keep the shape the
planner reads."""

import math

import pytest

from statebudget.policies import REGISTRY, SEES_FUTURE
from statebudget.policies.foresight import FLOOR, Foresight
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from tests.helpers import call, catalog, cluster, program, tool, trace

TOOL_S, LATER_S = 100.0, 500.0


class _Watched(Foresight):
    """Keeps what the predictor foresaw for program p when its tool started."""

    def __init__(self):
        super().__init__()
        self.at_tool = None

    def on_tool_start(self, sim, prog, node, tool_name):
        out = super().on_tool_start(sim, prog, node, tool_name)
        if prog.program == "p" and self.at_tool is None:
            pred = self.core.predictor
            self.at_tool = (sim.now, list(pred.future["p"]), pred.need_within(sim.now, 30.0)[1].copy(),
                            pred.need_within(sim.now, 120.0)[1].copy(),
                            pred.model_need_within(sim.now, 30.0).copy(), pred.model_need_within(sim.now, 600.0).copy())
        return out


def _run():
    tr = trace(program("p", [call("c1", "a"), tool("t", ["c1"], duration=TOOL_S), call("c2", "b", ["t"])]),
               program("q", [call("d1", "c")], start=LATER_S))
    pol = _Watched()
    sim = Simulator(cluster(gpus=1, hbm_gb=80.0), catalog(("a", 10.0), ("b", 10.0), ("c", 10.0)), tr, pol,
                    config=SimConfig(seed=1, start="warm"))
    res = sim.run()
    return pol, sim, res


def test_foresight_sees_when_the_call_after_a_tool_arrives_and_on_which_model():
    pol, sim, _ = _run()
    t0, future, *_ = pol.at_tool
    c2 = sim.programs["p"].calls["c2"]
    idx = pol.core._model_index
    assert future == [(pytest.approx(t0 + TOOL_S), idx["b"])], "one pending call, on b, when the tool ends"
    assert c2.arrive == pytest.approx(t0 + TOOL_S), "and it arrives then: nothing queues on this cluster"


def test_need_is_one_within_the_horizon_and_falls_past_it():
    pol, _, _ = _run()
    _, _, near, far, models_near, models_far = pol.at_tool
    idx = pol.core._model_index
    assert near.shape == far.shape == (1, 3), "one live program (p) by three models"
    assert near[0, idx["b"]] == pytest.approx(math.exp(-(TOOL_S - 30.0) / 30.0)), "due 70 s past a 30 s horizon"
    assert far[0, idx["b"]] == 1.0 and far[0, idx["a"]] == 0.0, "b within 120 s; a is not called again"
    # q starts at 500 s and calls c at once: within 600 s it is needed, within 30 s hardly
    assert models_far[idx["c"]] == 1.0
    assert models_near[idx["c"]] == pytest.approx(max(FLOOR, math.exp(-(LATER_S - pol.at_tool[0] - 30.0) / 30.0)))
    assert models_near[idx["a"]] == FLOOR, "nothing foreseen: the floor, so warm state is kept while room lasts"


def test_foresight_is_a_reference_not_a_contender():
    assert set(SEES_FUTURE) == {"oracle", "foresight"}
    assert not any(REGISTRY[p].sees_future for p in REGISTRY if p not in SEES_FUTURE)
