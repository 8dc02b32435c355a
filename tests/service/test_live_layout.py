"""The operator's layout in the live planner: kept in the ledger across restarts, replaced live
(`set_layout`, PUT /v1/layout), checked before anything changes."""

import pytest

from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import lease_config
from statebudget.service.errors import Invalid, Unavailable
from statebudget.service.ledger import LedgerError, Store
from statebudget.service.live import LivePlanner

from tests.helpers import Clock

ON_1 = (("reviewer", (1,)),)


def planner(db, homes=None):
    config = lease_config(homes=homes) if homes is not None else None
    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db), clock=Clock(1000.0), config=config)


def reviewer_homed_on(p, program="p1"):
    """Where the planner puts the reviewer's weights for its first call (it has no copy yet)."""
    p.event("a", {"type": "program_started", "program": program})
    p.event("a", {"type": "call_arrived", "program": program, "call": "c1", "model": "reviewer"})
    p.tick()
    return [g for (key, g) in p.tiers.gpu if key == ("w", "reviewer")]


def test_a_restart_keeps_the_layout_the_ledger_holds_and_a_new_one_replaces_it(tmp_path):
    db = tmp_path / "sb.db"
    planner(db, ON_1).store.close()
    p = planner(db)  # no layout given: the ledger's
    assert p.layout == ON_1
    assert reviewer_homed_on(p) == [(1,)]
    p.store.close()
    p = planner(db, (("reviewer", (0,)),))  # a layout given at a restart replaces the ledger's
    assert p.layout == (("reviewer", (0,)),)
    p.store.close()
    assert planner(db).layout == (("reviewer", (0,)),)


def test_set_layout_steers_the_next_step_and_is_kept_and_none_clears_it(tmp_path):
    db = tmp_path / "sb.db"
    p = planner(db)
    assert p.layout is None
    assert p.set_layout(ON_1) == ON_1 and p.plan_due
    assert reviewer_homed_on(p) == [(1,)]  # without it the most free GPU, 0
    p.store.close()
    p = planner(db)
    assert p.layout == ON_1
    assert p.set_layout(None) is None
    p.store.close()
    assert planner(db).layout is None
    p = planner(tmp_path / "other.db", ON_1)
    p.set_layout(())
    assert reviewer_homed_on(p) == [(0,)]


def test_a_holding_layout_is_kept_with_its_holds_and_reaches_the_planning_step(tmp_path):
    db = tmp_path / "sb.db"
    p = planner(db)
    p.set_layout(ON_1, holds=True)
    assert p.layout_holds and p.core.cfg.layout_holds and p.core.cfg.homes == ON_1
    p.store.close()
    p = planner(db)  # a restart
    assert (p.layout, p.layout_holds) == (ON_1, True) and p.core.cfg.layout_holds
    p.set_layout(ON_1)
    assert not p.layout_holds and not p.core.cfg.layout_holds
    assert not p.set_layout(None, holds=True) and not p.layout_holds  # no layout holds nothing


def test_a_layout_that_does_not_fit_changes_nothing(tmp_path):
    p = planner(tmp_path / "sb.db", ON_1)
    with pytest.raises(Invalid, match=r"homes\[0\]: no model 'nope' in catalog"):
        p.set_layout((("nope", (0,)),))
    with pytest.raises(Invalid, match=r"homes\[1\]: planner \(tp 1\) cannot run on GPUs \(0, 1\)"):
        p.set_layout((("reviewer", (0,)), ("planner", (0, 1))))
    assert p.layout == ON_1 and p.store.get_meta("layout") == {"homes": [["reviewer", [1]]], "holds": False}


def test_a_new_cluster_the_layout_does_not_fit_waits_for_a_new_layout(tmp_path):
    p = planner(tmp_path / "sb.db", ON_1)
    one = load_cluster("toy2").model_dump(mode="json")
    one["nodes"] = one["nodes"][:1]
    with pytest.raises(Invalid, match=r"the layout: homes\[0\]: reviewer .*; drop it first \(PUT /v1/layout"):
        p.set_cluster(one, p.catalog.model_dump(mode="json"))
    p.set_layout(None)
    assert p.set_cluster(one, p.catalog.model_dump(mode="json")).gpus == 1


def test_a_layout_the_ledger_refuses_is_not_used(tmp_path, monkeypatch):
    p = planner(tmp_path / "sb.db", ON_1)
    write = p.store.set_meta

    def refuse(k, v):
        if k == "layout":
            raise LedgerError("database or disk is full")
        write(k, v)

    monkeypatch.setattr(p.store, "set_meta", refuse)
    with pytest.raises(Unavailable, match="full"):
        p.set_layout((("reviewer", (0,)),))
    assert p.layout == ON_1 and p.policy.config.homes == ON_1  # memory as on disk
    monkeypatch.undo()
    assert reviewer_homed_on(p) == [(1,)]


def test_a_ledger_written_before_holds_keeps_its_layout(tmp_path):
    db = tmp_path / "sb.db"
    p = planner(db, ON_1)
    with p.store.tx():
        p.store.set_meta("layout", [["reviewer", [1]]])  # the format before `holds`
    p.store.close()
    assert (planner(db).layout, planner(db).layout_holds) == (ON_1, False)
