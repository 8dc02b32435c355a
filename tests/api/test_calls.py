"""The routes a gateway uses: POST /v1/events/batch and POST /v1/programs/{p}/calls/{c}/start."""

import pytest

from statebudget.api.auth import TokenEntry

from tests.helpers import report_op, toy_service

TOK = {"a": "runtime-a-0123456789", "b": "runtime-b-0123456789", "n0": "adapter-n0-0123456789"}


def H(who):
    return {"Authorization": f"Bearer {TOK[who]}"}


@pytest.fixture
def app(tmp_path):
    with toy_service(tmp_path, [TokenEntry(token=TOK["a"], role="runtime", tenant="team-a"),
                                TokenEntry(token=TOK["b"], role="runtime", tenant="team-b"),
                                TokenEntry(token=TOK["n0"], role="adapter", node="n0")]) as both:
        yield both


def arrive(p, call="c1", model="coder"):
    return [{"type": "program_started", "program": p},
            {"type": "call_arrived", "program": p, "call": call, "model": model, "context_tokens": 10}]


def test_a_batch_applies_in_order_and_a_refused_event_stops_nothing(app):
    c, planner = app
    evs = arrive("p1") + [{"type": "call_finished", "program": "p1", "call": "nope"},
                          {"type": "call_cancelled", "program": "p1", "call": "c1"},
                          {"type": "program_finished", "program": "p1"}]
    r = c.post("/v1/events/batch", json={"events": evs}, headers=H("a"))
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["status"] for x in res] == [200, 200, 404, 200, 200]
    assert "never arrived" in res[2]["body"]["detail"]
    assert planner.programs["p1"].status == "finished" and planner.programs["p1"].calls["c1"]["status"] == "cancelled"
    # a malformed event refuses the whole batch before any of it applies
    r = c.post("/v1/events/batch", json={"events": arrive("p2") + [{"type": "call_arrived", "program": "p2"}]},
               headers=H("a"))
    assert r.status_code == 422 and "p2" not in planner.programs
    assert c.post("/v1/events/batch", json={"events": []}, headers=H("a")).status_code == 422
    assert c.post("/v1/events/batch", json={"events": arrive("p3")}, headers=H("n0")).status_code == 403


def test_start_applies_its_arrival_waits_for_the_state_and_starts_once_ready(app):
    c, planner = app
    r = c.post("/v1/programs/p1/calls/c1/start", json={"before": arrive("p1")}, headers=H("a"))
    assert r.status_code == 200 and r.json() == {"call": "c1", "status": "arrived", "ready": False, "group": None,
                                                 "node": None}
    assert planner.programs["p1"].calls["c1"]["status"] == "arrived"  # not started while nothing is ready
    lease = c.post("/v1/leases", json={"program": "p1", "model": "coder", "deadline_s": 30}, headers=H("a")).json()
    assert lease["decision"] == "accepted"
    for op in list(planner.ops.values()):
        report_op(planner, op.op)
    r = c.post("/v1/programs/p1/calls/c1/start", params={"wait": 1}, headers=H("a"))
    out = r.json()
    assert out["ready"] and out["status"] == "started" and out["group"].startswith("gpu:") and out["node"] in ("n0", "n1")
    assert planner.programs["p1"].calls["c1"]["status"] == "started"
    # another tenant's program is one that does not exist; a used program id is refused
    assert c.post("/v1/programs/p1/calls/c1/start", headers=H("b")).status_code == 404
    c.post("/v1/events", json={"type": "program_finished", "program": "p1"}, headers=H("a"))
    r = c.post("/v1/programs/p1/calls/c2/start", json={"before": arrive("p1", "c2")}, headers=H("a"))
    assert r.status_code == 409


def test_a_call_ready_at_arrival_is_applied_and_started_in_one_commit(app):
    c, planner = app
    c.post("/v1/events/batch", json={"events": arrive("p0")}, headers=H("a"))
    assert c.post("/v1/leases", json={"program": "p0", "model": "coder", "deadline_s": 30},
                  headers=H("a")).json()["decision"] == "accepted"
    for op in list(planner.ops.values()):
        report_op(planner, op.op)
    statements = []
    planner.store.db.set_trace_callback(statements.append)
    try:
        r = c.post("/v1/programs/p1/calls/c1/start", json={"before": arrive("p1")}, headers=H("a"))
    finally:
        planner.store.db.set_trace_callback(None)
    assert r.status_code == 200 and r.json()["status"] == "started"
    assert planner.programs["p1"].calls["c1"]["status"] == "started"
    # the arrival and the start share the request's one transaction: one sync of the ledger
    assert [s for s in statements if s.startswith(("BEGIN", "COMMIT"))] == ["BEGIN IMMEDIATE", "COMMIT"]


def test_a_refusal_after_the_arrival_leaves_the_arrival_in_memory_and_on_disk(app):
    c, planner = app
    # `before` brings call c2; the path names c1, which never arrived: 404, and c2 has arrived
    r = c.post("/v1/programs/p1/calls/c1/start", json={"before": arrive("p1", "c2")}, headers=H("a"))
    assert r.status_code == 404
    assert planner.programs["p1"].calls["c2"]["status"] == "arrived"
    on_disk = {p["program"]: p for p in planner.store.programs()}
    assert on_disk["p1"]["calls"]["c2"]["status"] == "arrived"


def test_a_poll_for_a_call_not_ready_is_answered_while_the_ledger_refuses_writes(app):
    c, planner = app
    c.post("/v1/events/batch", json={"events": arrive("p1")}, headers=H("a"))
    pages = planner.store.db.execute("PRAGMA page_count").fetchone()[0]
    planner.store.db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    planner.ledger_error = "disk full"
    for wait in (0, 0.2):
        r = c.post("/v1/programs/p1/calls/c1/start", params={"wait": wait}, headers=H("a"))
        assert r.status_code == 200 and r.json()["ready"] is False
    # a write still is refused, with nothing of it kept
    r = c.post("/v1/programs/p2/calls/c1/start", json={"before": arrive("p2")}, headers=H("a"))
    assert r.status_code == 503 and "p2" not in planner.programs
