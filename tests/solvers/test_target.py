"""The forecast MILP (`solvers/target.py`): it beats the value-per-byte greedy where packing
matters, keeps one home per model and every GPU's capacity, and is deterministic."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from statebudget.solvers.target import TargetProblem, greedy_target, solve_target


def _check(p: TargetProblem, chosen: list[int]) -> None:
    models = [p.model[i] for i in chosen]
    assert len(models) == len(set(models)), "a model got two target homes"
    load = np.zeros(len(p.cap))
    for i in chosen:
        load[list(p.groups[i])] += p.per_gpu[i]
    assert (load <= p.cap + 1e-6).all(), f"GPU over capacity: {load} > {p.cap}"


def test_packing_beats_greedy_by_density():
    # one 10-byte GPU: greedy takes the densest item (6 bytes, value 7) and then nothing fits;
    # the optimum is the two 5-byte items (value 5 + 5)
    p = TargetProblem(model=[0, 1, 2], groups=[(0,), (0,), (0,)], per_gpu=np.array([6.0, 5.0, 5.0]),
                      value=np.array([7.0, 5.0, 5.0]), cap=np.array([10.0]))
    assert greedy_target(p) == [0]
    sol = solve_target(p)
    assert sol.status == "optimal" and sol.chosen == [1, 2] and sol.objective == 10.0
    assert sol.bound >= sol.objective - 1e-9


def test_one_home_per_model_and_negative_values_left_out():
    p = TargetProblem(model=[0, 0, 1], groups=[(0,), (1,), (1,)], per_gpu=np.array([1.0, 1.0, 1.0]),
                      value=np.array([3.0, 2.0, -1.0]), cap=np.array([5.0, 5.0]))
    sol = solve_target(p)
    assert sol.chosen == [0]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 2),
                                             st.floats(0.5, 8.0), st.floats(-1.0, 10.0)), min_size=1, max_size=12))
def test_milp_is_feasible_no_worse_than_greedy_and_deterministic(n_gpu, rows):
    groups = [tuple(sorted({g % n_gpu, (g + w - 1) % n_gpu})) for _, g, w, _, _ in rows]
    p = TargetProblem(model=[m for m, *_ in rows], groups=groups, per_gpu=np.array([b for *_, b, _ in rows]),
                      value=np.array([v for *_, v in rows]), cap=np.full(n_gpu, 8.0))
    sol = solve_target(p)
    _check(p, sol.chosen)
    _check(p, greedy_target(p))
    assert sol.objective >= sum(p.value[i] for i in greedy_target(p)) - 1e-9
    assert solve_target(p).chosen == sol.chosen
