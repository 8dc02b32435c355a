"""The live planner's books on their hardest paths: refusals are durable, a lease
waits for an in-flight copy, a shared transfer survives one lease's cancel, the engine's own KV is
not dropped when it grows, a failed demotion adopts its source, a lease with no room says so, and
a call starts on the ready copy with its KV, else the least busy."""

import numpy as np
import pytest

from tests.helpers import Clock, make_live_planner, report_op
from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import lease_config
from statebudget.service.ledger import Store
from statebudget.models.cluster import Cluster
from statebudget.service.live import Conflict, Invalid, LivePlanner
from statebudget.core.decisions import Demote, Promote, apply

W = ("w", "planner")


def planner(db=None):
    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db) if db else None)


def test_a_refused_report_is_closed_on_disk_too(tmp_path):
    p = planner(tmp_path / "sb.db")
    p.event("a", {"type": "program_started", "program": "p1"})
    lid = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60}).lease_id
    op = next(r.op for r in p.ops.values() if r.op.lease_id == lid)
    node = p.ops[op.op_id].node
    with pytest.raises(Conflict, match="version"):
        p.report(node, op.op_id, {"status": "done", "version": op.version + 1, "epoch": op.epoch})
    assert p.store.get_op(op.op_id)["status"] == "cancelled"
    assert not any(r["tier"].startswith("gpu") for r in p.store.copies())
    p.store.close()
    q = planner(tmp_path / "sb.db")
    assert op.op_id not in q.ops and q.tiers.hbm_used == [0.0, 0.0]
    with pytest.raises(Conflict, match="already cancelled"):  # a later, correct report cannot publish it
        q.report(node, op.op_id, {"status": "done", "version": op.version, "epoch": op.epoch, "checksum": "c"})
    assert not q.lease_view(q.ledger.leases[lid]).ready


def test_a_lease_on_a_copy_in_flight_waits_for_its_commit_and_survives_the_other_cancel(live_planner):
    p = live_planner
    for t, prog in (("a", "pa"), ("b", "pb")):
        p.event(t, {"type": "program_started", "program": prog})
    la = p.submit_lease("a", {"program": "pa", "model": "planner", "deadline_s": 60})
    lb = p.submit_lease("b", {"program": "pb", "model": "planner", "deadline_s": 60})
    assert not lb.ready and lb.state == "transferring" and lb.quote.p95_s > 0
    (op,) = [r.op for r in p.ops.values()]  # one transfer serves both
    p.cancel_lease("a", la.lease_id)
    assert op.op_id in p.ops  # b still needs it
    report_op(p, op)
    assert p.lease_view(p.ledger.leases[lb.lease_id]).ready


def test_a_growing_kv_on_its_own_group_is_not_dropped(live_planner):
    p = live_planner
    p.event("a", {"type": "program_started", "program": "p1"})
    for i, tokens in ((1, 1000), (2, 2000)):
        p.event("a", {"type": "call_arrived", "program": "p1", "call": f"c{i}", "model": "planner"})
        p.event("a", {"type": "call_started", "program": "p1", "call": f"c{i}"})
        p.event("a", {"type": "call_finished", "program": "p1", "call": f"c{i}", "tokens": tokens})
    kv = [(k, c.nbytes, c.ready) for (k, _), c in p.tiers.gpu.items() if k[0] == "kv"]
    assert kv == [(("kv", "p1", "planner"), 2000 * 4096, True)]
    assert not [r for r in p.ops.values() if r.op.object[0] == "kv"]  # no drop sent to the engine


def test_a_failed_demotion_adopts_its_source_when_it_is_being_promoted_back(live_planner):
    p = live_planner
    with p.store.tx():
        apply([Promote(W, (0,))], p)
    report_op(p, next(r.op for r in p.ops.values()))
    with p.store.tx():
        apply([Demote(W, (0,), "host")], p)
    demote = next(r.op for r in p.ops.values())
    with p.store.tx():
        apply([Promote(W, (0,))], p)
    report_op(p, demote, "failed", error="engine busy")
    assert p.tiers.gpu[(W, (0,))].ready  # the source never left HBM
    assert not p.ops  # neither the promotion back nor a drop is left to run
    p.tiers.check()


def test_a_lease_with_no_room_is_rejected_with_the_reason(live_planner):
    p = live_planner
    p.event("a", {"type": "program_started", "program": "p1"})
    p.tiers.hbm_used = [cap for cap in p.tiers.hbm_cap]  # every GPU full of pinned state
    out = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60})
    assert out.decision == "rejected" and "no room" in out.reason and not p.ops


def test_a_leased_promote_is_foreground_and_a_speculative_one_runs_in_the_background(live_planner):
    # Speculation yields to demand (Policy.speculation_yields): a promote no lease asked for is a
    # background op, which adapters run after a poll's foreground ops (run_order); a lease's is not.
    p = live_planner
    p.policy.speculation_yields = True  # off by default (measured not to pay, BENCHMARKS.md)
    p.event("a", {"type": "program_started", "program": "p1"})
    lid = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60}).lease_id
    (leased,) = [r.op for r in p.ops.values()]
    assert leased.lease_id == lid and not leased.background
    other = next(m.name for m in p.catalog.models if m.name != "planner")
    with p.store.tx():
        apply([Promote(("w", other), (1,))], p)
    (spec,) = [r.op for r in p.ops.values() if r.op.op_id != leased.op_id]
    assert spec.kind == "promote" and spec.lease_id is None and spec.background


def test_the_books_carry_engines_awake_then_asleep_on_their_group(live_planner):
    p = live_planner
    with p.store.tx():
        apply([Promote(W, (0,))], p)
    report_op(p, next(r.op for r in p.ops.values()))
    assert p.residency().engines == [{"model": "planner", "tier": "gpu:0", "state": "awake"}]
    with p.store.tx():
        apply([Demote(W, (0,), "host")], p)
    report_op(p, next(r.op for r in p.ops.values()))
    assert p.residency().body()["engines"] == [{"model": "planner", "tier": "gpu:0", "state": "asleep"}]
    assert p.tiers.asleep_on(W, (0,)) and not p.tiers.asleep_on(W, (1,))
    with p.store.tx():
        apply([Demote(W, (0,), "none")], p)  # nothing awake to demote: the asleep engine stays
    assert p.residency().engines[0]["state"] == "asleep"
    p.tiers.check()


def test_a_restart_rebuilds_the_engines_of_awake_weights(tmp_path):
    p = planner(tmp_path / "sb.db")
    with p.store.tx():
        apply([Promote(W, (0,))], p)
    report_op(p, next(r.op for r in p.ops.values()))
    p.store.close()
    q = planner(tmp_path / "sb.db")
    assert q.residency().engines == [{"model": "planner", "tier": "gpu:0", "state": "awake"}]
    q.tiers.check()



def test_a_call_starts_on_the_ready_copy_with_its_kv_else_the_least_busy():
    """Two ready copies of a model: a call starts where its program's KV is, else where fewer calls
    of the model run (its engine has free slots), not on the copy used last; `call_ready` names the
    same group the start takes."""
    p = make_live_planner(config=lease_config(promote_min_p=1.01))  # no speculative promotes
    for group in ((0,), (1,)):
        with p.store.tx():
            apply([Promote(W, group)], p)
        report_op(p, next(r.op for r in p.ops.values() if r.op.object == list(W) and r.op.dst == f"gpu:{group[0]}"))

    def start(prog, call):
        p.event("a", {"type": "call_arrived", "program": prog, "call": call, "model": "planner"})
        ready = p.call_ready("a", prog, call)
        ack = p.event("a", {"type": "call_started", "program": prog, "call": call})
        assert ready.ready and ready.group == ack.group
        return ack.group

    for prog in ("k", "x", "y"):
        p.event("a", {"type": "program_started", "program": prog})
    first = start("k", "c1")
    p.clock.t += 1
    second = start("x", "c1")
    assert {first, second} == {"gpu:0", "gpu:1"}  # the copy used last already runs a call
    p.clock.t += 1
    p.event("a", {"type": "call_finished", "program": "k", "call": "c1", "tokens": 1000})
    p.event("a", {"type": "call_finished", "program": "x", "call": "c1", "tokens": 1000})
    for rec in list(p.ops.values()):
        report_op(p, rec.op)
    assert p.tiers.gpu[(("kv", "k", "planner"), (int(first[4:]),))].ready
    p.clock.t += 1
    assert start("k", "c2") == first  # its KV is there, though the other copy was used last
    p.clock.t += 1
    assert start("y", "c1") == second  # no KV anywhere: the copy with no call running


def test_a_call_starts_where_its_kv_is_being_restored_even_on_the_busier_copy():
    p = make_live_planner(config=lease_config(promote_min_p=1.01))
    for group in ((0,), (1,)):
        with p.store.tx():
            apply([Promote(W, group)], p)
        report_op(p, next(r.op for r in p.ops.values() if r.op.object == list(W) and r.op.dst == f"gpu:{group[0]}"))
    groups = {}
    for prog in ("k", "x", "z"):
        p.event("a", {"type": "program_started", "program": prog})
    for prog in ("k", "x"):  # the second goes to the other copy: the first runs a call
        p.clock.t += 1
        p.event("a", {"type": "call_arrived", "program": prog, "call": "c1", "model": "planner"})
        groups[prog] = p.event("a", {"type": "call_started", "program": prog, "call": "c1"}).group
    for prog in ("k", "x"):
        p.event("a", {"type": "call_finished", "program": prog, "call": "c1", "tokens": 1000})
    for rec in list(p.ops.values()):
        report_op(p, rec.op)
    kvk, home, other = ("kv", "k", "planner"), (int(groups["k"][4:]),), (int(groups["x"][4:]),)
    assert home != other
    with p.store.tx():
        apply([Demote(kvk, home, "host")], p)
    for rec in [r for r in p.ops.values() if tuple(r.op.object) == kvk]:
        report_op(p, rec.op)
    with p.store.tx():
        apply([Promote(kvk, other)], p)  # not reported: still being restored there
    assert not p.tiers.gpu[(kvk, other)].ready and (kvk, home) not in p.tiers.gpu
    p.event("a", {"type": "call_arrived", "program": "z", "call": "c1", "model": "planner"})
    assert p.event("a", {"type": "call_started", "program": "z", "call": "c1"}).group == groups["x"]  # used last
    p.event("a", {"type": "call_arrived", "program": "k", "call": "c2", "model": "planner"})
    assert p.event("a", {"type": "call_started", "program": "k", "call": "c2"}).group == groups["x"]


@pytest.mark.parametrize("homes, want", [(None, (0,)), ((("reviewer", (1,)),), (1,))])
def test_the_operators_layout_homes_a_model_with_no_copy(homes, want):
    p = make_live_planner(config=lease_config(homes=homes))
    p.event("a", {"type": "program_started", "program": "p1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c1", "model": "reviewer"})
    p.tick()
    assert [g for (key, g) in p.tiers.gpu if key == ("w", "reviewer")] == [want]


def test_a_layout_that_does_not_fit_is_refused_at_start_and_by_a_new_cluster(tmp_path):
    homes = (("reviewer", (1,)),)
    one = load_cluster("toy2").model_dump(mode="json")
    one["nodes"] = one["nodes"][:1]
    store = Store(tmp_path / "sb.db")
    with pytest.raises(ValueError, match=r"homes\[0\]: reviewer \(tp 1\) cannot run on GPUs \(1,\)"):
        LivePlanner(Cluster(**one), load_catalog("toy"), store, config=lease_config(homes=homes))
    assert store.get_meta("priority_epoch_s") is None and store.get_meta("cluster") is None, "refused before a write"
    p = make_live_planner(config=lease_config(homes=homes))
    with pytest.raises(Invalid, match=r"homes\[0\]: reviewer"):
        p.set_cluster(one, p.catalog.model_dump(mode="json"))
    assert len(p.cluster.gpus) == 2  # nothing changed


def _morning(p):
    """Programs that each call the planner, then the coder: what the planner learns."""
    for i in range(8):
        prog = f"m{i}"
        p.event("a", {"type": "program_started", "program": prog})
        p.event("a", {"type": "call_arrived", "program": prog, "call": "c1", "model": "planner"})
        p.event("a", {"type": "call_arrived", "program": prog, "call": "c2", "model": "coder"})
        p.event("a", {"type": "program_finished", "program": prog})


def test_a_restart_takes_up_what_the_planner_had_learnt(tmp_path, caplog):
    clock = Clock(1000.0)
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    _morning(p)
    p.event("a", {"type": "program_started", "program": "live"})  # still running at the restart
    p.event("a", {"type": "call_arrived", "program": "live", "call": "c1", "model": "planner"})
    p.event("a", {"type": "program_started", "program": "tooling"})  # ... in a tool wait
    for ev in ({"type": "call_arrived", "model": "planner"}, {"type": "call_started"},
               {"type": "call_finished", "tokens": 10}):
        p.event("a", {**ev, "program": "tooling", "call": "c1"})
    p.event("a", {"type": "tool_started", "program": "tooling", "tool": "build"})
    p.tick()  # the planning step saves it
    pred = p.core.predictor
    want, starts = pred.switch_matrix(clock.t), pred.program_starts.rows(clock.t)[0, 0]
    p.store.close()
    clock.t += 3 * 86400.0  # down over a weekend
    q = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    pred = q.core.predictor
    got = pred.switch_matrix(clock.t)
    assert np.allclose(got, want) and got[0, 1] > 0.5  # planner -> coder, as before the restart
    assert pred.program_starts.rows(clock.t)[0, 0] == pytest.approx(starts)  # the live ones are no new starts
    waiting = pred.live["tooling"]
    assert (waiting.phase, waiting.tool, waiting.since, waiting.last_model) == ("tool", "build", 1000.0, "planner")
    q.event("a", {"type": "call_arrived", "program": "live", "call": "c2", "model": "coder"})
    assert pred.switch_matrix(clock.t)[0, 1] > got[0, 1]  # a switch from its last model, not a first call
    q.store.close()
    with Store(tmp_path / "sb.db").tx() as s:  # a state the planner cannot read: it starts afresh
        s.set_meta("learnt", {"format": "something else"})
    with caplog.at_level("WARNING", logger="statebudget.planner"):
        r = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    assert "starts afresh" in caplog.text and "format" in caplog.text
    pred = r.core.predictor
    assert pred.switch_matrix(clock.t)[0, 1] == pytest.approx(0.25)
    # its programs still resume: no new starts, each from the model its latest call asked for
    assert pred.program_starts.rows(clock.t)[0, 0] == 0.0 and pred.live["live"].last_model == "coder"


def test_what_was_learnt_carries_over_to_a_new_cluster():
    p = make_live_planner()
    _morning(p)
    view = p.set_cluster(load_cluster("toy2").model_dump(mode="json"), load_catalog("toy").model_dump(mode="json"))
    assert view.catalog_epoch == 2
    assert p.core.predictor.switch_matrix(p.now)[0, 1] > 0.5
    assert p.store.get_meta("learnt")["format"] == "statebudget.predictor/1"
