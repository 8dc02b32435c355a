"""Choosing a layout from history (`sim/layouts.py`): the first layout, its neighbours, and the
descent's rules (replays stubbed by a score of the layout)."""

from collections import Counter

import pytest

from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.homes import layout as checked
from statebudget.sim import layouts
from statebudget.sim.layouts import first_layout, learned_layout, neighbours, search

CL, CAT = load_cluster("hetero16"), load_catalog("agent-team")  # GPUs 0-7 RTX 3090, 8-11 L40, 12-15 A100
SHARES = Counter({"reviewer": 30, "coder": 20, "planner": 18, "summarizer": 17, "fast-coder": 16, "reasoner": 4})


def _gpus(lay):
    return [i for _, g in lay for i in g]


def test_the_first_layout_puts_the_widest_first_on_the_fastest_free_groups_and_skips_uncalled_models():
    lay = first_layout(CL, CAT, SHARES)
    homes = dict(lay)
    checked(CAT, CL, lay)  # every entry is one the planner takes
    assert "vlm" not in homes, "the history never calls it"
    assert homes["reasoner"] == (12, 13, 14, 15), "the widest model takes the fastest node"
    assert homes["coder"] == (8, 9) and homes["reviewer"] == (10,)
    assert homes["planner"] == (11,), "of the models any GPU holds, the most called gets the last fast GPU"
    assert len(_gpus(lay)) == len(set(_gpus(lay))), "no GPU is shared"
    assert [n for n, _ in lay] == [m.name for m in CAT.models if m.name in homes], "catalog order"


def test_neighbours_swap_move_and_drop_and_each_is_a_layout_the_planner_takes():
    lay = first_layout(CL, CAT, SHARES)
    homes = dict(lay)
    near = neighbours(CL, CAT, lay)
    assert lay not in near and len(near) == len(set(near))
    for cand in near:
        checked(CAT, CL, cand)
        assert len(_gpus(cand)) == len(set(_gpus(cand)))
    swapped = {**homes, "planner": homes["fast-coder"], "fast-coder": homes["planner"]}
    assert tuple((n, swapped[n]) for n, _ in lay) in near
    assert not any(dict(c).get("coder") == homes["planner"] for c in near), "a tp-2 model never takes one GPU"
    assert not any(dict(c).get("reviewer", (10,))[0] < 8 for c in near), "30 GB does not fit an RTX 3090"
    assert tuple((n, g) for n, g in lay if n != "summarizer") in near


def test_neighbours_leave_the_models_on_the_slowest_gpus_to_the_planner_first():
    lay = (("coder", (10, 11)), ("reviewer", (8,)), ("reasoner", (12, 13, 14, 15)), ("fast-coder", (9,)),
           ("planner", (0,)), ("summarizer", (1,)))
    near = neighbours(CL, CAT, lay)
    assert near[:2] == [(("reasoner", (12, 13, 14, 15)),), lay[:4]], "the A100s' alone, then the A100s' and L40s'"


def _stub(monkeypatch, handoff, ttft, baselines=None, ran=None):
    """Replays replaced by figures of the layout: handoff(lay) and ttft(lay) seconds, program P95
    100 s; a policy of `baselines` gets its (handoff, TTFT[, calls dropped]); records each batch of layouts (of
    policies, for baselines); no layout's rows say its calls ran as `ran` (`groups_by_model`)."""
    batches = []
    baselines = baselines or {}

    def run_local(jobs, workers=None, progress=None):
        lays = []
        for j in jobs:
            lay = j["policy"] if j["policy"] in baselines else (j.get("planner") or {}).get("homes")
            if lay not in lays:
                lays.append(lay)
        batches.append(lays)
        return [dict(j, handoff_p95_s=b[0] if b else handoff(lay), ttft_p95_s=b[1] if b else ttft(lay),
                     program_p95_s=100.0, groups_by_model=ran if lay is None and not b else {},
                     unplaceable_calls=b[2] if b and len(b) > 2 else 0)
                for j in jobs for lay, b in [((j.get("planner") or {}).get("homes"), baselines.get(j["policy"]))]]

    monkeypatch.setattr(layouts, "run_local", run_local)
    return batches


HISTORY = [{"cluster": "hetero16", "catalog": "agent-team", "trace": "swe-team", "seed": s, "hours": 0.25}
           for s in (1, 2)]


def test_the_search_descends_to_the_least_handoff_p95_within_the_ttft_tolerance(monkeypatch):
    def on_l40(lay, model):
        return lay is not None and dict(lay).get(model, (0,))[0] in (8, 9, 10, 11)

    # the fast-coder on an L40 halves handoff stall; the summarizer there costs TTFT
    batches = _stub(monkeypatch, lambda lay: 0.5 if on_l40(lay, "fast-coder") else 1.0,
                    lambda lay: 4.0 if on_l40(lay, "summarizer") else 3.0)
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.05)
    assert batches[0][0] is None, "no layout is replayed first, as the yardstick"
    assert not on_l40(found.tried[1].layout, "fast-coder"), "the first layout gives the L40 to the planner"
    assert found.chosen.means["handoff_p95_s"] == 0.5 and on_l40(found.chosen.layout, "fast-coder")
    assert not on_l40(found.chosen.layout, "summarizer")
    assert any(on_l40(s.layout, "summarizer") and not s.acceptable for s in found.tried), \
        "a layout over the TTFT tolerance was tried and not kept"
    assert found.planner_arg() == f"homes={found.chosen.layout!r}"
    assert len(found.tried) == sum(len(b) for b in batches) <= 41
    assert len({s.layout for s in found.tried}) == len(found.tried), "no layout replayed twice"


def test_the_search_keeps_no_layout_when_none_beats_it_and_respects_its_budget(monkeypatch):
    batches = _stub(monkeypatch, lambda lay: 1.0 if lay is None else 2.0, lambda lay: 3.0)
    found = search(CL, CAT, HISTORY, budget=5)
    assert found.chosen.layout is None and found.planner_arg() == ""
    assert sum(len(b) for b in batches) == 6, "no layout, the first, then four neighbours: the budget"
    with pytest.raises(ValueError, match="budget must be >= 2"):
        search(CL, CAT, HISTORY, budget=1)
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        search(CL, CAT, HISTORY, tolerance=-0.1)


def test_the_descent_moves_to_the_best_neighbour_through_layouts_worse_than_none(monkeypatch):
    def fast_coder_on_l40(lay):
        return dict(lay).get("fast-coder", (0,))[0] in (8, 9, 10, 11)

    def handoff(lay):  # no layout 1.0; the first layout 3.2; two steps reach 0.11 (each model left out: +0.01)
        if lay is None:
            return 1.0
        return 3.2 - 1.6 * ("vlm" not in dict(lay)) - 1.5 * fast_coder_on_l40(lay) + 0.01 * (7 - len(lay))

    batches = _stub(monkeypatch, handoff, lambda lay: 3.0)
    found = search(CL, CAT, HISTORY, budget=200)
    assert found.tried[1].means["handoff_p95_s"] == 3.2
    assert batches[:2] == [[None], [found.tried[1].layout]], "no layout, then the first (no learned one: no groups)"
    assert min(handoff(lay) for lay in batches[2]) == pytest.approx(1.61), "the first step stays worse than no layout"
    assert all("vlm" not in dict(lay) for lay in batches[3]), "it stood on the best neighbour, not the first"
    assert found.chosen.means["handoff_p95_s"] == pytest.approx(0.11)
    assert "vlm" not in dict(found.chosen.layout) and fast_coder_on_l40(found.chosen.layout)
    assert min(handoff(lay) for lay in batches[-1]) >= 0.11 - 1e-9, "it stopped when no neighbour improved"


def test_against_baselines_a_layout_may_give_back_ttft_it_gained_over_them(monkeypatch):
    def on_l40(lay, model):
        return lay is not None and dict(lay).get(model, (0,))[0] in (8, 9, 10, 11)

    def ttft(lay):  # no layout 3.0 s; every layout over 5 % slower, the summarizer on an L40 the most
        return 3.0 if lay is None else 4.0 if on_l40(lay, "summarizer") else 3.5

    handoff = lambda lay: 0.5 if on_l40(lay, "fast-coder") else 1.0  # noqa: E731
    _stub(monkeypatch, handoff, ttft)
    assert search(CL, CAT, HISTORY, budget=40, tolerance=0.05).chosen.layout is None
    batches = _stub(monkeypatch, handoff, ttft, {"sleep-swap": (2.0, 3.6), "lru-keepwarm": (3.0, 5.0)})
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.0, against=["sleep-swap", "lru-keepwarm"])
    assert batches[0] == ["sleep-swap", "lru-keepwarm"], "the baselines are replayed once, first"
    assert found.against == {"sleep-swap": {"handoff_p95_s": 2.0, "ttft_p95_s": 3.6, "program_p95_s": 100.0},
                             "lru-keepwarm": {"handoff_p95_s": 3.0, "ttft_p95_s": 5.0, "program_p95_s": 100.0}}
    assert found.chosen.means == {"handoff_p95_s": 0.5, "ttft_p95_s": 3.5, "program_p95_s": 100.0}
    assert not on_l40(found.chosen.layout, "summarizer"), "held to the best baseline's 3.6 s, not the worst's"
    assert any(on_l40(s.layout, "summarizer") and not s.acceptable for s in found.tried)
    _stub(monkeypatch, handoff, ttft, {"sleep-swap": (2.0, 2.9)})
    found = search(CL, CAT, HISTORY, budget=10, tolerance=0.0, against=["sleep-swap"])
    assert found.chosen.layout is None and not found.none.acceptable, "no layout is judged too, and shown so"


RAN = {"reviewer": {"12": 14, "8": 11}, "reasoner": {"12,13,14,15": 5, "0,1,2,3": 5}, "coder": {"10,11": 35},
       "planner": {"8": 20}, "summarizer": {"9": 20}, "ghost": {"3": 9}}


def test_the_learned_layout_freezes_where_the_planners_best_replay_ran_each_model():
    worse = {"seed": 1, "handoff_p95_s": 2.0, "groups_by_model": {"coder": {"8,9": 30}}}
    lay = learned_layout(CL, CAT, [worse, {"seed": 2, "handoff_p95_s": 0.5, "groups_by_model": RAN}])
    checked(CAT, CL, lay)
    assert dict(lay) == {"reasoner": (12, 13, 14, 15), "coder": (10, 11), "reviewer": (8,), "summarizer": (9,)}, (
        "widest first (of two groups as used, the faster); the reviewer's 12 is the reasoner's, so its next; "
        "the planner's only group is taken")
    assert learned_layout(CL, CAT, [worse]) == (("coder", (8, 9)),)


def test_the_descent_starts_from_the_learned_layout_when_it_ranks_better(monkeypatch):
    learned = learned_layout(CL, CAT, [{"seed": 1, "handoff_p95_s": 1.0, "groups_by_model": RAN}])
    batches = _stub(monkeypatch, lambda lay: 0.4 if lay == learned else 1.0 if lay is None else 2.0,
                    lambda lay: 3.0, ran=RAN)
    found = search(CL, CAT, HISTORY, budget=30)
    assert batches[1][1] == learned and len(batches[1]) == 2, "scored beside the first layout"
    assert found.chosen.layout == learned
    assert any(lay == tuple(e for e in learned if e[0] != "summarizer") for lay in batches[2]), \
        "the descent went on from the learned layout's neighbours"


def test_the_limits_tolerance_a_baseline_that_drops_calls_and_an_unacceptable_no_layout(monkeypatch):
    def on_l40(lay, model):
        return lay is not None and dict(lay).get(model, (0,))[0] in (8, 9, 10, 11)

    handoff = lambda lay: 0.5 if on_l40(lay, "fast-coder") else 1.0  # noqa: E731
    ttft = lambda lay: 3.0 if lay is None else 3.1  # noqa: E731  # every layout 3.3 % slower than none
    _stub(monkeypatch, handoff, ttft)
    assert search(CL, CAT, HISTORY, budget=40, tolerance=0.05).chosen.means["handoff_p95_s"] == 0.5
    assert search(CL, CAT, HISTORY, budget=40, tolerance=0.03).chosen.layout is None, "3.1 > 3.0 x 1.03"
    # a baseline that drops calls is not the best: its 2.0 s TTFT would make every layout unacceptable
    batches = _stub(monkeypatch, handoff, ttft, {"sleep-swap": (2.0, 3.2), "static": (1.0, 2.0, 3)})
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.0, against=["sleep-swap", "static", "sleep-swap"])
    assert batches[0] == ["sleep-swap", "static"], "each named once"
    assert list(found.against) == ["sleep-swap"] and found.dropped == {"static": 3}
    assert found.chosen.means["handoff_p95_s"] == 0.5
    # a metric no replay measured (None) is no limit for the others and no evidence for a layout
    _stub(monkeypatch, handoff, lambda lay: None if on_l40(lay, "fast-coder") else 3.1,
          {"sleep-swap": (2.0, None), "lru-keepwarm": (3.0, 3.2)})
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.0, against=["sleep-swap", "lru-keepwarm"])
    assert found.against["sleep-swap"]["ttft_p95_s"] is None and found.chosen.layout is None
    assert all(not s.acceptable for s in found.tried if s.layout is not None and on_l40(s.layout, "fast-coder"))
    assert any(s.acceptable for s in found.tried if s.layout is not None)
    # no layout over the limit: an acceptable layout is kept only with less handoff P95 than it
    _stub(monkeypatch, lambda lay: 0.2 if lay is None else 0.9 if on_l40(lay, "fast-coder") else 1.0,
          lambda lay: 4.0 if lay is None else 3.1, {"sleep-swap": (2.0, 3.2)})
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.0, against=["sleep-swap"])
    assert not found.none.acceptable and any(s.acceptable for s in found.tried)
    assert found.chosen.layout is None, "limits met by giving back handoff stall: not kept"
    _stub(monkeypatch, lambda lay: 1.2 if lay is None else 0.9 if on_l40(lay, "fast-coder") else 1.0,
          lambda lay: 4.0 if lay is None else 3.1, {"sleep-swap": (2.0, 3.2)})
    found = search(CL, CAT, HISTORY, budget=40, tolerance=0.0, against=["sleep-swap"])
    assert not found.none.acceptable and found.chosen.means["handoff_p95_s"] == 0.9


def test_a_holding_search_replays_every_layout_holding_and_says_so(monkeypatch):
    seen = []
    _stub(monkeypatch, lambda lay: 1.0 if lay is None else 0.5, lambda lay: 3.0)
    stubbed = layouts.run_local

    def run_local(jobs, workers=None, progress=None):
        seen.extend(j.get("planner") or {} for j in jobs)
        return stubbed(jobs, workers, progress)

    monkeypatch.setattr(layouts, "run_local", run_local)
    found = search(CL, CAT, HISTORY, budget=4, holds=True)
    laid = [p for p in seen if p.get("homes")]
    assert laid and all(p["layout_holds"] is True for p in laid) and {} in seen, "no layout replayed as it is"
    assert found.planner_arg() == f"homes={found.chosen.layout!r},layout_holds=True"
    seen.clear()
    found = search(CL, CAT, HISTORY, budget=4)
    assert not any(p.get("layout_holds") for p in seen) and found.planner_arg() == f"homes={found.chosen.layout!r}"
