"""`WaitingSums`: the queue summed per group as calls join and leave and estimates move must be the
queue summed afresh, whatever the order of the changes (calls rejoining after they left included,
anew or, as one routed again after a refusal, with their first arrival)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from statebudget.planner.overload import QueueLoad
from statebudget.sim.calls import CallRec
from statebudget.sim.waiting import WaitingSums

GROUPS = ((0,), (1,), (0, 1), (2, 3))
MODELS = ("a", "b")


def _call(i: int, model: str, group) -> CallRec:
    return CallRec(program=f"p{i}", node="x", model=model, context_tokens=100 * (i + 1), output_tokens=1,
                   max_tokens=10, tenant="t", slo="interactive", handoff=False, hinted=False, group=group)


ops = st.lists(st.tuples(st.sampled_from(["join", "rejoin", "leave", "estimate"]), st.integers(0, 11)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_kept_sums_are_the_fresh_sums(steps):
    calls = [_call(i, MODELS[i % 2], GROUPS[i % len(GROUPS)]) for i in range(12)]
    counts = {m: 0 for m in MODELS}
    run = lambda c: c.context_tokens / 7.0 * (1 + counts[c.model])  # noqa: E731, moves with the estimate

    def runs(model, groups, got):
        assert len(groups) == len(got) and all(c.model == model and c.group == g for c, g in zip(got, groups))
        return np.array([run(c) for c in got])
    sums, waiting, seq, now = WaitingSums(4), [], 0, 0.0
    for op, i in steps:
        c, now = calls[i], now + 1.0
        if op in ("join", "rejoin") and c not in waiting:
            seq += 1
            c.arrive, c.seq = now if op == "join" or c.arrive < 0 else c.arrive, seq
            waiting.append(c)
            sums.add(c, run(c))
        elif op == "leave" and c in waiting:
            waiting.remove(c)
            sums.discard(c)
        elif op == "estimate":
            counts[c.model] += 1
        kept = sums.load(counts, runs)
        depth = {}
        for w in waiting:
            depth[(w.model, w.group)] = depth.get((w.model, w.group), 0) + 1
        assert sums.depth() == depth
        oldest = {}
        for w in waiting:
            oldest[(w.model, w.group)] = min(oldest.get((w.model, w.group), math.inf), w.arrive)
        assert sums.oldest() == oldest
        if not waiting:
            assert kept is None
            continue
        by_group = {}
        for w in waiting:
            n, total, first = by_group.get(w.group, (0, 0.0, math.inf))
            by_group[w.group] = (n + 1, total + run(w), min(first, w.arrive))
        fresh = QueueLoad.of(4, by_group)
        assert kept.waiting == fresh.waiting and kept.first_s == fresh.first_s
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(kept.queued_s, fresh.queued_s))


def test_a_call_routed_again_after_a_refusal_joins_in_its_place_by_arrival():
    first, later = _call(0, "a", (0,)), _call(4, "a", (0,))
    first.arrive, later.arrive = 1.0, 2.0
    sums = WaitingSums(4)
    sums.add(later, 5.0)
    sums.add(first, 5.0)  # refused elsewhere, it joins after `later` with its first arrival
    assert sums.oldest() == {("a", (0,)): 1.0}
    assert sums.load({"a": 0}, lambda model, groups, got: np.full(len(got), 5.0)).first_s[0] == 1.0
