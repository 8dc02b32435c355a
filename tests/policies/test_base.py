"""What placement may know of a call (`policies/base.py`): not which expert pages it will touch."""

from tests.helpers import moe_catalog, call, cluster, program, resident, trace
from statebudget.policies import make_policy
from statebudget.policies.base import restore_estimate_s
from statebudget.sim.calls import CallRec
from statebudget.sim.engine import Simulator

CAT = moe_catalog()  # 16 pages of 1 GB beside a 2 GB dense part


def test_the_restore_estimate_counts_pages_by_how_often_calls_touch_them_not_by_this_calls():
    sim = Simulator(cluster(gpus=2, hbm_gb=40.0), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    for g, pages in (((0,), range(0, 8)), ((1,), range(8, 16))):  # the most touched half on GPU 0
        resident(sim, ("w", "e"), g, 2.0)
        for p in pages:
            resident(sim, ("e", "e", p), g, 1.0)
    hot, cold = (CallRec("p", n, "e", 100, 10, 10, "t0", "interactive", True, False, pages=pages)
                 for n, pages in (("a", (0, 1)), ("b", (8, 9))))
    # a call that will touch only GPU 1's pages is not told so: both rank the groups alike, by the
    # pages each group lacks weighted by their touch probabilities
    for g in ((0,), (1,)):
        assert restore_estimate_s(sim, hot, g) == restore_estimate_s(sim, cold, g)
    assert 0 < restore_estimate_s(sim, cold, (0,)) < restore_estimate_s(sim, cold, (1,))


def _calls(*page_sets):
    return [CallRec("p", f"n{i}", "e", 100, 10, 10, "t0", "interactive", True, False, pages=tuple(pages))
            for i, pages in enumerate(page_sets)]


def test_room_now_is_judged_without_the_calls_pages():
    # the dense part and the two most touched pages held, 0.6 GB free: a call that will touch only
    # those has room (what the admission would find) and one that will touch ten has not; a
    # policy judges both alike, by the expected bytes of the 14 missing pages (2.4 GB): no room
    sim = Simulator(cluster(gpus=1, hbm_gb=4.6), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    resident(sim, ("w", "e"), (0,), 2.0)
    for p in (0, 1):
        resident(sim, ("e", "e", p), (0,), 1.0)
    few, many = _calls((0,), range(10))
    assert sim._victims_for_room((0,), *sim.call_need(few, (0,))) is not None
    assert sim._victims_for_room((0,), *sim.call_need(many, (0,))) is None
    assert sim.expected_need(few, (0,)) == sim.expected_need(many, (0,))
    assert not sim.has_room_now(few, (0,)) and not sim.has_room_now(many, (0,))


def test_idle_pages_of_the_model_itself_make_room_as_they_would_for_the_admission():
    # 12 GB: the dense part and ten idle pages fill it; the pages a call seldom touches may go
    sim = Simulator(cluster(gpus=1, hbm_gb=12.0), CAT, trace(program("p", [call("a", "e")])), make_policy("ondemand"))
    resident(sim, ("w", "e"), (0,), 2.0)
    for p in range(10):
        resident(sim, ("e", "e", p), (0,), 1.0)
    (c,) = _calls((0, 12))
    assert sim._victims_for_room((0,), *sim.call_need(c, (0,))) is not None
    assert sim.has_room_now(c, (0,))
