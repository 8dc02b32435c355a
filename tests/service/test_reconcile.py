"""The books follow what adapters really hold: an inventory after a restart replaces the node's
books, a failing op backs off and is given up instead of looping, and compaction keeps the
ledger bounded."""

import pytest

from tests.helpers import Clock, report_op
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.errors import Invalid, NotFound
from statebudget.service.journal import OpStatus
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner
from statebudget.service.reconcile import FAIL_GIVE_UP

W = ("w", "planner")


def planner(db=None, clock=None, **kw):
    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db) if db else None,
                       clock=clock or Clock(1000.0), **kw)


def ready_weights(p, tenant="a", program="p1"):
    """A lease for the planner model, its op reported done: weights ready in some HBM."""
    p.event(tenant, {"type": "program_started", "program": program})
    lease = p.submit_lease(tenant, {"program": program, "model": "planner", "deadline_s": 60})
    (rec,) = [r for r in p.ops.values() if r.op.lease_id == lease.lease_id]
    report_op(p, rec.op)
    return lease, rec.node, rec.op.dst


def test_an_adapter_restarted_empty_takes_its_copies_out_of_the_books_and_the_ledger(tmp_path):
    p = planner(tmp_path / "sb.db")
    lease, node, tier = ready_weights(p)
    assert p.lease_view(p.ledger.leases[lease.lease_id]).ready
    out = p.reconcile(node, [], "adapter started")
    assert {"object": list(W), "tier": tier} in out.lost
    assert not any(k == W for k, _ in p.tiers.gpu) and sum(p.tiers.hbm_used) == pytest.approx(0.0)
    assert not any(r["tier"] == tier for r in p.store.copies())
    view = p.lease_view(p.ledger.leases[lease.lease_id])
    assert view.state == "stale" and "inventory" in view.reason and out.leases_stale == 1
    p.store.close()
    q = planner(tmp_path / "sb.db")  # a restart does not bring the lost copy back
    assert not any(k == W for k, _ in q.tiers.gpu)


def test_an_inventory_that_still_holds_the_copy_changes_nothing_and_closes_open_ops(tmp_path):
    p = planner(tmp_path / "sb.db")
    _, node, tier = ready_weights(p)
    p.event("a", {"type": "program_started", "program": "p2"})
    p.submit_lease("a", {"program": "p2", "model": "coder", "deadline_s": 60})
    open_ops = [r.op.op_id for r in p.ops.values() if r.node == node]
    out = p.reconcile(node, [{"object": list(W), "tier": tier, "version": p.catalog_epoch}])
    assert out.lost == [] or all(l["object"] != list(W) for l in out.lost)
    assert (W, tuple(int(x) for x in tier[4:].split(","))) in p.tiers.gpu
    assert out.ops_closed == len(open_ops) and not any(r.node == node for r in p.ops.values())
    for op_id in open_ops:  # on disk too: a restart does not offer them to the new adapter
        row = p.store.get_op(op_id)
        assert row["status"] == "failed" and "inventory" in row["reason"]


def test_copies_the_books_lack_are_adopted_when_current_and_dropped_when_not():
    p = planner()
    node = "n0"
    gpu = next(i for i, g in enumerate(p.gpus) if g.node == node)
    out = p.reconcile(node, [{"object": list(W), "tier": f"gpu:{gpu}", "version": p.catalog_epoch},
                             {"object": ["kv", "gone", "planner"], "tier": f"gpu:{gpu}", "version": 7},
                             {"object": ["w", "coder"], "tier": f"host:{node}", "version": p.catalog_epoch + 5}])
    assert out.adopted == [{"object": list(W), "tier": f"gpu:{gpu}"}]
    assert {"object": ["kv", "gone", "planner"], "tier": f"gpu:{gpu}"} in out.drop
    assert {"object": ["w", "coder"], "tier": f"host:{node}"} in out.drop
    c = p.tiers.gpu[(W, (gpu,))]
    assert c.ready and (W, (gpu,)) in p.tiers.engines  # awake weights have their engine


def test_an_inventory_for_another_nodes_tier_or_an_unknown_node_is_refused_unchanged():
    p = planner()
    _, node, tier = ready_weights(p)
    other = "n1" if node == "n0" else "n0"
    with pytest.raises(Invalid, match="copies\\[0\\]"):
        p.reconcile(other, [{"object": list(W), "tier": tier}])
    with pytest.raises(NotFound):
        p.reconcile("nowhere", [])
    assert (W, tuple(int(x) for x in tier[4:].split(","))) in p.tiers.gpu


def test_a_promote_that_keeps_failing_backs_off_and_gives_up_its_host_source():
    clock = Clock(1000.0)
    p = planner(clock=clock)
    node = "n0"
    p.reconcile(node, [{"object": list(W), "tier": f"host:{node}", "version": p.catalog_epoch}])
    assert p.tiers.host[(W, node)].ready
    p.event("a", {"type": "program_started", "program": "p1"})
    failures = 0
    for step in range(200):  # 20 s of an adapter failing every promote, ticking at 10 Hz
        clock.t += 0.1
        p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 5, "for_call": f"c{step}"})
        p.tick()
        for r in [r for r in p.ops.values() if r.op.kind == "promote" and r.op.object == list(W)]:
            report_op(p, r.op, status="failed", error="engine: cudaErrorMemoryAllocation")
            failures += 1
    # each of the two GPUs backs off 1, 2, 4, 8 s: a handful in 20 s, not one a tick (200)
    assert failures <= 2 * 5
    assert (W, node) not in p.tiers.host  # given up after FAIL_GIVE_UP failures from host
    gave_up = [r for r in p.store.ops("failed") if "gave up" in r["reason"]]
    assert len(gave_up) == 1 and failures >= FAIL_GIVE_UP


def test_compaction_removes_closed_ops_and_ended_programs_past_retention(tmp_path):
    clock = Clock(1000.0)
    p = planner(tmp_path / "sb.db", clock=clock, retain_ops_s=100.0, retain_programs_s=200.0)
    for i in range(20):  # programs whose KV comes and goes: each leaves closed ops behind
        prog = f"p{i}"
        p.event("a", {"type": "program_started", "program": prog})
        p.submit_lease("a", {"program": prog, "model": ("planner", "coder")[i % 2], "deadline_s": 60})
        for ev in ({"type": "call_arrived", "model": ("planner", "coder")[i % 2]}, {"type": "call_started"},
                   {"type": "call_finished", "tokens": 500}):
            p.event("a", {"program": prog, "call": "c", **ev})
        p.event("a", {"type": "program_finished", "program": prog})
        for _ in range(3):
            p.tick()
            for r in list(p.ops.values()):
                report_op(p, r.op)
    rows = p.store.op_count()
    assert rows >= 20 and len(p.store.programs()) == 20
    clock.t += 150
    p.tick()
    assert p.store.op_count() < rows and all(r["status"] == OpStatus.OPEN for r in p.store.ops())
    assert len(p.store.programs()) == 20  # programs are kept longer
    clock.t += 100
    p.tick()
    assert p.store.programs() == [] and not p.programs
    assert all(l.state.live for l in p.ledger.leases.values())
    p.event("a", {"type": "program_started", "program": "fresh"})  # the planner goes on
    assert "fresh" in p.programs


# ---- reports checked against their op, call ids kept to one model ------------------------------------

def test_a_done_report_claiming_more_bytes_than_the_object_fails_the_op_and_publishes_nothing():
    p = planner()
    p.event("a", {"type": "program_started", "program": "p1"})
    lease = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60})
    (rec,) = [r for r in p.ops.values() if r.op.lease_id == lease.lease_id]
    with pytest.raises(Invalid, match="bytes copied for an object"):
        report_op(p, rec.op, bytes=1e15)
    assert p.store.get_op(rec.op.op_id)["status"] == "failed"
    assert not any(k == W and c.ready for (k, _), c in p.tiers.gpu.items())
    assert not p.lease_view(p.ledger.leases[lease.lease_id]).ready


def test_an_op_that_asks_for_a_checksum_refuses_a_report_without_one():
    p = planner(require_checksums=True)
    p.event("a", {"type": "program_started", "program": "p1"})
    lease = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60})
    (rec,) = [r for r in p.ops.values() if r.op.lease_id == lease.lease_id]
    assert rec.op.checksum
    with pytest.raises(Invalid, match="no checksum"):
        p.report(rec.node, rec.op.op_id, {"status": "done", "version": rec.op.version, "epoch": rec.op.epoch})
    assert p.store.get_op(rec.op.op_id)["status"] == "failed"
    lease2 = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60, "for_call": "c2"})
    assert lease2.state == "rejected" and "back-off" in lease2.reason  # says why, not "no room"
    p.clock.t += 1.5  # past the first back-off: the load is tried again, and a checksummed report commits
    lease3 = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60, "for_call": "c3"})
    (again,) = [r for r in p.ops.values() if r.op.lease_id == lease3.lease_id]
    report_op(p, again.op)
    assert p.lease_view(p.ledger.leases[lease3.lease_id]).ready


def test_a_call_id_arriving_again_on_another_model_is_refused():
    from statebudget.service.errors import Conflict

    p = planner()
    p.event("a", {"type": "program_started", "program": "p1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c1", "model": "planner"})
    with pytest.raises(Conflict, match="arrived on model 'planner'"):
        p.event("a", {"type": "call_arrived", "program": "p1", "call": "c1", "model": "coder", "attempt": 1})
    assert p.programs["p1"].calls["c1"]["model"] == "planner"


@pytest.mark.parametrize("obj", [["w", "nope"], ["kv", "p1", "nope"], ["e", "planner", "0"], ["w", "planner", "x"]])
def test_an_inventory_naming_no_state_object_of_the_catalog_is_refused(obj):
    p = planner()
    with pytest.raises(Invalid, match="no state object|not a state object|not a copy"):
        p.reconcile("n0", [{"object": obj, "tier": "gpu:0"}])
    assert not p.tiers.gpu


def test_a_move_out_of_hbm_that_keeps_failing_is_not_planned_again_in_a_loop():
    # One GPU with room for two of three models, a lease a second for each in turn, and an
    # engine that fails every demote: the failed source goes back into the books and backs off,
    # instead of being chosen as the victim of every next promote.
    from tests.helpers import catalog, cluster

    clock = Clock(1000.0)
    p = LivePlanner(cluster(gpus=1, hbm_gb=30), catalog(("m1", 12), ("m2", 16), ("m3", 10)), clock=clock)
    demotes_failed = 0
    for step in range(200):  # 100 s
        clock.t += 0.5
        prog = f"p{step}"
        p.event("a", {"type": "program_started", "program": prog})
        p.submit_lease("a", {"program": prog, "model": ("m1", "m2", "m3")[step % 3], "deadline_s": 5})
        p.event("a", {"type": "program_finished", "program": prog})
        for _ in range(2):
            p.tick()
            for r in list(p.ops.values()):
                if r.op.op_id not in p.ops or r.not_before:
                    continue
                failing = step >= 20 and r.op.kind == "demote"
                demotes_failed += failing
                try:
                    report_op(p, r.op, status="failed" if failing else "done", error="engine busy")
                except Invalid:
                    pass
    # three models, each backing off 1, 2, 4, ... up to 60 s over 90 s: tens, not one per lease
    assert 0 < demotes_failed <= 3 * 8, demotes_failed
    p.tiers.check()


@pytest.mark.parametrize("tier", ["gpu:0,0", "gpu:0,1", "gpu:7"])
def test_an_inventory_on_a_gpu_group_the_cluster_does_not_have_for_that_model_is_refused(tier):
    p = planner()
    with pytest.raises(Invalid, match="no GPU group|not a copy"):
        p.reconcile("n0", [{"object": list(W), "tier": tier}])
    assert not p.tiers.gpu and sum(p.tiers.hbm_used) == 0


def test_a_kv_copy_without_its_version_is_not_taken_as_current():
    p = planner()
    p.event("a", {"type": "program_started", "program": "p1"})
    for ev in ({"type": "call_arrived", "model": "planner"}, {"type": "call_started"}, {"type": "call_finished", "tokens": 300}):
        p.event("a", {"program": "p1", "call": "c1", **ev})
    (kv_tier,) = [f"gpu:{g[0]}" for (k, g) in p.tiers.gpu if k[0] == "kv"]
    node = p.gpus[int(kv_tier[4:])].node
    out = p.reconcile(node, [{"object": ["kv", "p1", "planner"], "tier": kv_tier}])  # no version
    assert {"object": ["kv", "p1", "planner"], "tier": kv_tier} in out.lost
    assert not any(k[0] == "kv" for k, _ in p.tiers.gpu)
