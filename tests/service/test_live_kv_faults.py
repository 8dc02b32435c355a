"""The service's ops that do not land: a tool-wait swap-out that the call overtakes or the data
plane fails, against a real data plane (a local adapter through the service's routes); drops the
engine fails, sent again later and kept or cancelled across restarts and the books' changes."""

import pytest

from tests.helpers import Clock, report_op
from tests.service.toolwait_kv import KV, KV_BYTES, TOKENS, after_a_call, kv_ops, planner, start_tool
from statebudget.core.decisions import Demote, Promote, apply
from statebudget.engine_adapters.base import gpu_indexes
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.live import LivePlanner


def bridged(p, tmp_path, fail=lambda op: None, during_report=None):
    """A local adapter (a real data plane, 0.4 GB arena on gpu:0) of node n0, talking to `p`
    through the service's own routes; `fail(op)` may return an error the data plane reports
    instead of running the op; `during_report[op_id]()` runs just before that op's report."""
    from fastapi.testclient import TestClient

    from statebudget.api.app import create_app
    from statebudget.api.auth import Auth, TokenEntry
    from statebudget.engine_adapters.base import OpResult
    from statebudget.engine_adapters.local import LocalAdapter

    token = "adapter-n0-token-0123456789"
    client = TestClient(create_app(p, Auth([TokenEntry(token=token, role="adapter", node="n0")]), planning_loop=False))
    client.headers["Authorization"] = f"Bearer {token}"

    class Adapter(LocalAdapter):
        def execute(self, op):
            error = fail(op)
            if error:
                return OpResult(status="failed", error=error, version=op.version, epoch=op.epoch)
            return super().execute(op)

        def report(self, op, result):
            (during_report or {}).pop(op.op_id, lambda: None)()
            return super().report(op, result)

    return Adapter("http://testserver", "n0", token, client=client, root=tmp_path, use_cuda=False,
                   arena_bytes=400_000_000)


def drain(ad, most=20):
    """Steps until one executes nothing; how many executed something."""
    for i in range(most):
        if not ad.step(0):
            return i
    raise AssertionError(f"still executing ops after {most} polls")


def a_call_on_gpu0(p, ad):
    """The planner's weights promoted onto gpu:0 through `ad`, then one call of program p1 there,
    which leaves its KV in HBM (the engine's; the data plane does not count it)."""
    with p.store.tx():
        apply([Promote(("w", "planner"), (0,))], p)
    drain(ad)
    p.event("a", {"type": "program_started", "program": "p1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c1", "model": "planner"})
    p.event("a", {"type": "call_started", "program": "p1", "call": "c1"})
    p.event("a", {"type": "call_finished", "program": "p1", "call": "c1", "tokens": TOKENS})


@pytest.mark.parametrize("how", ["the call grows the KV in place", "the data plane fails the move"])
def test_a_swap_out_that_does_not_land_frees_its_room_before_the_promotes_planned_into_it(tmp_path, how):
    # A real data plane behind the live planner. A tool-wait swap-out frees room in the books and
    # two weight promotes are planned into it; then the move does not land, and the books, out of
    # room, drop the KV instead. The data plane must run that drop before the promotes, or the
    # second finds the arena still holding the KV (a CI run saw "gpu:1 full" so).
    p, clock = planner("swap")
    during_report, failing = {}, set()
    ad = bridged(p, tmp_path, lambda op: "host DRAM is gone" if op.op_id in failing else None, during_report)
    a_call_on_gpu0(p, ad)
    (group,) = p.tiers.groups_of[KV]
    start_tool(p)
    drain(ad)                                             # out to host DRAM ...
    with p.store.tx():
        apply([Promote(KV, group)], p)
    drain(ad)                                             # ... and back: the arena holds the KV now
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "build", "call": "t1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "planner"})
    p.event("a", {"type": "call_started", "program": "p1", "call": "c2"})
    p.event("a", {"type": "call_finished", "program": "p1", "call": "c2", "tokens": TOKENS})
    gpu = ad.plane.gpu_pools[group[0]]
    assert gpu.used == 120_000_000 + KV_BYTES
    start_tool(p, tid="t2")
    (out,) = kv_ops(p)
    with p.store.tx():                                     # the room the swap-out frees, taken
        apply([Promote(("w", m), group) for m in ("coder", "reviewer")], p)
    if how == "the data plane fails the move":
        failing.add(out.op.op_id)
    else:
        def the_call_comes_back_and_grows_the_kv():
            p.event("a", {"type": "tool_finished", "program": "p1", "tool": "build", "call": "t2"})
            p.event("a", {"type": "call_arrived", "program": "p1", "call": "c3", "model": "planner"})
            p.event("a", {"type": "call_started", "program": "p1", "call": "c3"})
            p.event("a", {"type": "call_finished", "program": "p1", "call": "c3", "tokens": TOKENS + 1000})
        during_report[out.op.op_id] = the_call_comes_back_and_grows_the_kv
    drain(ad)
    rows = {r["op_id"]: r for r in p.store.ops()}
    assert rows[out.op.op_id]["status"] == ("failed" if failing else "cancelled")
    assert [r["reason"] for r in rows.values() if r["status"] == "failed" and r["op_id"] not in failing] == []
    assert all(r["status"] == "done" for r in rows.values() if r["op"]["object"][0] == "w")
    assert (KV, group) not in p.tiers.gpu and gpu.used == 120_000_000 + 160_000_000 + 100_000_000
    p.tiers.check()


@pytest.mark.parametrize("fails", [1, 99])
def test_a_drop_the_engine_fails_is_sent_again_a_few_times_later_and_holds_up_nothing(tmp_path, fails):
    # The KV of a finished program is dropped; the engine fails the drop once (busy), or always (no
    # per-program KV control). It is sent again 1 s, 2 s, 4 s later, not at every poll, and the
    # ops behind it run meanwhile.
    p, clock = planner("preserve")
    failed = []

    def fail(op):
        if op.object[0] == "kv" and len(failed) < fails:
            failed.append(clock.t)
            return "no per-program KV control"

    ad = bridged(p, tmp_path, fail)
    a_call_on_gpu0(p, ad)
    p.event("a", {"type": "program_finished", "program": "p1"})
    with p.store.tx():
        apply([Promote(("w", "coder"), (0,))], p)
    drain(ad)
    assert ad.plane.ready(["w", "coder"], "gpu:0")  # the failed drop held up nothing;
    assert all(r.not_before > clock.t for r in p.ops.values())  # ... sent again, later
    t0 = clock.t
    while p.due_in() is not None:
        clock.t += p.due_in()
        p.tick()
        drain(ad)
    drops = [r["status"] for r in p.store.ops() if r["op"]["object"][0] == "kv"]
    if fails == 1:
        assert drops == ["failed", "done"] and failed == [t0]
    else:
        assert drops == ["failed"] * 4 and [t - t0 for t in failed] == [0.0, 1.0, 3.0, 7.0]
    assert not p.ops and p.due_in() is None
    p.tiers.check()


def test_a_drop_in_place_of_a_failed_move_keeps_its_place_in_the_plan_across_a_restart(tmp_path):
    import sqlite3

    from statebudget.service.ledger import Store

    cl, cat = load_cluster("toy2"), load_catalog("toy")
    old = tmp_path / "old.db"  # a ledger written before ops had a place: it opens, and is migrated
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE ops (op_id TEXT PRIMARY KEY, node TEXT NOT NULL, status TEXT NOT NULL, "
                   "plan_version INTEGER NOT NULL, offered INTEGER NOT NULL, op TEXT NOT NULL, result TEXT, reason TEXT)")
    clock = Clock()
    p = LivePlanner(cl, cat, Store(old), clock=clock, kv_rule="swap")
    group = after_a_call(p, clock)
    start_tool(p)
    (out,) = kv_ops(p)
    with p.store.tx():
        apply([Promote(("w", m), group) for m in ("coder", "reviewer", "planner")], p)
    node = out.node
    report_op(p, out.op, status="failed", error="host DRAM is gone")
    (drop,) = [r.op.op_id for r in p.ops.values() if r.op.kind == "drop" and tuple(r.op.object) == KV]
    promotes = [r.op.op_id for r in p.ops.values() if r.op.kind == "promote"]
    p.store.close()
    q = LivePlanner(cl, cat, Store(old), clock=clock, kv_rule="swap")
    # ahead of the promotes planned into its room, though it was made after them
    assert [o.op_id for o in q.plan_for(node, 0).ops] == [drop, *promotes]


def test_a_failed_drop_of_an_out_of_date_kv_copy_is_not_taken_back_as_the_current_one():
    p, clock = planner("preserve")
    group = after_a_call(p, clock)
    other = (1 - group[0],)
    with p.store.tx():
        apply([Promote(KV, other)], p)
    for rec in list(p.ops.values()):
        report_op(p, rec.op)
    assert p.tiers.gpu[(KV, other)].ready  # a copy on each GPU
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "planner"})
    ran = gpu_indexes(p.event("a", {"type": "call_started", "program": "p1", "call": "c2"}).group)
    stale = other if ran == group else group
    p.event("a", {"type": "call_finished", "program": "p1", "call": "c2", "tokens": TOKENS + 500})
    (drop,) = [r for r in kv_ops(p) if r.op.kind == "drop" and r.op.src == f"gpu:{stale[0]}"]
    report_op(p, drop.op, status="failed", error="busy")
    assert (KV, stale) not in p.tiers.gpu  # the engine's copy there is of the older version: it must go
    assert p.tiers.gpu[(KV, ran)].ready and p.due_in() is not None  # ... and its drop is sent again,
    clock.t += p.due_in()
    p.tick()
    (again,) = [r for r in kv_ops(p) if r.op.kind == "drop" and r.op.src == f"gpu:{stale[0]}"]
    assert again.op.version == drop.op.version  # ... as the drop of that older version
    report_op(p, again.op, status="failed", error="busy")
    assert (KV, stale) not in p.tiers.gpu
    p.tiers.check()


def test_a_failed_drop_sent_again_later_is_kept_through_a_restart(tmp_path):
    from statebudget.service.ledger import Store

    cl, cat = load_cluster("toy2"), load_catalog("toy")
    clock = Clock()
    p = LivePlanner(cl, cat, Store(tmp_path / "sb.db"), clock=clock, kv_rule="preserve")
    after_a_call(p, clock)
    p.event("a", {"type": "program_finished", "program": "p1"})
    (drop,) = kv_ops(p)
    node = drop.node
    report_op(p, drop.op, status="failed", error="busy")
    (held,) = kv_ops(p)
    assert held.not_before == clock.t + 1.0 and not p.plan_for(node, 0).ops  # held back for 1 s
    p.store.close()
    q = LivePlanner(cl, cat, Store(tmp_path / "sb.db"), clock=clock, kv_rule="preserve")
    assert not q.plan_for(node, 0).ops and q.due_in() == pytest.approx(1.0) and q.ops[held.op.op_id].tries == 1
    clock.t += 1.0
    assert not q.plan_for(node, 0).ops  # offered once the planning step has looked at it
    version = q.plan_version
    q.tick()
    assert [o.op_id for o in q.plan_for(node, 0).ops] == [held.op.op_id] and q.plan_version > version


def test_a_drop_held_back_is_cancelled_when_the_books_take_that_copy_up_again():
    p, clock = planner("preserve")
    group = after_a_call(p, clock)
    W = ("w", "planner")
    for decisions in ([Promote(W, group)], [Promote(("w", "coder"), group)],
                      [Demote(W, group, "none"), Promote(("w", "reviewer"), group)]):
        with p.store.tx():
            apply(decisions, p)
        for rec in [r for r in p.ops.values() if r.op.kind == "promote"]:
            report_op(p, rec.op)
    (drop,) = [r for r in p.ops.values() if tuple(r.op.object) == W]
    report_op(p, drop.op, status="failed", error="busy")
    assert (W, group) not in p.tiers.gpu  # no room to take it back: held, sent again in 1 s
    (held,) = [r for r in p.ops.values() if tuple(r.op.object) == W]
    with p.store.tx():
        apply([Promote(W, group)], p)  # wanted there again before that
    assert (W, group) in p.tiers.gpu
    clock.t += 1.0
    assert held.op.op_id not in [o.op_id for o in p.plan_for(held.node, 0).ops]  # not before the check
    p.tick()
    assert held.op.op_id not in p.ops and held.status == "cancelled"  # it would delete the copy promoted
    p.tiers.check()
