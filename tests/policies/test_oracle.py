"""The oracle's replay of a MILP schedule (`policies/oracle.py`): what an arrival prefetches and
what a prefetch may evict, on a hand-made schedule."""

from types import SimpleNamespace as NS

import numpy as np

from statebudget.core.decisions import Promote
from statebudget.policies.oracle import Oracle


def _oracle(lead: int, held: dict[str, list[int]], T: int = 8) -> Oracle:
    """An oracle over objects "a", "b", ... (one state key each, on group (0,)), in HBM in the
    slots `held` gives; next uses as `_prepare` computes them."""
    o = Oracle(lead=lead)
    names = sorted(held)
    o.inst = NS(T=T)
    o.x = np.zeros((len(names), T))
    o.y = np.zeros((len(names), T))
    for i, n in enumerate(names):
        o.x[i, held[n]] = 1.0
    o.keys = [[("w", n)] for n in names]
    o.group_of = [(0,)] * len(names)
    o.obj_of = {(("w", n), (0,)): i for i, n in enumerate(names)}
    o.objs_of_key = {("w", n): [i] for i, n in enumerate(names)}
    o.next_use = []
    for i in range(len(names)):
        nxt = [float("inf")] * (T + 1)
        for t in range(T - 1, -1, -1):
            nxt[t] = t if o.x[i, t] > 0.5 else nxt[t + 1]
        o.next_use.append(nxt)
    return o


def _promoted(o: Oracle, t: int) -> set[str]:
    sim = NS(tiers=NS(gpu={}), gpus=[NS(node="n0")])
    return {d.key[1] for d in o._plan_for(sim, t) if isinstance(d, Promote)}


def test_an_arrival_prefetches_what_the_schedule_holds_in_the_next_lead_slots():
    held = {"a": [2], "b": [5], "c": [7]}
    assert _promoted(_oracle(1, held), 2) == {"a"}, "one slot ahead, as the plan has it"
    assert _promoted(_oracle(4, held), 2) == {"a", "b"}
    assert _promoted(_oracle(64, held), 2) == {"a", "b", "c"}


def test_a_prefetch_evicts_only_what_the_schedule_needs_later():
    o = _oracle(64, {"a": [2], "b": [5], "c": [7]})
    o.ptr = 1  # next slot 2

    def victim(n):
        return NS(key=("w", n), group=(0,))
    assert o.may_evict_for_prefetch(None, victim("c"), ("w", "b")), "c is needed after b"
    assert not o.may_evict_for_prefetch(None, victim("a"), ("w", "b")), "a is needed before b"
    assert o.may_evict_for_prefetch(None, NS(key=("w", "z"), group=(0,)), ("w", "b")), "z: not in the schedule"
    assert o.may_evict_for_prefetch(None, victim("a"), ("w", "z")), "a prefetch the schedule does not know"
