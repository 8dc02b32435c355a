"""The service's tool-wait KV decisions: the simulator's `ToolWaitKV`,
carried out by the live planner as ops. A fake clock drives its timers."""

import time

import pytest

from tests.helpers import Clock, call, catalog, cluster, program, report_op, tool, trace
from tests.service.toolwait_kv import KV, KV_BYTES, NO_SPECULATION, TOKENS, after_a_call, kv_ops, planner, start_tool
from statebudget.engine_adapters.base import run_order
from statebudget.models.load import load_catalog, load_cluster
from statebudget.models.plan import Op
from statebudget.service.live import LivePlanner
from statebudget.core.waits import ToolWaitModel
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.policies import make_policy
from statebudget.core.decisions import Promote, apply


def test_swap_moves_the_kv_to_host_in_the_background_and_discard_drops_it():
    for rule, kind, dst in (("swap", "demote", "host:"), ("discard", "drop", "none")):
        p, clock = planner(rule)
        group = after_a_call(p, clock)
        start_tool(p)
        (rec,) = kv_ops(p)
        assert (rec.op.kind, rec.op.src, rec.op.dst.startswith(dst)) == (kind, f"gpu:{group[0]}", True)
        assert rec.op.background == (rule == "swap") and rec.op.bytes == pytest.approx(KV_BYTES)
        assert (KV, group) not in p.tiers.gpu and p.kv_tokens[KV] == TOKENS  # the version stays: recompute it
        assert p.residency().tool_wait_kv["actions"] == {rule: 1}
        report_op(p, rec.op)
        if rule == "swap":
            assert p.tiers.host[(KV, p.gpus[group[0]].node)].ready
        p.tiers.check()


def test_preserve_holds_the_kv_suspended_until_the_tool_returns():
    p, clock = planner("preserve")
    group = after_a_call(p, clock)
    start_tool(p)
    assert not kv_ops(p) and p.due_in() is None  # no op, and no timer: preserve never decides again
    assert p.residency().tool_wait_kv["suspended"] == [["kv", "p1", "planner"]]
    clock.t = 30.0
    p.tick()
    assert p.tiers.gpu[(KV, group)].ready and not kv_ops(p)
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "build", "call": "t1"})
    assert p.residency().tool_wait_kv["suspended"] == []


def test_the_residency_cli_marks_a_kv_held_through_a_tool_wait_whatever_its_name(monkeypatch, tmp_path):
    # names may hold '/' (the API allows it): the CLI matches the suspended objects whole
    import httpx
    from typer.testing import CliRunner

    from statebudget.cli import app

    p, clock = planner("preserve")
    group = after_a_call(p, clock, prog="team/p1")
    start_tool(p, prog="team/p1")
    body = p.residency().body()
    assert body["tool_wait_kv"]["suspended"] == [["kv", "team/p1", "planner"]]
    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Response(200, json=body))
    monkeypatch.setenv("COLUMNS", "200")
    res = CliRunner().invoke(app, ["residency", "--planner", "http://127.0.0.1:1", "--token", "t",
                                   "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "kv/team/p1/planner" in line)
    assert f"gpu:{group[0]}" in row and "ready, tool wait" in row, res.output
    assert "1 KV held through a tool wait" in res.output


def test_a_program_with_a_call_still_running_is_not_suspended():
    p, clock = planner("swap")
    after_a_call(p, clock)
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "coder"})
    p.event("a", {"type": "call_started", "program": "p1", "call": "c2"})
    start_tool(p)  # another thread's tool: the program still computes
    assert not kv_ops(p) and p.kvw.actions == {}


def test_a_ttl_that_finds_another_thread_running_is_judged_again_later():
    # The KV is preserved for a TTL; when it runs out another thread's call (on another model)
    # runs, so the rule waits. Once that call is over, the next check moves the KV out, rather
    # than holding it until the tool returns.
    p, clock = planner("adaptive", waits={"quick": (0.05, 1.5)})
    after_a_call(p, clock)
    start_tool(p, "quick")
    assert not kv_ops(p) and p.kvw.actions == {"preserve": 1}
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "coder"})
    p.event("a", {"type": "call_started", "program": "p1", "call": "c2"})
    clock.t += p.due_in()
    p.tick()
    assert not kv_ops(p) and p.due_in() is not None  # busy: judged again later
    clock.t += 1.0
    p.event("a", {"type": "call_finished", "program": "p1", "call": "c2", "tokens": 100})
    for _ in range(20):
        if kv_ops(p) or p.due_in() is None:
            break
        clock.t += max(p.due_in(), 0.0)
        p.tick()
    (out,) = kv_ops(p)
    assert out.op.kind == "demote" and p.kvw.actions["swap"] == 1


def test_adaptive_preserves_a_short_wait_then_swaps_when_it_runs_long_and_swaps_back_before_the_return():
    # The tool usually takes 50 ms: holding 20 % of the GPU that long costs less than the round
    # trip over PCIe, but its tail is long. The rule holds the KV for a TTL that its wait
    # distribution sets (short of the tail); this wait goes on, so at the TTL the rule decides
    # again on the wait still expected, moves the KV out, and brings it back ahead of the
    # predicted return.
    p, clock = planner("adaptive", waits={"quick": (0.05, 1.5)})
    metered = []
    p.telemetry.kv_action = metered.append
    group = after_a_call(p, clock)
    start_tool(p, "quick")
    assert not kv_ops(p) and p.kvw.actions == {"preserve": 1}
    ttl = p.due_in()
    assert 0 < ttl < p.kvw.waits.remaining_quantiles("quick", 0.0, [0.99])[0]
    clock.t += ttl / 2
    p.tick()
    assert not kv_ops(p)  # not yet due
    rechecks = 0
    while not kv_ops(p):  # judged again at each TTL, until it swaps
        clock.t += p.due_in()
        p.tick()
        rechecks += 1
        assert rechecks < 20
    (out,) = kv_ops(p)
    assert out.op.kind == "demote" and out.op.background and p.kvw.actions["swap"] == 1
    assert p.kvw.actions["preserve"] == 1  # a TTL that keeps it preserved is no new action
    assert metered == ["preserve", "swap"]  # /metrics counts the same actions
    back_in = p.due_in()
    assert back_in is not None and back_in >= 0
    clock.t += back_in
    p.tick()
    assert kv_ops(p) == [out]  # the swap-out is still being written: the swap-in waits for it
    report_op(p, out.op)
    (back,) = kv_ops(p)
    assert (back.op.kind, back.op.src, back.op.dst, back.op.background) == \
        ("promote", out.op.dst, f"gpu:{group[0]}", True)
    report_op(p, back.op)
    assert p.tiers.gpu[(KV, group)].ready
    p.tiers.check()


def test_a_restart_takes_a_tool_wait_up_where_it_is(monkeypatch, tmp_path):
    # Timers are not on disk. Restarted during the wait, the planner judges a KV still in HBM on the
    # wait still expected (here: it has run long, so it swaps), and one already swapped out gets
    # its swap-in before the predicted return again. Without that, both stay put until the call.
    from statebudget.service.ledger import Store

    waits = ToolWaitModel({"quick": (0.05, 1.5)})
    monkeypatch.setattr(ToolWaitModel, "from_fit", classmethod(lambda cls, *a, **k: waits))
    cl, cat = load_cluster("toy2"), load_catalog("toy")
    for swapped_before in (False, True):
        clock = Clock()
        db = tmp_path / f"sb-{swapped_before}.db"
        p = LivePlanner(cl, cat, Store(db), clock=clock, kv_rule="adaptive", config=NO_SPECULATION)
        group = after_a_call(p, clock)
        start_tool(p, "quick")
        if swapped_before:
            while not kv_ops(p):
                clock.t += p.due_in()
                p.tick()
            (out,) = kv_ops(p)
            report_op(p, out.op)
            assert (KV, group) not in p.tiers.gpu
        p.store.close()
        clock.t += 5.0  # down for a while; the tool still runs
        q = LivePlanner(cl, cat, Store(db), clock=clock, kv_rule="adaptive", config=NO_SPECULATION)
        assert q.due_in() is not None  # the swap-in's timer
        if not swapped_before:
            (out,) = kv_ops(q)  # 5 s into a wait predicted at 50 ms: out it goes, at once
            assert out.op.kind == "demote" and out.op.background and q.kvw.actions == {"swap": 1}
            report_op(q, out.op)
        while q.due_in() is not None and not [r for r in kv_ops(q) if r.op.kind == "promote"]:
            clock.t += max(q.due_in(), 0.0)
            q.tick()
        (back,) = [r for r in kv_ops(q) if r.op.kind == "promote"]
        assert (back.op.dst, back.op.background) == (f"gpu:{group[0]}", True)
        report_op(q, back.op)
        assert q.tiers.gpu[(KV, group)].ready
        q.tiers.check()


def test_adaptive_learns_from_the_service_that_programs_do_not_come_back_to_their_kv():
    # Each program: a call on m, a tool, then the program ends without using that KV again. The
    # rule starts by swapping it (prior: it resumes) and turns to discarding it (the simulator's
    # test_adaptive_learns_to_discard_kv_its_programs_never_resume, through the service's events).
    clock = Clock()
    p = LivePlanner(cluster(hbm_gb=40.0, tflops=10.0), catalog(("m", 10.0, 1_000_000)), clock=clock,
                    kv_rule="adaptive")
    for i in range(12):
        prog = f"q{i}"
        p.event("a", {"type": "program_started", "program": prog})
        p.event("a", {"type": "call_arrived", "program": prog, "call": "c1", "model": "m"})
        p.event("a", {"type": "call_started", "program": prog, "call": "c1"})
        p.event("a", {"type": "call_finished", "program": prog, "call": "c1", "tokens": 5_000})
        p.event("a", {"type": "tool_started", "program": prog, "tool": "build"})
        p.event("a", {"type": "tool_finished", "program": prog, "tool": "build", "duration_s": 30.0})
        p.event("a", {"type": "program_finished", "program": prog})
        for rec in list(p.ops.values()):
            report_op(p, rec.op)
        clock.t += 40.0
    assert p.kvw.actions["swap"] >= 1
    assert p.kvw.resume.p("build", "m") < 0.3
    assert p.kvw.actions["discard"] >= 6  # it stopped paying for a swap nobody comes back to
    assert len(p.kvw.ttl_errors) == 12


def test_a_cancel_during_a_swap_leaves_nothing_behind():
    p, clock = planner("adaptive", waits={"build": (30.0, 0.5)})
    after_a_call(p, clock)
    start_tool(p)
    (out,) = kv_ops(p)
    assert p.due_in() is not None  # a swap-in is planned
    p.event("a", {"type": "program_cancelled", "program": "p1"})
    assert out.op.op_id not in p.ops  # the swap-out is cancelled ...
    (drop,) = kv_ops(p)  # ... and its source, still in HBM, must go
    assert (drop.op.kind, drop.op.src, drop.op.dst) == ("drop", out.op.src, "none")
    report_op(p, drop.op)
    clock.t += 100.0
    p.tick()  # the swap-in timer fires into a cancelled program: nothing
    assert not kv_ops(p) and KV not in p.kv_tokens
    assert not [k for k in p.tiers.host if k[0] == KV] and KV not in p.tiers.groups_of
    p.tiers.check()


def test_the_service_and_the_simulator_decide_alike():
    # One interrupt of one KV on one GPU, in both mechanisms, with the same learned tool waits:
    # the same rule, for the same sizes and links.
    cl, cat = cluster(hbm_gb=40.0, tflops=10.0), catalog(("m", 10.0, 1_000_000))
    seen = []
    for waits in ({"build": (1.0, 0.5)}, {"build": (60.0, 0.5)}):
        nodes = [call("a", "m", ctx=5_000, out=0), tool("t", ["a"], duration=2.0, name="build"),
                 call("b", "m", ["t"], ctx=5_000, out=0)]
        sim = Simulator(cl, cat, trace(program("p1", nodes)), make_policy("lru-keepwarm"),
                        config=SimConfig(kv_rule="adaptive"))
        sim.kvw.waits = ToolWaitModel(dict(waits))
        res = sim.run()
        clock = Clock()
        live = LivePlanner(cl, cat, clock=clock, kv_rule="adaptive")
        live.kvw.waits = ToolWaitModel(dict(waits))
        live.event("a", {"type": "program_started", "program": "p1"})
        live.event("a", {"type": "call_arrived", "program": "p1", "call": "a", "model": "m"})
        live.event("a", {"type": "call_started", "program": "p1", "call": "a"})
        live.event("a", {"type": "call_finished", "program": "p1", "call": "a", "tokens": 5_000})
        live.event("a", {"type": "tool_started", "program": "p1", "tool": "build"})
        assert +live.kvw.actions == +res.kv_actions
        seen.append(dict(+res.kv_actions))
    assert seen == [{"preserve": 1}, {"swap": 1}]  # both branches of the rule were compared


def test_run_order_defers_only_swap_ins_that_nothing_after_them_depends_on():
    def op(i, obj, kind="promote", background=False):
        return Op(op_id=f"op{i}", kind=kind, object=list(obj), src="host:n0", dst="gpu:0", bytes=1.0,
                  background=background)

    ops = [op(1, KV, background=True),                       # a swap-in: after the rest
           op(2, ("kv", "p2", "coder"), "demote", True),     # a swap-out frees room: stays in place
           op(3, ("w", "coder")),                            # ... which this promote may use
           op(4, ("kv", "p3", "coder"), background=True),    # a swap-in that a later op of its KV follows
           op(5, ("kv", "p3", "coder"), "demote"),
           op(6, ("w", "a"))]
    assert [o.op_id for o in run_order(ops)] == ["op2", "op3", "op4", "op5", "op6", "op1"]
    fg = [op(1, ("w", "a")), op(2, ("w", "b"))]
    assert run_order(fg) == fg


def test_a_call_that_comes_back_stops_its_kvs_swap_out_in_flight():
    p, clock = planner("swap")
    group = after_a_call(p, clock)
    start_tool(p)
    (out,) = kv_ops(p)
    host = out.op.dst
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "build", "call": "t1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "planner"})
    assert out.op.op_id not in p.ops and not kv_ops(p)  # stopped: no drop, no round trip
    assert p.tiers.gpu[(KV, group)].ready and (KV, host.split(":")[1]) not in p.tiers.host
    assert p.event("a", {"type": "call_started", "program": "p1", "call": "c2"}).group == f"gpu:{group[0]}"
    assert p.tiers.gpu[(KV, group)].pins == 1
    p.tiers.check()


@pytest.mark.parametrize("rule", ["swap", "discard"])
def test_a_kv_grown_in_place_under_an_unfinished_swap_out_is_not_dropped(rule):
    # The room the swap-out (or the discard's drop) freed went to another copy, so the returning
    # call cannot stop the move; it runs on the engine's copy anyway and grows it. The move stops
    # without a drop of that copy.
    p, clock = planner(rule)
    group = after_a_call(p, clock)
    start_tool(p)
    (out,) = kv_ops(p)
    with p.store.tx():  # the three toy models take the 0.4 GB arena, the freed room included
        apply([Promote(("w", m), group) for m in ("coder", "reviewer", "planner")], p)
    assert not p.tiers.fits_gpu(group, KV_BYTES)
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "build", "call": "t1"})
    p.event("a", {"type": "call_arrived", "program": "p1", "call": "c2", "model": "planner"})
    assert out.op.op_id in p.ops  # no room to take it back: the move goes on
    assert p.event("a", {"type": "call_started", "program": "p1", "call": "c2"}).group == f"gpu:{group[0]}"
    filler = next(r for r in p.ops.values() if r.op.object == ["w", "reviewer"])
    with p.store.tx():
        p._close(filler, "cancelled", "test: room for the grown KV")
    p.event("a", {"type": "call_finished", "program": "p1", "call": "c2", "tokens": TOKENS + 1000})
    assert out.op.op_id not in p.ops
    assert not [r for r in kv_ops(p) if r.op.kind == "drop"]  # nothing deletes the grown KV
    c = p.tiers.gpu.get((KV, group))
    assert c is not None and c.ready and p.kv_tokens[KV] == TOKENS + 1000
    p.tiers.check()


def test_a_repeated_tool_start_keeps_the_planned_swap_in():
    p, clock = planner("adaptive", waits={"build": (30.0, 0.5)})
    after_a_call(p, clock)
    start_tool(p)
    (out,) = kv_ops(p)
    report_op(p, out.op)
    due = p.due_in()
    clock.t += 1.0
    start_tool(p)  # the runtime re-sent the event
    assert p.kvw.actions == {"swap": 1} and p.due_in() == pytest.approx(due - 1.0)
    clock.t += p.due_in()
    p.tick()
    (back,) = kv_ops(p)
    assert (back.op.kind, back.op.background) == ("promote", True)


def test_the_service_loop_wakes_for_a_ttl_without_any_event():
    # The planning step comes every 60 s here, but the preserved KV's TTL is due in 0.1 s: the
    # loop wakes for it, the rule decides again on the longer wait still expected, and the swap
    # reaches the adapter's long poll with no further event.
    from fastapi.testclient import TestClient

    from statebudget.api.app import create_app
    from statebudget.api.auth import Auth, TokenEntry

    auth = Auth([TokenEntry(token="runtime-a-0123456789", role="runtime", tenant="a")] +
                [TokenEntry(token=f"adapter-{n}-0123456789", role="adapter", node=n) for n in ("n0", "n1")])
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), kv_rule="adaptive")
    p.kvw.waits = ToolWaitModel({"quick": (0.1, 2.0)})
    runtime = {"Authorization": "Bearer runtime-a-0123456789"}
    # coalesce_s: the first planning step comes 1 s after the first event, after the five events
    # below, so it cannot move the KV between the call's end and the tool's start
    with TestClient(create_app(p, auth, tick_s=60.0, coalesce_s=1.0)) as c:
        def ev(**body):
            r = c.post("/v1/events", json={"program": "p1", **body}, headers=runtime)
            assert r.status_code == 200, r.text
            return r.json()
        ev(type="program_started")
        ev(type="call_arrived", call="c1", model="planner")
        gpu = ev(type="call_started", call="c1")["group"]
        ev(type="call_finished", call="c1", tokens=TOKENS)
        ev(type="tool_started", tool="quick", call="t1")
        assert p.kvw.actions == {"preserve": 1}
        node = p.gpus[int(gpu.split(":")[1])].node
        version, swap, t0 = 0, None, time.monotonic()
        while time.monotonic() < t0 + 20:  # well before the 60 s tick: only the timer's wake-up can do it
            plan = c.get("/v1/plan", params={"node": node, "after": version, "wait": 2},
                         headers={"Authorization": f"Bearer adapter-{node}-0123456789"}).json()
            version = plan["version"]
            swap = next((o for o in plan["ops"] if tuple(o["object"]) == KV), None)
            if swap is not None:
                break
        assert swap is not None and (swap["kind"], swap["src"], swap["background"]) == ("demote", gpu, True)
        assert p.kvw.actions == {"preserve": 1, "swap": 1}


def test_a_kv_a_lease_asks_for_is_kept_through_the_tool_wait():
    # The runtime leased the planner (with its KV, already in HBM) for the call after this tool:
    # the rule that would swap the KV out keeps it, so the lease's promise holds. Without the
    # lease, the same wait swaps it.
    for leased in (False, True):
        p, clock = planner("adaptive", waits={"build": (30.0, 0.5)})
        group = after_a_call(p, clock)
        if leased:
            lease = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60, "for_call": "c2"})
            assert lease.kv_version == TOKENS
        start_tool(p)
        if leased:
            assert not kv_ops(p) and p.kvw.actions == {"preserve": 1}
            assert p.tiers.gpu[(KV, group)].ready
        else:
            assert [r.op.kind for r in kv_ops(p)] == ["demote"] and p.kvw.actions == {"swap": 1}


def test_a_kv_stays_suspended_while_another_thread_still_waits():
    # Two branches wait on tools; one returns. Its thread will run a call soon, but until a call
    # runs the program is still waiting on the other tool: its KV stays suspended (as in the
    # simulator), so byte-seconds and TTL re-checks go on.
    p, clock = planner("preserve")
    after_a_call(p, clock)
    for th, tid in (("a", "ta"), ("b", "tb")):
        p.event("a", {"type": "tool_started", "program": "p1", "tool": "search", "call": tid, "thread": th})
    clock.t += 1
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "search", "call": "ta"})
    assert p.residency().tool_wait_kv["suspended"] == [list(KV)]
    p.event("a", {"type": "tool_finished", "program": "p1", "tool": "search", "call": "tb"})
    assert p.residency().tool_wait_kv["suspended"] == []
