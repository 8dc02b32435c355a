"""Past capacity in the live planner (`planner/overload.py`): its admission queue is the calls that
arrived and have not started, on the group each would start on, with the run the cost model
expects of the output estimate; leases onto a group past capacity are rejected with when to
retry, and a queue that is short or young lets the same lease through."""

import pytest

from tests.helpers import Clock, make_live_planner, report_op
from statebudget.core.decisions import Promote, apply
from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import PlannerConfig, lease_config
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner

T0 = 1000.0
CTX, MAX = 8000, 16000  # with the prior estimate (a quarter of MAX) a planner call runs about 15 s on toy2


def weights_ready(p, model="planner", group=(0,)):
    with p.store.tx():
        apply([Promote(("w", model), group)], p)
    report_op(p, next(r.op for r in p.ops.values() if r.op.object == ["w", model]))


def arrive(p, prog, model="planner", call="c", ctx=CTX, max_tokens=MAX):
    p.event("a", {"type": "program_started", "program": prog})
    p.event("a", {"type": "call_arrived", "program": prog, "call": call, "model": model, "context_tokens": ctx,
                  "max_tokens": max_tokens})


def queued(p, n, model="planner", waited_s=100.0):
    """`n` calls of `model` that arrived `waited_s` ago and have not started; the clock is now."""
    for i in range(n):
        arrive(p, f"q{i}", model)
    p.clock.t += waited_s


def lease(p, prog="new", model="planner"):
    p.event("a", {"type": "program_started", "program": prog})
    return p.submit_lease("a", {"program": prog, "model": model, "deadline_s": 60})


def test_the_admission_queue_is_the_arrived_calls_with_the_run_of_the_output_estimate():
    p = make_live_planner(clock=Clock(T0))
    weights_ready(p)
    planner = p.catalog.by_name["planner"]
    # what planner calls write is learnt from one that finished (never from a waiting call)
    arrive(p, "done", call="c0")
    p.event("a", {"type": "call_started", "program": "done", "call": "c0"})
    assert p.admission_queue() == [] and p.running_on == [1, 0]
    assert p.output_estimate.typical_asked("planner") is None
    p.event("a", {"type": "call_finished", "program": "done", "call": "c0", "output_tokens": 3000})
    assert p.running_on == [0, 0]
    assert p.output_estimate.typical_asked("planner") == CTX + MAX, "the room it asked for: what a replica must hold"
    arrive(p, "w1")
    arrive(p, "w2", ctx=2000)
    arrive(p, "r1")
    p.event("a", {"type": "call_started", "program": "r1", "call": "c"})  # started: running, not queued
    p.clock.t = T0 + 30.0
    arrive(p, "k1", model="coder")  # no coder weights anywhere: counted where a lease would prepare them
    p.clock.t = T0 + 100.0
    run = p.cost.call_s(planner, CTX, 3000, (0,))
    assert run > 0 and run != pytest.approx(p.cost.call_s(planner, CTX, MAX, (0,)))
    coder = p.catalog.by_name["coder"]
    assert sorted(p.admission_queue()) == [
        ("coder", (1,), pytest.approx(p.cost.call_s(coder, CTX, MAX / 4, (1,))), pytest.approx(70.0)),
        ("planner", (0,), pytest.approx(p.cost.call_s(planner, 2000, 3000, (0,))), pytest.approx(100.0)),
        ("planner", (0,), pytest.approx(run), pytest.approx(100.0)),
    ]
    assert p.running_on == [1, 0]
    load = p.core.pressure(p)
    assert load.running == (1, 0) and load.waiting == (2, 1)
    # a cancelled call leaves the queue; a finished one leaves the running count
    p.event("a", {"type": "call_cancelled", "program": "w2", "call": "c"})
    p.event("a", {"type": "call_finished", "program": "r1", "call": "c", "output_tokens": 10})
    assert sorted(q[:2] for q in p.admission_queue()) == [("coder", (1,)), ("planner", (0,))]
    assert p.running_on == [0, 0]


def test_past_capacity_a_lease_onto_the_group_is_rejected_with_when_to_retry_and_that_survives_a_restart(tmp_path):
    clock = Clock(T0)
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    weights_ready(p)
    queued(p, 8)  # about 118 s of work on GPU 0, each call waited 100 s, none running
    work = sum(run for _, _, run, _ in p.admission_queue())
    assert work >= 90.0
    out = lease(p)
    assert out.decision == "rejected" and out.reason.startswith("overloaded: 8 calls wait for HBM on gpu:0")
    assert out.retry_after_s == pytest.approx(work, abs=1e-3) and out.retry_after_s > 0
    assert not p.ops  # nothing is moved for it
    # GPU 1 has no queue: a lease of a model that goes there is admitted as below capacity
    other = lease(p, "other", "coder")
    assert other.decision == "accepted" and other.retry_after_s is None
    p.store.close()
    q = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    assert q.lease_view(q.ledger.leases[out.lease_id]).retry_after_s == pytest.approx(work, abs=1e-3)
    assert len(q.admission_queue()) == 8  # the waiting calls come back from the ledger with their arrival


def test_the_room_calls_ask_for_is_learnt_again_after_a_rebuild_and_a_restart(tmp_path):
    clock = Clock(T0)
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    for i, (ctx, mx) in enumerate(((1000, 3000), (5000, 1000))):
        arrive(p, f"f{i}", call="c", ctx=ctx, max_tokens=mx)
        clock.t += 1.0
        p.event("a", {"type": "call_finished", "program": f"f{i}", "call": "c"})  # no output_tokens given
    p.event("a", {"type": "program_finished", "program": "f0"})  # an ended program's call counts too
    arrive(p, "w", call="c", ctx=90_000, max_tokens=10_000)  # waiting: its ask is not learnt
    assert p.output_estimate.typical_asked("planner") == 5000.0 and p.output_estimate.count == {}
    p._rebuild(None)  # after a rolled-back write: memory from the ledger, into the same estimate
    assert p.output_estimate.asked == {"planner": 5000.0} and p.output_estimate.asked_n == {"planner": 2}
    p.store.close()
    q = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock)
    assert q.output_estimate.asked == {"planner": 5000.0} and q.output_estimate.asked_n == {"planner": 2}


def test_a_call_running_on_the_group_divides_the_wait():
    p = make_live_planner(clock=Clock(T0))
    weights_ready(p)
    arrive(p, "r1")
    p.event("a", {"type": "call_started", "program": "r1", "call": "c"})
    queued(p, 13)
    work = sum(run for _, _, run, _ in p.admission_queue())
    assert 90.0 * 2 <= work  # two running calls would still leave the group past capacity
    arrive(p, "r2")
    p.event("a", {"type": "call_started", "program": "r2", "call": "c"})
    out = lease(p)
    assert out.decision == "rejected" and out.retry_after_s == pytest.approx(work / 2, abs=1e-3)


@pytest.mark.parametrize("calls, waited_s", [(8, 60.0), (2, 100.0)], ids=["young", "short"])
def test_a_young_or_short_queue_lets_the_same_lease_through(calls, waited_s):
    p = make_live_planner(clock=Clock(T0))
    weights_ready(p)
    queued(p, calls, waited_s=waited_s)
    assert len(p.admission_queue()) == calls
    out = lease(p)
    assert out.decision == "accepted" and out.retry_after_s is None and not out.reason


def test_with_overload_off_a_queue_past_capacity_rejects_no_lease():
    p = make_live_planner(clock=Clock(T0), config=lease_config(overload_wait_s=None))
    weights_ready(p)
    queued(p, 8)
    assert p.core.pressure(p) is None
    assert lease(p).decision == "accepted"
    assert PlannerConfig().overload_wait_s == 90.0  # the default the tests above count against


def test_a_retried_call_waits_once_from_its_new_arrival_and_an_ended_program_waits_no_more():
    p = make_live_planner(clock=Clock(T0))
    weights_ready(p)
    arrive(p, "r1")
    p.event("a", {"type": "call_started", "program": "r1", "call": "c"})
    arrive(p, "x1")
    p.clock.t = T0 + 50.0
    p.event("a", {"type": "call_arrived", "program": "r1", "call": "c", "model": "planner", "attempt": 1,
                  "context_tokens": CTX, "max_tokens": MAX})  # the engine failed it: the runtime sends it again
    p.clock.t = T0 + 80.0
    assert sorted(q[3] for q in p.admission_queue()) == [pytest.approx(30.0), pytest.approx(80.0)]
    assert p.running_on == [0, 0]
    p.event("a", {"type": "program_cancelled", "program": "x1"})
    p.event("a", {"type": "call_started", "program": "r1", "call": "c", "attempt": 1})
    assert p.admission_queue() == [] and p.running_on == [1, 0]


def test_calls_leave_the_index_as_they_move_on_even_with_nothing_reading_it():
    # overload off: nothing reads the queue, so only the events themselves can empty the index
    p = make_live_planner(clock=Clock(T0), config=lease_config(overload_wait_s=None))
    weights_ready(p)
    for i in range(4):
        arrive(p, f"s{i}")
        p.event("a", {"type": "call_started", "program": f"s{i}", "call": "c"})
    p.event("a", {"type": "call_finished", "program": "s0", "call": "c", "output_tokens": 10})
    arrive(p, "x", call="c1")
    p.event("a", {"type": "call_cancelled", "program": "x", "call": "c1"})
    arrive(p, "f", call="c2")
    p.event("a", {"type": "call_finished", "program": "f", "call": "c2", "output_tokens": 10})  # never started
    arrive(p, "e", call="c3")
    p.event("a", {"type": "program_cancelled", "program": "e"})
    assert p.arrivals == {}
