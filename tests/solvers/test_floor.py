"""The page floor (`solvers/floor.py`): the expected stall that expert-page faults force on a
policy that cannot foresee a call's pages, from the touch probabilities and the room one GPU has."""

import numpy as np
import pytest

from tests.helpers import moe_catalog, call, cluster, program, tool, trace
from statebudget.core.costs import page_touch_probs
from statebudget.models import Cluster
from statebudget.core.costs import CostModel
from statebudget.policies import make_policy
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.sim.metrics import counted_done
from statebudget.solvers.floor import most_pages, page_floor

CAT = moe_catalog()  # 16 pages of 1 GB beside a 2 GB dense part
TAIL = np.sort(page_touch_probs(CAT.by_name["e"].moe))[::-1]


def handoffs(n, cancel=False, start=0.0):
    """`n` programs, each a dense call then a MoE call (a handoff), a tool wait between."""
    progs = []
    for i in range(n):
        nodes = [call("a", "d"), tool("t", ["a"]), call("b", "e", after=["t"])]
        progs.append(program(f"p{i}", nodes, start=start + i, cancel=[{"node": "b", "at_after": "a"}] if cancel else []))
    return trace(*progs)


def test_pages_kept_follow_the_room_and_the_total_is_exact():
    # 8.8 GB beside the 2 GB dense part (no engine counted): 8 pages; 1 GB at 25 GB/s
    cl = cluster(hbm_gb=10.8, h2d=25.0, overhead=0.4)
    f = page_floor(cl, CAT, handoffs(3))
    k, t = f.kept["e"]
    assert k == 8 and t == pytest.approx(0.04)
    assert f.moe_calls == 3 and f.handoff_calls == 3
    assert f.stall_total_s == pytest.approx(3 * t * TAIL[8:].sum(), rel=1e-5)


def test_the_p95_is_the_expected_faults_of_the_one_handoff_that_has_them():
    cl = cluster(hbm_gb=10.8, overhead=0.4)
    # one handoff: the P95 of one value is that value, so its expectation is t x the expected misses
    tr = trace(program("p", [call("a", "d"), call("b", "e", after=["a"])]))
    f = page_floor(cl, CAT, tr, draws=20000)
    assert f.handoff_calls == 1
    assert f.handoff_p95_s == pytest.approx(0.04 * TAIL[8:].sum(), rel=0.03)


def test_pages_and_seconds_are_each_the_best_of_any_group():
    # a roomy slow GPU and a small fast one: the floor may not take both from one group, or a
    # policy running every call on the fast one would stall less than it
    kinds = {"big": (12.0, 2.0), "fast": (10.0, 50.0)}
    cl = Cluster.model_validate({"name": "mixed", "hbm_reserve_frac": 0.0, "gpu_kinds": {
        k: {"hbm_gb": hbm, "hbm_gbps": 1555, "h2d_gbps": bw, "d2h_gbps": bw, "tflops": 312, "wake_s": 0.5,
            "cold_start_s": 10} for k, (hbm, bw) in kinds.items()},
        "nodes": [{"name": f"n{i}", "host_dram_gb": 256, "nvme_gb": 4000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                   "root_gbps": 64, "gpus": {k: 1}} for i, k in enumerate(kinds)]})
    k, t = most_pages(cl, CostModel(cl, CAT), CAT.by_name["e"])
    assert k == 10 and t == pytest.approx(1.0 / 50.0)


def test_room_for_every_page_leaves_no_floor_and_less_room_raises_it():
    assert page_floor(cluster(hbm_gb=40.0), CAT, handoffs(40)).stall_total_s == 0.0
    floors = [page_floor(cluster(hbm_gb=hbm), CAT, handoffs(40)) for hbm in (14.0, 10.0, 6.0)]
    assert [f.kept["e"][0] for f in floors] == [12, 8, 4]
    assert floors[0].stall_total_s < floors[1].stall_total_s < floors[2].stall_total_s
    assert floors[0].handoff_p95_s <= floors[1].handoff_p95_s <= floors[2].handoff_p95_s
    assert floors[2].handoff_p95_s > 0


def test_calls_a_cancel_may_drop_and_the_warm_up_count_for_nothing():
    cl = cluster(hbm_gb=6.0)
    dropped = page_floor(cl, CAT, handoffs(20, cancel=True))
    assert dropped.moe_calls == 0 and dropped.stall_total_s == 0.0 and dropped.handoff_p95_s == 0.0
    assert dropped.handoff_calls == 20  # counted, as 0, so the P95 can only be lower
    early = page_floor(cl, CAT, handoffs(20), warmup_s=100.0)
    assert early.handoff_calls == 0 and early.stall_total_s == 0.0


class Snapshots(Simulator):
    """Keeps, at each call's arrival, the MoE model's pages resident or loading on each GPU."""

    def _call_arrive(self, c):
        self.seen[(c.program, c.node)] = {g: {k for (k, gg) in self.tiers.gpu if k[0] == "e" and gg == g}
                                          for g in self.model_groups(CAT.by_name["e"])}
        return super()._call_arrive(c)


@pytest.mark.parametrize("name", ["ondemand", "prefetch-all", "forecast-prewarm", "statebudget-lease"])
def test_each_call_pays_for_the_pages_it_finds_missing_and_a_gpu_holds_at_most_k(name):
    # the floor's two steps, checked call by call against the simulator: a GPU never holds more
    # than `k` of the pages at a call's arrival, and each page the call touches beyond those it
    # found costs the call at least `t` (its bytes over the link), whatever else it waits for
    cl = cluster(gpus=2, hbm_gb=12.4, overhead=0.4, cold=0.0, wake=0.0)
    tr = handoffs(60)
    k, t = page_floor(cl, CAT, tr).kept["e"]
    sim = Snapshots(cl, CAT, tr, make_policy(name), config=SimConfig(seed=3))
    sim.seen = {}
    done = [c for c in counted_done(sim.run()) if c.model == "e"]
    assert len(done) == 60  # none dropped: the floor assumes so
    faulted = 0
    for c in done:
        held = sim.seen[(c.program, c.node)]
        assert all(len(pages) <= k for pages in held.values())
        missing = [p for p in c.pages if ("e", "e", p) not in held[c.group]]
        assert c.ready - c.arrive >= len(missing) * t - 1e-9, (c.node, missing, c.ready - c.arrive)
        faulted += bool(missing)
    assert faulted > 0  # the check is not vacuous
