"""Program-aware serving: policy specs, queue keys and disciplines, admission against starvation,
compute slots, tenants' fair shares and failed attempts (the tool-wait KV rules: test_toolwait.py)."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.helpers import Clock, call, catalog, cluster, program, tool, trace
from statebudget.cli import app
from statebudget.models.load import write_trace
from statebudget.core.programs import ADMIT_STARVE_S, parse_spec, queue_key
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.policies import REGISTRY, make_policy
from statebudget.traces.generators import generate


def test_policy_specs():
    assert parse_spec("statebudget-lease:plas:adaptive", REGISTRY) == ("statebudget-lease", "plas", "adaptive")
    assert parse_spec("ondemand", REGISTRY) == ("ondemand", "fcfs", None)
    assert parse_spec("ondemand::swap", REGISTRY) == ("ondemand", "fcfs", "swap")
    for bad, msg in (("nope:plas", "unknown policy"), ("ondemand:lifo", "unknown queue"),
                     ("ondemand:fcfs:keep", "unknown tool-wait KV rule"), ("a:b:c:d", r"POLICY\[:QUEUE")):
        with pytest.raises(ValueError, match=msg):
            parse_spec(bad, REGISTRY)


def test_plas_puts_the_program_with_less_service_first_and_aging_bounds_the_wait():
    # Program A has 100 s of service, B 1 s: B's new call goes first under PLAS, not under FCFS.
    a = queue_key("plas", arrive=0.0, now=10.0, program_service=100.0, path_service=0.0)
    b = queue_key("plas", arrive=5.0, now=10.0, program_service=1.0, path_service=0.0)
    assert b < a
    assert queue_key("fcfs", 0.0, 10.0, 100.0, 0.0) < queue_key("fcfs", 5.0, 10.0, 1.0, 0.0)
    # ATLAS looks at the critical path, not the whole program.
    assert queue_key("atlas", 0.0, 10.0, 100.0, 1.0) < queue_key("atlas", 5.0, 10.0, 1.0, 50.0)
    # Aging: after waiting long enough, A's call beats any newcomer with 1 s of service.
    assert queue_key("plas", 0.0, 400.0, 100.0, 0.0) < queue_key("plas", 399.0, 400.0, 1.0, 0.0)


def test_report_keys_policies_by_spec_and_adds_program_metrics(tmp_path):
    write_trace(generate("mapreduce", 1, 0.2), tmp_path / "t.jsonl")
    specs = "ondemand,ondemand:plas,statebudget:atlas:adaptive"
    res = CliRunner().invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                                   str(tmp_path / "t.jsonl"), "--policy", specs, "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert list(doc["policies"]) == specs.split(",")
    block = doc["policies"]["statebudget:atlas:adaptive"]
    for key in ("program_latency_s", "makespan_s", "slowdown", "max_wait_s", "programs_per_hour",
                "tenant_service_share", "kv_actions", "kv_hbm_byte_s", "recomputed_tokens", "ttl_error_s"):
        assert key in block
    assert block["makespan_s"]["n"] > 0  # mapreduce programs fork and join
    assert sum(block["tenant_service_share"].values()) == pytest.approx(1.0, abs=1e-4)
    assert block["slowdown"]["p50"] >= 0.9


def test_a_starving_call_goes_ahead_of_every_call_that_is_not():
    # A call starves once it has waited STARVE_S + STARVE_RATIO x its service level: a long
    # program's call may wait longer before it jumps the queue, in proportion to what it has had.
    from statebudget.core.programs import STARVE_RATIO, STARVE_S, service_level

    big = 40.0
    starve = STARVE_S + STARVE_RATIO * service_level(big)
    assert starve > STARVE_S
    old_big = queue_key("plas", arrive=0.0, now=starve, program_service=big, path_service=0.0)
    new_small = queue_key("plas", arrive=starve - 1, now=starve, program_service=0.0, path_service=0.0)
    assert old_big[0] == 0 and old_big < new_small
    assert queue_key("plas", 0.0, starve - 1e-6, big, 0.0)[0] == 1  # not yet starving: service and aging decide
    assert queue_key("plas", 0.0, STARVE_S, big, 0.0)[0] == 1  # the base alone no longer promotes it
    # a program with no service yet starves after STARVE_S, as before
    assert queue_key("plas", 0.0, STARVE_S, 0.0, 0.0)[0] == 0 and queue_key("plas", 0.0, STARVE_S - 1, 0.0, 0.0)[0] == 1


@pytest.mark.parametrize("queue", ["plas", "atlas"])
def test_no_call_is_overtaken_beyond_the_stated_window_under_load(queue):
    """With one prefill slot per GPU and 8x the mapreduce load, calls queue for compute. A call
    c may only be started after a later arrival d on the same GPU group if d arrived within
    overtaking_window_s(service(c)) of c (core/programs.py); and the discipline does reorder."""
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.core.programs import overtaking_window_s

    tr = generate("mapreduce", 2, 0.3, load=8)
    res = {}
    for q in ("fcfs", queue):
        sim = Simulator(load_cluster("hetero16"), load_catalog("agent-team"), tr, make_policy("statebudget"),
                        config=SimConfig(queue=q, prefill_slots=1))
        res[q] = sim.run()
        service = {pid: pr.service for pid, pr in sim.programs.items()}  # final: an upper bound of it at start
        calls = [c for c in res[q].calls if c.start >= 0 and c.group is not None]
        by_group: dict = {}
        for c in calls:
            by_group.setdefault(c.group, []).append(c)
        overtaken = violations = 0
        for group_calls in by_group.values():
            for c in group_calls:
                for d in group_calls:
                    if d.arrive > c.arrive and c.ready <= d.start < c.start:
                        overtaken += 1
                        if d.arrive - c.arrive > overtaking_window_s(service[c.program]) + 1e-9:
                            violations += 1
        if q != "fcfs":  # fcfs goes by readiness, not arrival: the window is a plas/atlas promise
            assert violations == 0, f"{q}: {violations} overtakings beyond the window"
            assert overtaken > 0, "the discipline never reordered: the test load is too light"
    waits = [c.start - c.ready for c in res["fcfs"].calls if c.start >= 0]
    assert max(waits) > 1.0  # calls did queue for compute


def test_a_long_program_is_not_starved_by_a_stream_of_short_ones():
    """One GPU, one prefill slot, a long program (20 s of service) and short programs arriving
    faster than the GPU serves them. PLAS lets the short ones ahead of the long program's next
    call, but only those that arrived within its starvation window, 30 s + 2 x its 20 s of service
    (aging alone would allow longer)."""
    from statebudget.core.programs import (AGING, STARVE_S, TENANT_SCALE_S, URGENCY_CAP_S, overtaking_window_s,
                                          service_level)

    big = program("big", [call("b1", "m", ctx=5000), tool("t", ["b1"], 1.0), call("b2", "m", ["t"], ctx=250)])
    small = [program(f"s{i:03d}", [call("c", "m", ctx=250)], start=10 + 0.8 * i) for i in range(150)]
    sim = Simulator(cluster(tflops=1.0), catalog(("m", 1.0)), trace(big, *small), make_policy("statebudget"),
                    config=SimConfig(queue="plas", prefill_slots=1))
    res = sim.run()
    b2 = next(c for c in res.calls if c.program == "big" and c.node == "b2")
    service = sim.programs["big"].service - (b2.end - b2.start)  # its service while b2 waited
    window = overtaking_window_s(service)
    # the promotion binds: aging alone would let later arrivals ahead for longer
    assert window < (service_level(service) + URGENCY_CAP_S + 2 * TENANT_SCALE_S) / AGING
    ahead = [c for c in res.calls if c.program != "big" and c.arrive > b2.arrive and c.start < b2.start]
    assert ahead, "PLAS let no short program ahead"
    assert max(c.arrive - b2.arrive for c in ahead) <= window + 1e-9
    assert max(c.arrive - b2.arrive for c in ahead) > STARVE_S  # beyond the old fixed 30 s: the window grew with service
    assert b2.start - b2.arrive < 2 * window


def test_like_sized_programs_stay_fcfs_under_plas_and_a_twice_larger_one_falls_behind():
    from statebudget.core.programs import SERVICE_QUANTUM_S, service_level

    q = SERVICE_QUANTUM_S
    assert [service_level(x) for x in (0.0, q * 0.99, q, q * 1.99, q * 2, q * 5)] == [0, 0, q, q, 2 * q, 4 * q]
    # 12 s and 18 s of service share a level: the earlier arrival goes first, as under fcfs
    early = queue_key("plas", arrive=0.0, now=10.0, program_service=1.8 * q, path_service=0.0)
    late = queue_key("plas", arrive=5.0, now=10.0, program_service=1.2 * q, path_service=0.0)
    assert early < late
    # four times the service: the later, smaller program overtakes
    big = queue_key("plas", arrive=0.0, now=10.0, program_service=4 * q, path_service=0.0)
    small = queue_key("plas", arrive=5.0, now=10.0, program_service=q, path_service=0.0)
    assert small < big


def test_max_batch_bounds_the_calls_a_gpu_runs_at_once():
    """`max_batch=1`: a GPU runs one call at a time, so calls on one GPU never overlap
    and the later ones queue (the default of 32 lets them share it)."""
    from statebudget.sim.runner import replay

    progs = [program(f"p{i}", [call("c", "m", ctx=2000, out=200)], start=0.1 * i) for i in range(4)]
    tr = trace(*progs)
    spans = {}
    for mb in (1, 32):
        res = replay(cluster(tflops=1.0), catalog(("m", 1.0)), tr, ["statebudget"],
                     SimConfig(max_batch=mb)).results["statebudget"]
        spans[mb] = sorted((c.start, c.end) for c in res.calls)
        assert len(spans[mb]) == 4 and all(e > s >= 0 for s, e in spans[mb])
    assert all(spans[1][i][1] <= spans[1][i + 1][0] + 1e-9 for i in range(3))  # one after another
    assert any(spans[32][i][1] > spans[32][i + 1][0] for i in range(3))         # shared


BIG_LOAD_S = 36.0 / 7.0 + 10.0 + 1.0  # the 36 GB model's load: NVMe read, cold start, set-up


def _big_behind_small(*small, starve=ADMIT_STARVE_S, big_start=1.0, **sim_kw) -> list:
    """A 36 GB call on a 40 GB GPU that cannot fit beside the 5 GB model the `small` programs keep
    pinned; the run's calls."""
    cl, cat = cluster(hbm_gb=40.0), catalog(("small", 5.0), ("big", 36.0))
    progs = [*small, program("big", [call("a", "big", ctx=100, out=10)], start=big_start)]
    return Simulator(cl, cat, trace(*progs), make_policy("ondemand"),
                     config=SimConfig(check_invariants=True, admit_starve_s=starve, **sim_kw)).run().calls


def _stream(n, gap, out=2000, first=0.0) -> list:
    return [program(f"s{i}", [call("a", "small", ctx=100, out=out)], start=first + gap * i) for i in range(n)]


def _wait(calls, prog="big") -> float:
    c = next(c for c in calls if c.program == prog)
    return c.ready - c.arrive


def test_a_call_starving_for_hbm_reserves_its_gpu():
    # A stream of short calls keeps the 5 GB model pinned. Without a reservation the big call
    # waits until the stream ends (400 s); with one, no new call is admitted on its GPU once it
    # has waited ADMIT_STARVE_S, so it waits that long plus the running calls' drain and its own
    # load, and the stream's calls wait at most about as long as that takes.
    waits = {}
    for starve in (None, ADMIT_STARVE_S):
        calls = _big_behind_small(*_stream(80, 5.0), starve=starve, big_start=20.0)
        assert all(c.state == "done" for c in calls)
        waits[starve] = (_wait(calls), max(c.ready - c.arrive for c in calls if c.program != "big"))
    assert waits[None][0] > 300.0
    assert waits[ADMIT_STARVE_S][0] <= ADMIT_STARVE_S + 10.0 + BIG_LOAD_S
    assert waits[ADMIT_STARVE_S][1] <= 10.0 + BIG_LOAD_S + 10.0


def test_short_calls_backfill_a_reservation_without_delaying_it():
    # The big call reserves the GPU after ADMIT_STARVE_S, but it must wait for a long call there
    # anyway: short calls on the resident model that end before that one still go in, and the
    # big call is admitted as soon as the long call ends.
    calls = _big_behind_small(program("long", [call("a", "small", ctx=100, out=40000)]),
                              *_stream(40, 5.0, out=200, first=2.0))
    big = next(c for c in calls if c.program == "big")
    long = next(c for c in calls if c.program == "long")
    after = [c for c in calls if c.program[0] == "s" and c.arrive > big.arrive + ADMIT_STARVE_S]
    backfilled = [c for c in after if c.ready < big.ready]
    assert len(backfilled) >= 10 and all(c.end <= long.end for c in backfilled)
    assert any(c.ready >= big.ready for c in after)  # calls that would outlast the drain wait
    assert big.ready <= long.end + BIG_LOAD_S  # admitted when the long call ends, then loaded


def test_the_reservation_holds_when_admitted_calls_queue_for_compute():
    # One call at a time per GPU (max_batch 1), so admitted calls queue for the batch slot. Their
    # estimated end moves with the clock; the backfill deadline must not, or short calls keep
    # passing the held call for as long as the stream lasts.
    waits = {starve: _wait(_big_behind_small(*_stream(200, 5.1), starve=starve, max_batch=1))
             for starve in (None, ADMIT_STARVE_S)}
    assert waits[None] > 1000.0
    assert waits[ADMIT_STARVE_S] < 150.0


def test_weighted_fair_share_gives_a_heavier_tenant_more_of_a_contended_gpu():
    # Two tenants' single-call programs arrive interleaved at one GPU with one prefill slot. Under
    # plas with equal weights they alternate; with tenant a weighted 3 it gets about 3 of every 4
    # starts until its share nears 3/4 (seed 003 §20). FCFS ignores weights.
    from statebudget.models import Program, Trace
    from statebudget.models.trace import TraceHeader

    progs = [program(f"{t}{i:02d}", [call("c", "m", ctx=250)], start=0.05 * (2 * i + (t == "b")), tenant=t)
             for i in range(30) for t in "ab"]
    share = {}
    for w in ({}, {"a": 3.0}):
        tr = Trace(header=TraceHeader(tenant_weights=w), programs=[Program.model_validate(p) for p in progs])
        for q in ("fcfs", "plas"):
            res = Simulator(cluster(tflops=1.0), catalog(("m", 1.0)), tr, make_policy("statebudget"),
                            config=SimConfig(queue=q, prefill_slots=1)).run()
            first = [c.program[0] for c in sorted(res.calls, key=lambda c: c.start)][:20]
            share[(q, bool(w))] = first.count("a") / len(first)
    assert share[("fcfs", True)] == share[("fcfs", False)] == 0.5
    assert 0.4 <= share[("plas", False)] <= 0.6
    assert share[("plas", True)] >= 0.7


@given(st.lists(st.tuples(st.floats(0, 500), st.floats(0, 200), st.floats(-1, 1)), min_size=2, max_size=6),
       st.sampled_from(["plas", "atlas"]))
def test_a_fixed_arrival_priority_orders_waiting_calls_as_the_queue_key_does(calls, q):
    # What the live planner answers at call_arrived (a number the engine never changes) must put
    # waiting calls in the order the simulator's queue_key gives them at any later instant, as long
    # as none starves (the promotion is the one thing a fixed number cannot follow).
    from statebudget.core.programs import arrival_priority, overtaking_window_s

    now = max(a for a, _, _ in calls) + 1.0
    waiting = [(a, s, x) for a, s, x in calls if now - a < overtaking_window_s(s) - 1.0]
    fixed = sorted(waiting, key=lambda c: (arrival_priority(q, c[0], 0.0, c[1], c[1], None, c[2]), c[0]))
    live = sorted(waiting, key=lambda c: queue_key(q, c[0], now, c[1], c[1], None, c[2]))
    assert [queue_key(q, c[0], now, c[1], c[1], None, c[2])[1] for c in fixed] == \
        pytest.approx([queue_key(q, c[0], now, c[1], c[1], None, c[2])[1] for c in live])


def test_the_live_priority_weighs_tenants_and_ttft_slack():
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.live import LivePlanner

    def arrive(p, prog, call_id, **kw):
        return p.event(prog[0], {"type": "call_arrived", "program": prog, "call": call_id, "model": "coder", **kw})

    def setup(weights):
        clock = Clock()
        p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock, queue="plas", tenant_weights=weights)
        for prog in ("a1", "b1", "a2", "b2"):
            p.event(prog[0], {"type": "program_started", "program": prog})
        for prog, ran in (("a1", 8.0), ("b1", 1.0)):  # tenant a has had 8 s of service, b 1 s
            arrive(p, prog, "c")
            p.event(prog[0], {"type": "call_started", "program": prog, "call": "c"})
            clock.t += ran
            p.event(prog[0], {"type": "call_finished", "program": prog, "call": "c", "tokens": 100})
        return p

    p = setup({})  # new programs, no service of their own (plas alone ties them)
    a, b = arrive(p, "a2", "c").priority, arrive(p, "b2", "c").priority
    assert b < a  # the tenant above its fair share waits
    p = setup({"a": 50.0})
    a, b = arrive(p, "a2", "c").priority, arrive(p, "b2", "c").priority
    assert a < b  # weighted 50, tenant a is below its share
    p = setup({})
    no_slack = arrive(p, "a2", "c", ttft_s=1.0, context_tokens=100).priority
    p.submit_lease("a", {"program": "a2", "model": "coder", "deadline_s": 60})
    for rec in list(p.ops.values()):  # the coder's weights are in HBM now: its prefill can be predicted
        p.report(rec.node, rec.op.op_id, {"status": "done", "bytes": rec.op.bytes, "seconds": 0.1,
                                          "version": rec.op.version, "epoch": rec.op.epoch})
    assert [c for c in p.copies_of("coder") if c.ready]
    p.event("a", {"type": "call_finished", "program": "a2", "call": "c", "tokens": 100})
    p.event("a", {"type": "program_started", "program": "a3"})
    urgent = arrive(p, "a3", "c", ttft_s=1.0, context_tokens=100).priority
    assert urgent < no_slack - 5000  # the same call, now with its slack known
    relaxed = arrive(p, "b2", "c", ttft_s=600.0, context_tokens=100).priority
    assert urgent < relaxed  # tight TTFT slack outweighs tenant a's excess (both bounded)


def test_the_live_queue_follows_the_starvation_promotion_that_a_fixed_priority_cannot(tmp_path):
    # GET /v1/queue's order is the simulator's queue key at the moment it is asked. A program with
    # 40 s of service and a new one wait on the coder: plas puts the new one first, and the fixed
    # priorities say so for good. Once both have waited past their starvation allowance (30 s + 2 x
    # service level), they go FCFS: the older call first, which only the live order shows.
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.ledger import Store
    from statebudget.service.live import Invalid, LivePlanner
    from statebudget.core.programs import STARVE_RATIO, STARVE_S, service_level

    clock = Clock()
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock, queue="plas")

    def send(prog, kind, call, **kw):
        return p.event("a", {"type": kind, "program": prog, "call": call, **kw})

    for prog in ("old", "new", "other"):
        p.event("a", {"type": "program_started", "program": prog})
    send("old", "call_arrived", "c1", model="coder")
    send("old", "call_started", "c1")
    clock.t = 40.0
    send("old", "call_finished", "c1", tokens=100)
    pri_old = send("old", "call_arrived", "c2", model="coder").priority
    clock.t = 41.0
    pri_new = send("new", "call_arrived", "c1", model="coder").priority
    send("other", "call_arrived", "c1", model="planner")
    assert pri_new < pri_old

    def order(**kw):
        return [(c.program, c.call, c.promoted) for c in p.waiting_calls(**kw).calls]

    clock.t = 42.0
    assert order(model="coder") == [("new", "c1", False), ("old", "c2", False)]
    assert [c.program for c in p.waiting_calls().calls] == ["new", "other", "old"]  # a tie (same
    # service, same arrival) goes by program id, as in the simulator
    starve_old = 40.0 + STARVE_S + STARVE_RATIO * service_level(40.0)
    clock.t = starve_old - 1.0  # the new call is promoted (its allowance is 30 s), the old not yet
    assert order(model="coder") == [("new", "c1", True), ("old", "c2", False)]
    clock.t = starve_old
    assert order(model="coder") == [("old", "c2", True), ("new", "c1", True)]  # FCFS among the promoted
    waited = {c.program: c.waited_s for c in p.waiting_calls(model="coder").calls}
    assert waited == {"old": pytest.approx(starve_old - 40.0), "new": pytest.approx(starve_old - 41.0)}
    again = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock, queue="plas")
    assert [c.program for c in again.waiting_calls().calls] == ["old", "new", "other"]  # all promoted
    assert again.waiting_calls() == p.waiting_calls()  # a restart rebuilds the queue from the ledger
    send("old", "call_started", "c2")  # a started call leaves the queue
    assert order(model="coder") == [("new", "c1", True)]
    p.event("a", {"type": "program_finished", "program": "other"})  # ... and so do an ended program's
    assert [c.program for c in p.waiting_calls().calls] == ["new"]
    with pytest.raises(Invalid, match="unknown model"):
        p.waiting_calls(model="nope")
    fcfs = LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock)
    assert fcfs.waiting_calls().body() == {"queue": "fcfs", "calls": []}


def test_the_slack_boost_lets_a_call_make_its_ttft_and_the_report_measures_the_waits():
    # Six batch calls (60 s TTFT) queue at one GPU with one prefill slot; a call whose class allows
    # 25 s arrives just after them. Under fcfs it waits for all six (59 s to its first token); under
    # plas its shrinking slack (seed 003 §19) takes it ahead of the five still waiting, and it makes
    # its bound. The boost is bounded (URGENCY_CAP_S), which the overtaking-window tests cover.
    from statebudget.models import Program, Trace
    from statebudget.models.trace import TraceHeader
    from statebudget.sim.metrics import policy_report

    slo = {"interactive": 2.0, "batch": 60.0, "soon": 25.0}
    batch = [dict(program(f"b{i}", [call("c", "m", ctx=2000)], start=0.01 * i), slo="batch") for i in range(6)]
    soon = dict(program("s", [call("c", "m", ctx=250)], start=0.2), slo="soon")
    tr = Trace(header=TraceHeader(slo_classes=slo), programs=[Program.model_validate(p) for p in batch + [soon]])
    got = {}
    for q in ("fcfs", "plas"):
        res = Simulator(cluster(tflops=1.0), catalog(("m", 1.0)), tr, make_policy("statebudget"),
                        config=SimConfig(queue=q, prefill_slots=1)).run()
        s = next(c for c in res.calls if c.program == "s")
        ahead = [c for c in res.calls if c.program != "s" and c.start < s.start]
        got[q] = (s.first_token - s.arrive, len(ahead))
        rep = policy_report(res, slo)
        b = [c.end - c.start for c in res.calls if c.program != "s"]
        longest = max(c.start - c.arrive for c in res.calls)
        assert rep.max_wait_s.max == pytest.approx(longest) and rep.max_wait_s.n == 7
        if q == "fcfs":  # the late call waited while all six ran
            assert longest == pytest.approx(s.start - s.arrive) and longest >= sum(b)
        assert res.sim_end == pytest.approx(max(c.end for c in res.calls))
        assert rep.programs_per_hour == pytest.approx(7 * 3600 / res.sim_end, rel=1e-6)
    assert got["fcfs"][0] > slo["soon"] and got["fcfs"][1] == 6
    assert got["plas"][0] <= slo["soon"] and got["plas"][1] == 1


def test_a_failed_attempt_is_retried_keeps_its_service_and_loses_its_kv():
    # Seed 003 §16, §26: a call attempt that fails while it runs is retried; its program keeps the
    # service the attempt attained (a failing program does not regain top PLAS priority), and the
    # KV it had on that GPU is gone: the retry rebuilds it from the committed tokens.
    p = program("p", [call("a", "m", ctx=4000, out=50), tool("t", ["a"], 1.0), call("b", "m", ["t"], ctx=4100, out=50)])

    def run(rate, seed=3, keep=True):
        cfg = SimConfig(seed=seed, call_failure_rate=rate, check_invariants=True, retry_keeps_service=keep)
        sim = Simulator(cluster(tflops=1.0), catalog(("m", 1.0)), trace(p), make_policy("statebudget"), config=cfg)
        return sim.run()

    clean, failed = run(0.0), run(0.5)
    attempts = {c.node: c.attempt for c in failed.calls}
    assert failed.failed_attempts == sum(attempts.values()) >= 2 and attempts["b"] >= 1  # seed 3 fails both once
    assert all(c.state == "done" for c in failed.calls)
    assert failed.programs["p"].service == pytest.approx(clean.programs["p"].service + failed.failed_service_s)
    assert failed.failed_service_s > 0 and failed.programs["p"].end > clean.programs["p"].end
    # atlas's critical path carries a's failed attempt on to b, as the live planner's path_s does
    assert failed.programs["p"].path_in["b"] > clean.programs["p"].path_in["b"]
    # b's KV (a's 4,050 tokens) was in HBM when b failed: rebuilt once per failure of b
    assert clean.recomputed_tokens == 0 and failed.recomputed_tokens == 4050 * attempts["b"]
    again = run(0.5)  # same seed, same failures
    assert (again.failed_attempts, again.failed_service_s) == (failed.failed_attempts, failed.failed_service_s)
    reset = run(0.5, keep=False)  # the ablation: the last retry starts from no service, as a new program id would
    assert reset.programs["p"].service < clean.programs["p"].service
    with pytest.raises(ValueError, match="call_failure_rate"):
        run(1.0)


def test_auto_orders_by_atlas_only_while_finished_programs_are_heavy_tailed():
    from statebudget.core.programs import AUTO_HEAVY_CV, AUTO_LIGHT_CV, AUTO_MIN, AUTO_WINDOW, ProgramSizes

    rng = np.random.default_rng(3)
    light = ProgramSizes()
    for i, s in enumerate(rng.uniform(40.0, 120.0, 300)):  # CV about 0.3, as the presets' programs
        light.observe(s, float(i))
        assert light.discipline("auto") == "fcfs"
    assert light.cv < 0.5 and light.changes == []
    heavy = ProgramSizes()
    for s in 10.0 * (rng.pareto(1.2, AUTO_MIN - 1) + 1.0):
        heavy.observe(s, 1.0)
    assert heavy.cv is None and heavy.discipline("auto") == "fcfs"  # too few programs to judge
    heavy.observe(5000.0, 2.0)
    assert heavy.discipline("auto") == "atlas"
    assert heavy.changes == [{"at_s": 2.0, "programs": AUTO_MIN, "to": "atlas"}]
    for q in ("fcfs", "plas", "atlas"):
        assert heavy.discipline(q) == q and light.discipline(q) == q  # only auto adapts
    # Hysteresis: a lighter stretch keeps atlas while the CV stays above AUTO_LIGHT_CV; a window of
    # like-sized programs takes it back to fcfs.
    while heavy.cv >= AUTO_LIGHT_CV:
        assert heavy.discipline("auto") == "atlas"
        heavy.observe(60.0, 3.0)
    assert heavy.discipline("auto") == "fcfs"
    assert heavy.changes[-1] == {"at_s": 3.0, "programs": heavy.seen, "to": "fcfs"}
    # Inside the band (CV 0.86, between AUTO_LIGHT_CV and AUTO_HEAVY_CV) each keeps what it had.
    band = [5.0 * (1.0 + 0.86 * (-1) ** i) for i in range(AUTO_WINDOW)]
    light_start, heavy_start = ProgramSizes(), ProgramSizes()
    for s in [2000.0] + [5.0] * (AUTO_MIN - 1):
        heavy_start.observe(s, 0.0)
    assert heavy_start.heavy
    for s in band:
        light_start.observe(s, 1.0)
        heavy_start.observe(s, 1.0)
        assert not light_start.heavy and heavy_start.heavy
    assert AUTO_LIGHT_CV < light_start.cv < AUTO_HEAVY_CV and heavy_start.cv == pytest.approx(light_start.cv)
    light_start.observe(float("nan"), 2.0)  # a value that is no number is left out
    assert light_start.seen == AUTO_WINDOW and light_start.cv == pytest.approx(0.86)
    with pytest.raises(ValueError, match="never reaches"):
        ProgramSizes(window=AUTO_MIN - 1)


def test_auto_in_the_simulator_is_fcfs_on_light_tails_and_switches_on_heavy_ones():
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.core.programs import AUTO_MIN

    def run(preset, load, q, **kw):
        sim = Simulator(load_cluster("hetero16"), load_catalog("agent-team"), generate(preset, 2, 0.3, load=load),
                        make_policy("statebudget"), config=SimConfig(queue=q, **kw))
        return sim, [(c.program, c.node, c.start) for c in sim.run().calls]

    light = {q: run("mixed-tenants", 8, q, prefill_slots=1) for q in ("fcfs", "plas", "auto")}
    assert light["plas"][1] != light["fcfs"][1]  # calls queue: a discipline changes the run
    assert light["auto"][1] == light["fcfs"][1] and light["auto"][0].sizes.changes == []
    heavy = {q: run("long-tail", 20, q, prefill_slots=None, max_batch=4) for q in ("fcfs", "auto")}
    sizes = heavy["auto"][0].sizes
    assert sizes.changes and sizes.changes[0]["programs"] >= AUTO_MIN and sizes.changes[0]["to"] == "atlas"
    assert heavy["auto"][1] != heavy["fcfs"][1]
    assert heavy["fcfs"][0].sizes.changes == []  # only auto judges (and reports `queue_switches`)


def test_the_live_queue_under_auto_follows_the_finished_programs_and_survives_a_restart(tmp_path):
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.ledger import Store
    from statebudget.service.live import LivePlanner
    from statebudget.core.programs import AUTO_MIN

    from statebudget.api.metrics import ServiceMetrics

    def planner(db, clock):
        return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db), clock=clock, queue="auto",
                           telemetry=ServiceMetrics())

    def finish(p, clock, prog, run_s, running=False):
        """A program of one call that runs `run_s`; `running`: it ends with the call still running,
        whose time counts as service all the same."""
        p.event("a", {"type": "program_started", "program": prog})
        p.event("a", {"type": "call_arrived", "program": prog, "call": "c1", "model": "planner"})
        p.event("a", {"type": "call_started", "program": prog, "call": "c1"})
        clock.t += run_s
        if not running:
            p.event("a", {"type": "call_finished", "program": prog, "call": "c1", "tokens": 10})
        p.event("a", {"type": "program_finished", "program": prog})

    def waiting(p):
        """An old program with 100 s of service and a newer one with none wait on the coder."""
        p.event("a", {"type": "program_started", "program": "old"})
        p.event("a", {"type": "call_arrived", "program": "old", "call": "c1", "model": "coder"})
        p.event("a", {"type": "call_started", "program": "old", "call": "c1"})
        clock.t += 100.0
        p.event("a", {"type": "call_finished", "program": "old", "call": "c1", "tokens": 10})
        old = p.event("a", {"type": "call_arrived", "program": "old", "call": "c2", "model": "coder",
                            "after": ["c1"]}).priority
        clock.t += 1.0
        p.event("a", {"type": "program_started", "program": "new"})
        new = p.event("a", {"type": "call_arrived", "program": "new", "call": "c1", "model": "coder"}).priority
        return old, new

    for kind, sizes in (("light", [50.0, 70.0] * AUTO_MIN), ("heavy", [5.0] * (AUTO_MIN - 1) + [2000.0])):
        clock = Clock()
        p = planner(tmp_path / f"{kind}.db", clock)
        for i, s in enumerate(sizes):
            finish(p, clock, f"{kind}{i}", s, running=s == 2000.0 or i % 10 == 3)
        old, new = waiting(p)
        q = p.waiting_calls(model="coder")
        order = [c.program for c in q.calls]
        if kind == "light":
            assert q.ordering_by == "fcfs" and order == ["old", "new"] and old < new  # arrival order
        else:
            assert q.ordering_by == "atlas" and order == ["new", "old"] and new < old
        assert q.program_service_cv == pytest.approx(float(np.std(sizes) / np.mean(sizes)))
        again = planner(tmp_path / f"{kind}.db", clock)  # the ledger holds what auto judged on
        assert again.waiting_calls(model="coder") == q and again.sizes.changes == p.sizes.changes
        for pl in (p, again):  # and Prometheus says so
            sample = pl.telemetry.registry.get_sample_value
            assert sample("statebudget_queue_ordering", {"discipline": q.ordering_by}) == 1.0
            assert sample("statebudget_queue_ordering", {"discipline": "fcfs" if kind == "heavy" else "atlas"}) == 0.0
            assert sample("statebudget_program_service_cv") == pytest.approx(q.program_service_cv)


def test_auto_priorities_keep_arrival_order_when_it_goes_back_to_fcfs():
    # A call that waits from atlas time, with a priority of atlas's scale, must not be passed by
    # the calls that arrive once auto orders by fcfs again (vLLM takes the lower number first).
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.live import LivePlanner
    from statebudget.core.programs import AUTO_MIN, ProgramSizes

    clock = Clock(1000.0)
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock, queue="auto")
    clock.t = 5000.0
    p.sizes = ProgramSizes(window=AUTO_MIN)  # a short window, so that it can forget the outlier soon

    def finish(prog, run_s):
        for kind in ("program_started", "call_arrived", "call_started"):
            p.event("a", {"type": kind, "program": prog, "call": "c1", "model": "planner"})
        clock.t += run_s
        p.event("a", {"type": "call_finished", "program": prog, "call": "c1", "tokens": 10})
        p.event("a", {"type": "program_finished", "program": prog})

    for i, s in enumerate([2000.0] + [5.0] * (AUTO_MIN - 1)):
        finish(f"a{i}", s)
    assert p.sizes.discipline("auto") == "atlas"
    p.event("a", {"type": "program_started", "program": "old"})
    old = p.event("a", {"type": "call_arrived", "program": "old", "call": "c1", "model": "coder"}).priority
    for i in range(AUTO_MIN):
        finish(f"b{i}", 5.0)
    assert p.sizes.discipline("auto") == "fcfs"
    p.event("a", {"type": "program_started", "program": "new"})
    new = p.event("a", {"type": "call_arrived", "program": "new", "call": "c1", "model": "coder"}).priority
    assert old < new
    assert [c.program for c in p.waiting_calls(model="coder").calls] == ["old", "new"]



def test_auto_back_on_fcfs_restores_the_order_the_calls_joined_in():
    # Atlas reorders the simulator's waiting lists in place; once auto is back on fcfs, the calls
    # still waiting go by when they joined again, as the live queue does (by arrival).
    from types import SimpleNamespace

    from statebudget.models.load import load_catalog, load_cluster

    sims = {q: Simulator(load_cluster("toy2"), load_catalog("toy"), trace(program("p", [call("a", "coder")])),
                         make_policy("statebudget"), config=SimConfig(queue=q)) for q in ("fcfs", "auto")}
    left_by_atlas = [SimpleNamespace(seq=s) for s in (3, 1, 4, 2)]
    assert sims["fcfs"]._order(list(left_by_atlas)) == left_by_atlas  # plain fcfs lists stay as they are kept
    assert sims["auto"].sizes.discipline("auto") == "fcfs"
    assert [c.seq for c in sims["auto"]._order(list(left_by_atlas))] == [1, 2, 3, 4]
