"""The oracle's replays of a MILP schedule (`policies/oracle.py`) and of the small-trace schedule
(`policies/follow.py`): what an arrival prefetches and what a prefetch may evict, on hand-made
schedules."""

from types import SimpleNamespace as NS

import numpy as np

from statebudget.core.decisions import Promote
from statebudget.policies.follow import FollowSchedule
from statebudget.policies.oracle import Oracle, next_uses

A, B = (0,), (1,)  # two single-GPU groups


def _oracle(lead: int, held: dict[tuple, list[int]], T: int = 8) -> Oracle:
    """An oracle over objects (model name, group), each one weights key on its group, in HBM in
    the slots `held` gives; the rest as `_prepare` makes it from a solved MILP."""
    o = Oracle(lead=lead)
    objs = sorted(held)
    o.inst = NS(T=T)
    o.x = np.zeros((len(objs), T))
    o.y = np.zeros((len(objs), T))
    for i, ob in enumerate(objs):
        o.x[i, held[ob]] = 1.0
    o.keys = [[("w", n)] for n, _ in objs]
    o.group_of = [g for _, g in objs]
    o.obj_of = {(("w", n), g): i for i, (n, g) in enumerate(objs)}
    o.next_use = next_uses(o.x)
    return o


def _promoted(o: Oracle, t: int) -> set[tuple]:
    sim = NS(tiers=NS(gpu={}), gpus=[NS(node="n0"), NS(node="n0")])
    return {(d.key[1], d.group) for d in o._plan_for(sim, t) if isinstance(d, Promote)}


def test_next_uses_gives_the_first_slot_held_from_each_slot_on():
    x = np.array([[0, 1, 0, 0, 1], [0, 0, 0, 0, 0]], float)
    assert next_uses(x) == [[1, 1, 4, 4, 4, np.inf], [np.inf] * 6]


def test_an_arrival_prefetches_what_the_schedule_holds_in_the_next_lead_slots():
    held = {("a", A): [2], ("b", A): [5], ("c", A): [6], ("d", A): [7]}
    assert _promoted(_oracle(1, held), 2) == {("a", A)}, "one slot ahead, as the plan has it"
    assert _promoted(_oracle(4, held), 2) == {("a", A), ("b", A)}, "slots 2..5: not 6, the first past the lead"
    assert _promoted(_oracle(64, held), 2) == {("a", A), ("b", A), ("c", A), ("d", A)}


def test_a_prefetch_evicts_only_what_the_schedule_needs_later_on_the_group_it_goes_to():
    # b is needed on group A at slot 5 and on group B at slot 2
    o = _oracle(64, {("a", A): [3], ("b", A): [5], ("b", B): [2], ("c", A): [7], ("e", A): [5]})
    o.ptr = 1  # next slot 2

    def may(victim, key, group):
        return o.may_evict_for_prefetch(None, NS(key=("w", victim), group=A), ("w", key), group)

    assert may("c", "b", A), "c (slot 7) is needed after b on A (slot 5)"
    assert not may("a", "b", A), "a (slot 3) is needed before b on A, though b is needed at 2 on B"
    assert not may("e", "b", A), "a tie keeps what is there"
    assert may("z", "b", A), "z: not in the schedule"
    assert may("a", "z", A) and may("a", "b", (2,)), "a prefetch the schedule does not make"


def test_the_small_trace_replay_weighs_a_prefetch_by_its_own_groups_schedule():
    # a (tp 1, on GPU 0) is next needed at 5 s; b is prefetched onto the tp-2 group (0, 1)
    fs = FollowSchedule.__new__(FollowSchedule)
    fs.plan = {("p1", "c1"): ((0,), 5.0, 6.0)}
    fs.uses, fs.ptr = {((0,), ("m", "a")): [("p1", "c1")]}, {}
    o = Oracle()
    o.bound, o.follow = object(), fs  # a small trace: the oracle asks the replay of the relaxation
    sim, victim = NS(programs={}), NS(key=("w", "a"), group=(0,))

    def may(key, need_s):
        fs.need = {(("w", "b"), (0, 1)): need_s}
        return o.may_evict_for_prefetch(sim, victim, ("w", key), (0, 1))

    assert may("b", 2.0), "b is needed on (0, 1) at 2 s, before a at 5 s"
    assert not may("b", 9.0), "a is needed first"
    assert not may("z", 2.0), "z: a prefetch the schedule does not make"
