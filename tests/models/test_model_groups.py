"""A catalog model's `gpus`: the GPUs its engines are set up on. Every placement, in the simulator
and live, stays within them; an id the cluster lacks is refused where it is written."""

import pytest

from statebudget.models import Catalog
from statebudget.models.errors import InputError
from statebudget.models.load import check_compatible
from statebudget.service.live import LivePlanner

from tests.helpers import catalog, cluster


def pinned(gpus):
    base = catalog(("a", 10.0), ("b", 10.0)).model_dump()
    base["models"][0]["gpus"] = gpus
    return Catalog.model_validate(base)


def test_groups_stay_within_the_models_gpus():
    cl = cluster(gpus=4)
    cat = pinned(["n0/g2", "n0/g3"])
    assert cl.model_groups(cat.by_name["a"]) == [(2,), (3,)]
    assert cl.model_groups(cat.by_name["b"]) == [(0,), (1,), (2,), (3,)]
    tp2 = Catalog.model_validate({**cat.model_dump(), "models": [{**cat.models[0].model_dump(), "tp": 2,
                                                                   "gpus": ["n0/g1", "n0/g2"]}]})
    assert cl.model_groups(tp2.models[0]) == []  # (0, 1) and (2, 3) each leave its GPUs


def test_unknown_or_unusable_gpus_are_refused_naming_the_field():
    with pytest.raises(InputError, match=r"models\.a\.gpus.*n9/g0"):
        check_compatible(cluster(gpus=2), pinned(["n9/g0"]))
    tp2 = pinned(["n0/g1"]).model_dump()
    tp2["models"][0]["tp"] = 2
    with pytest.raises(InputError, match=r"models\.a\.tp.*among its gpus"):
        check_compatible(cluster(gpus=2), Catalog.model_validate(tp2))


def test_the_live_planner_loads_a_pinned_model_only_on_its_gpus():
    p = LivePlanner(cluster(gpus=2, hbm_gb=40.0), pinned(["n0/g1"]))
    p.event("t", {"type": "program_started", "program": "p"})
    lease = p.submit_lease("t", {"program": "p", "model": "a", "deadline_s": 60.0, "confidence": 1.0,
                                 "with_kv": False})
    assert lease.decision == "accepted"
    targets = {r.op.dst for r in p.ops.values() if r.op.object[0] == "w"}
    assert targets == {"gpu:1"}, targets  # gpu:0 was as free, and first in the placement's tie order
