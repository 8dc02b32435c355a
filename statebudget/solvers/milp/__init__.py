"""The offline MILP oracle: with the whole trace known, where should each state object be in each
time slot, to minimise total stall plus λ x bytes moved? The formulation (data, variables,
constraints, objective) is written out at the top of `model.py`.

    instance.py    the instance and solution dataclasses, affinities, object names
    model.py       the formulation, `solve`, and the brute-force check of tiny instances
    backends.py    OR-Tools (SCIP, CP-SAT) and PuLP (HiGHS, CBC) behind one interface
    heuristics.py  `evaluate` (the checker), the greedy schedule and its `Guide`, the static knapsack
    build.py       `build_instance` from a cluster, catalog and trace
    rolling.py     the rolling horizon (`solve_rolling`) and `oracle_summary`
"""

from .build import build_instance
from .heuristics import Guide, evaluate, greedy_schedule, solve_static
from .instance import Call, Instance, Obj, Solution, affinity, chosen, object_model
from .model import brute_force, solve
from .rolling import oracle_summary, solve_rolling

__all__ = ["Call", "Guide", "Instance", "Obj", "Solution", "affinity", "brute_force", "build_instance", "chosen",
           "evaluate", "greedy_schedule", "object_model", "oracle_summary", "solve", "solve_rolling", "solve_static"]
