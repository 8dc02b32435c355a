"""The planner service through its HTTP API (in process): auth, the lease and op protocol, the
commit boundary, epochs, metrics and oracle runs."""

import json

import pytest
from fastapi.testclient import TestClient

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner

from tests.helpers import toy_trace_jsonl

TOK = {"admin": "admin-token-0123456789", "a": "runtime-a-0123456789", "b": "runtime-b-0123456789",
       "n0": "adapter-n0-0123456789", "n1": "adapter-n1-0123456789"}


def H(who):
    return {"Authorization": f"Bearer {TOK[who]}"}


@pytest.fixture
def client(tmp_path):
    auth = Auth([TokenEntry(token=TOK["admin"], role="admin"),
                 TokenEntry(token=TOK["a"], role="runtime", tenant="team-a"),
                 TokenEntry(token=TOK["b"], role="runtime", tenant="team-b"),
                 TokenEntry(token=TOK["n0"], role="adapter", node="n0"),
                 TokenEntry(token=TOK["n1"], role="adapter", node="n1")])
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))
    with TestClient(create_app(planner, auth, planning_loop=False)) as c:
        yield c


def ev(c, who, **body):
    return c.post("/v1/events", json=body, headers=H(who))


def start_program(c, who="a", program="p1"):
    assert ev(c, who, type="program_started", program=program).status_code == 200


def lease(c, who="a", **body):
    body = {"program": "p1", "model": "planner", "deadline_s": 30, "confidence": 0.9, **body}
    return c.post("/v1/leases", json=body, headers=H(who))


def ops_of(c, node):
    r = c.get("/v1/plan", params={"node": node, "after": 0}, headers=H(node))
    assert r.status_code == 200
    return r.json()["ops"]


def done(op, **kw):
    return {"status": "done", "bytes": op["bytes"], "seconds": 0.01, "checksum": "c",
            "version": op["version"], "epoch": op["epoch"], **kw}


def test_healthz_needs_no_token_and_everything_else_does(client):
    assert client.get("/healthz").json()["status"] == "ok"
    r = client.get("/v1/residency")
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = client.get("/v1/residency", headers={"Authorization": "Bearer not-a-known-token-at-all"})
    assert r.status_code == 401 and r.json()["detail"] == "unknown bearer token"


def test_wrong_role_gets_403_naming_the_role(client):
    r = client.put("/v1/cluster", json={"cluster": {}, "catalog": {}}, headers=H("a"))
    assert r.status_code == 403 and "role 'runtime'" in r.json()["detail"] and "admin" in r.json()["detail"]
    r = client.post("/v1/events", json={"type": "program_started", "program": "x"}, headers=H("n0"))
    assert r.status_code == 403
    r = client.get("/v1/plan", params={"node": "n1"}, headers=H("n0"))
    assert r.status_code == 403 and "n0" in r.json()["detail"]


def test_another_tenants_program_and_lease_are_not_found_and_its_ids_stay_free(client):
    start_program(client, "a")
    r = ev(client, "b", type="call_arrived", program="p1", call="c1", model="planner")
    assert r.status_code == 404 and "never started" in r.json()["detail"]  # as for an id nobody uses
    lid = lease(client, "a").json()["lease_id"]
    assert lid.startswith("lease-") and len(lid) == len("lease-") + 16  # random: not guessable from another
    for method in ("delete", "get"):
        r = getattr(client, method)(f"/v1/leases/{lid}", headers=H("b"))
        assert r.status_code == 404 and r.json()["detail"] == f"no lease {lid!r}"
    assert client.get(f"/v1/leases/{lid}", headers=H("a")).json()["state"] != "cancelled"
    # b may use the id a took: its own program, which a's events never reach
    assert ev(client, "b", type="program_started", program="p1").json()["program"] == "p1"
    assert ev(client, "b", type="program_cancelled", program="p1").status_code == 200
    assert ev(client, "a", type="call_arrived", program="p1", call="c1", model="planner").status_code == 200


def test_the_queue_route_lists_waiting_calls_and_scopes_a_runtime_to_its_tenant(client):
    start_program(client, "a", "pa")
    start_program(client, "b", "pb")
    for who, prog in (("a", "pa"), ("b", "pb")):
        assert ev(client, who, type="call_arrived", program=prog, call="c1", model="coder").status_code == 200
    everyone = client.get("/v1/queue", headers=H("n0")).json()
    assert everyone["queue"] == "fcfs" and [c["program"] for c in everyone["calls"]] == ["pa", "pb"]
    admin = client.get("/v1/queue", headers=H("admin")).json()["calls"]
    assert [(c["program"], c["rank"]) for c in admin] == [("pa", 0), ("pb", 1)]
    assert admin[0]["waited_s"] >= admin[1]["waited_s"] >= 0  # fcfs: the longest wait first
    mine = client.get("/v1/queue", headers=H("b")).json()["calls"]
    assert [(c["program"], c["rank"]) for c in mine] == [("pb", 1)]  # its rank among every tenant's calls
    assert client.get("/v1/queue", params={"model": "planner"}, headers=H("n0")).json()["calls"] == []
    r = client.get("/v1/queue", params={"model": "nope"}, headers=H("a"))
    assert r.status_code == 422 and "unknown model 'nope'" in r.json()["detail"]
    assert client.get("/v1/queue").status_code == 401
    assert ev(client, "a", type="call_started", program="pa", call="c1").status_code == 200
    assert [c["program"] for c in client.get("/v1/queue", headers=H("n0")).json()["calls"]] == ["pb"]


def test_lease_becomes_ready_only_when_its_op_is_reported_done(client):
    start_program(client)
    body = lease(client).json()
    assert body["decision"] == "accepted" and body["quote"]["p95_s"] > 0 and not body["ready"]
    ops = ops_of(client, "n0") + ops_of(client, "n1")
    mine = [o for o in ops if o["lease_id"] == body["lease_id"]]
    assert len(mine) == 1 and mine[0]["kind"] == "promote" and mine[0]["object"] == ["w", "planner"]
    op = mine[0]
    node = "n0" if op["dst"] == "gpu:0" else "n1"
    res = client.get("/v1/residency", headers=H("admin")).json()
    assert any(c["object"] == ["w", "planner"] and not c["ready"] for c in res["copies"])
    assert not client.get(f"/v1/leases/{body['lease_id']}", headers=H("a")).json()["ready"]
    r = client.post(f"/v1/ops/{op['op_id']}", json=done(op), headers=H(node))
    assert r.status_code == 200 and r.json()["status"] == "done"
    assert client.get(f"/v1/leases/{body['lease_id']}", headers=H("a")).json()["ready"]
    res = client.get("/v1/residency", headers=H("admin")).json()
    assert any(c["object"] == ["w", "planner"] and c["ready"] and c["tier"] == op["dst"] for c in res["copies"])
    again = client.post(f"/v1/ops/{op['op_id']}", json=done(op), headers=H(node))
    assert again.status_code == 200 and again.json()["duplicate"]
    other = "n1" if node == "n0" else "n0"
    assert client.post(f"/v1/ops/{op['op_id']}", json=done(op), headers=H(other)).status_code == 403


def test_report_with_wrong_version_is_refused_and_nothing_is_published(client):
    start_program(client)
    lid = lease(client).json()["lease_id"]
    op = next(o for o in ops_of(client, "n0") + ops_of(client, "n1") if o["lease_id"] == lid)
    node = "n0" if op["dst"] == "gpu:0" else "n1"
    r = client.post(f"/v1/ops/{op['op_id']}", json=done(op, version=op["version"] + 1), headers=H(node))
    assert r.status_code == 409 and "version" in r.json()["detail"]
    res = client.get("/v1/residency", headers=H("admin")).json()
    assert not any(c["object"] == ["w", "planner"] and c["tier"] == op["dst"] for c in res["copies"])
    assert not client.get(f"/v1/leases/{lid}", headers=H("a")).json()["ready"]


def test_cancel_during_transfer_refuses_the_commit(client):
    start_program(client)
    lid = lease(client).json()["lease_id"]
    op = next(o for o in ops_of(client, "n0") + ops_of(client, "n1") if o["lease_id"] == lid)
    node = "n0" if op["dst"] == "gpu:0" else "n1"
    r = client.delete(f"/v1/leases/{lid}", headers=H("a"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client.delete(f"/v1/leases/{lid}", headers=H("a")).json()["state"] == "cancelled"  # double cancel
    assert op["op_id"] not in {o["op_id"] for o in ops_of(client, node)}
    r = client.post(f"/v1/ops/{op['op_id']}", json=done(op), headers=H(node))
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    res = client.get("/v1/residency", headers=H("admin")).json()
    assert not any(c["object"] == ["w", "planner"] and c["ready"] for c in res["copies"])
    assert client.delete("/v1/leases/L999", headers=H("a")).status_code == 404


def test_program_cancel_bumps_the_epoch_and_refuses_late_events(client):
    start_program(client)
    assert ev(client, "a", type="call_arrived", program="p1", call="c1", model="coder").status_code == 200
    assert ev(client, "a", type="call_started", program="p1", call="c1").status_code == 200
    assert ev(client, "a", type="call_finished", program="p1", call="c1", tokens=2000).json()["kv_version"] == 2000
    r = ev(client, "a", type="program_cancelled", program="p1")
    assert r.status_code == 200 and r.json()["epoch"] == 1
    r = ev(client, "a", type="tool_finished", program="p1", tool="shell", epoch=0)
    assert r.status_code == 409 and "stale" in r.json()["detail"]
    r = ev(client, "a", type="call_arrived", program="p1", call="c2", model="coder")
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    res = client.get("/v1/residency", headers=H("admin")).json()
    assert not any(c["object"][0] == "kv" for c in res["copies"]) and res["kv_tokens"] == {}
    assert lease(client).status_code == 409


def test_bad_bodies_get_422_with_the_field(client):
    r = client.post("/v1/events", json={"type": "call_arrived", "program": "p1", "call": "c1"}, headers=H("a"))
    assert r.status_code == 422 and "model" in str(r.json()["detail"])
    start_program(client)
    r = lease(client, model="no-such-model")
    assert r.status_code == 422 and "no-such-model" in r.json()["detail"]
    r = lease(client, deadline_s=-1)
    assert r.status_code == 422
    assert ev(client, "a", type="call_started", program="p9", call="c1").status_code == 404
    r = ev(client, "a", type="tool_started", program="p1", tool="pay", effect="pay-1")
    assert r.status_code == 422 and "tool call id" in str(r.json()["detail"])


def test_a_side_effect_already_applied_is_answered_done_over_http(client):
    start_program(client)
    body = {"type": "tool_started", "program": "p1", "tool": "pay", "effect": "pay-1"}
    assert ev(client, "a", **body, call="t1").json()["status"] == "started"
    assert ev(client, "a", type="tool_finished", program="p1", tool="pay", call="t1", result="r-9").json()["effect"] == "pay-1"
    out = ev(client, "a", **body, call="t2").json()
    assert out["status"] == "done" and out["of"] == "t1" and out["result"] == "r-9"


def test_metrics_count_leases_and_events(client):
    start_program(client)
    lease(client)
    text = client.get("/metrics", headers=H("admin")).text
    assert 'statebudget_leases_total{outcome="accepted"} 1.0' in text
    assert 'statebudget_events_total{type="program_started"} 1.0' in text
    assert client.get("/metrics", headers=H("a")).status_code == 403


def _finished(client, run_id):
    """The run, once it has ended (the request blocks on the job, up to 120 s)."""
    body = client.get(f"/v1/oracle/runs/{run_id}", params={"wait": 120}, headers=H("admin")).json()
    assert body["status"] not in ("queued", "running"), f"oracle run {run_id} still {body['status']} after 120 s"
    return body


def test_oracle_run_in_the_background(client):
    r = client.post("/v1/oracle/runs", json={"trace_jsonl": toy_trace_jsonl(1, 0.05), "time_limit_s": 5,
                                             "lead": "planner", "replicas": 1},
                    headers=H("admin"))
    assert r.status_code == 202
    run_id = r.json()["run_id"]
    body = _finished(client, run_id)
    assert body["status"] == "done", body
    assert body["result"]["oracle"]["status"] in ("OPTIMAL", "FEASIBLE") and body["result"]["calls"] > 0
    assert body["result"]["replicas"] == 1 and body["result"]["violations"] == []
    bad = client.post("/v1/oracle/runs", json={"preset": "swe-team", "trace_jsonl": "{}"}, headers=H("admin"))
    assert bad.status_code == 422
    bad = client.post("/v1/oracle/runs", json={"preset": "swe-tem"}, headers=H("admin"))  # refused now, not failed later
    assert bad.status_code == 422 and "unknown trace preset 'swe-tem'" in bad.text
    r = client.post("/v1/oracle/runs", json={"preset": "swe-team", "hours": 0.05}, headers=H("admin"))
    body = _finished(client, r.json()["run_id"])
    assert body["status"] == "failed" and "unknown model" in body["error"]  # swe-team names models toy lacks


def test_restart_keeps_leases_ops_and_residency(tmp_path):
    cl, cat = load_cluster("toy2"), load_catalog("toy")
    p = LivePlanner(cl, cat, Store(tmp_path / "sb.db"))
    p.event("a", {"type": "program_started", "program": "p1"})
    lid = p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60}).lease_id
    p.submit_lease("a", {"program": "p1", "model": "coder", "deadline_s": 60})
    ops = [o for n in ("n0", "n1") for o in p.plan_for(n, 0).ops]
    first = next(o for o in ops if o.lease_id == lid)
    node = p.ops[first.op_id].node
    p.report(node, first.op_id, done(first.model_dump()))
    before = p.residency()
    p.store.close()
    q = LivePlanner(cl, cat, Store(tmp_path / "sb.db"))
    after = q.residency()
    assert after.copies == before.copies and after.leases == before.leases
    assert q.lease_view(q.ledger.leases[lid]).ready
    assert q.plan_version > p.plan_version  # adapters see the open ops again
    reoffered = {o.op_id for n in ("n0", "n1") for o in q.plan_for(n, 0).ops}
    assert reoffered == {o.op_id for o in ops} - {first.op_id}
    assert q.report(node, first.op_id, done(first.model_dump())).duplicate  # acknowledged before: not twice


def test_a_token_added_to_the_file_works_without_a_restart(tmp_path):
    from statebudget.api.auth import add_token, create_token_file

    path = tmp_path / "tokens.json"
    admin = create_token_file(path)
    auth = Auth.load(path)
    assert auth.principal(admin).role == "admin"
    new = add_token(path, "runtime", tenant="team")
    who = auth.principal(new)
    assert who is not None and who.role == "runtime" and who.tenant == "team"
    path.write_text("{ broken")  # mid-edit: the tokens known so far keep working, unknown ones still fail
    assert auth.principal(new).role == "runtime" and auth.principal("x" * 32) is None


def test_the_driver_stops_at_a_refused_token(client):
    import asyncio

    import httpx

    from statebudget.api.driver import Driver
    from statebudget.models.load import parse_trace

    trace = parse_trace(toy_trace_jsonl(1, 0.02), "toy trace")
    transport = httpx.ASGITransport(app=client.app)
    driver = Driver("http://planner", "not-a-known-token-0123", speed=1000, call_s=0.0, transport=transport)
    with pytest.raises(PermissionError, match="401"):
        asyncio.run(driver.replay(trace))
    assert driver.events <= 1  # it stopped at the first refusal, not after every program


def test_a_rejected_lease_says_why(client):
    start_program(client)
    r = lease(client, model="coder", deadline_s=0.001)  # no copy crosses a link in a millisecond
    body = r.json()
    assert r.status_code == 200 and body["decision"] == "rejected", body
    assert "after the deadline" in body["reason"] or "deadline passed" in body["reason"], body


def test_the_driver_replays_a_traces_branch_cancels_and_parallel_tools(client):
    # A fork: two branches wait on tools side by side (their own threads), and when call `a` ends
    # the trace cancels branch `b` (DESIGN §5 `cancel`), as the simulator does: the driver never
    # sends b's call, the planner takes everything else, and the program finishes.
    import asyncio

    import httpx

    from statebudget.api.driver import Driver
    from statebudget.models import Program, Trace

    prog = {"program": "p1", "tenant": "team-a", "start": 0.0, "nodes": [
        {"id": "root", "kind": "call", "model": "planner", "context_tokens": 100, "output_tokens": 10},
        {"id": "s1", "kind": "tool", "tool": "search", "duration": 1.0, "after": ["root"]},
        {"id": "s2", "kind": "tool", "tool": "search", "duration": 20.0, "after": ["root"]},
        {"id": "a", "kind": "call", "model": "coder", "after": ["s1"], "context_tokens": 200, "output_tokens": 10},
        {"id": "b", "kind": "call", "model": "reviewer", "after": ["s2"], "context_tokens": 200, "output_tokens": 10},
        {"id": "join", "kind": "call", "model": "planner", "after": ["a", "s2"], "context_tokens": 300}],
        "cancel": [{"node": "b", "at_after": "a"}]}
    trace = Trace(programs=[Program.model_validate(prog)])
    driver = Driver("http://planner", TOK["a"], speed=100, call_s=0.0, transport=httpx.ASGITransport(app=client.app))
    out = asyncio.run(driver.replay(trace))
    assert out["n_errors"] == 0, driver.errors
    planner = client.app.state.service.planner
    rec = planner.programs["p1"]
    assert rec.status == "finished" and "b" not in rec.calls
    assert {c: v["status"] for c, v in rec.calls.items()} == {"root": "finished", "a": "finished", "join": "finished"}
    assert sorted(rec.tools_done) == ["s1", "s2"] and not rec.tools  # both waits ran, each timed on its own
    assert {k: e["state"] for k, e in rec.effects.items()} == {"s1": "done", "s2": "done"}  # keyed by node
    # The same trace again on the same ledger: its program ids are taken. One error says so, and
    # the program is not replayed into a run of refused events.
    again = Driver("http://planner", TOK["a"], speed=100, call_s=0.0, transport=httpx.ASGITransport(app=client.app))
    out = asyncio.run(again.replay(trace))
    assert out["n_errors"] == 1 and "p1: already finished in the planner's ledger" in out["errors"][0]
    assert out["events"] == 1  # its program_started only
    # ... and under another tenant's token the same ids are that tenant's own program, replayed whole.
    other = Driver("http://planner", TOK["b"], speed=100, call_s=0.0, transport=httpx.ASGITransport(app=client.app))
    out = asyncio.run(other.replay(trace))
    assert out["n_errors"] == 0, other.errors
    mine = [r for r in planner.programs.values() if r.tenant == "team-b"]
    assert len(mine) == 1 and mine[0].status == "finished" and mine[0].program != "p1"


def test_the_auto_queue_gauges_are_set_from_the_start_and_after_a_restart(tmp_path):
    # create_app plugs Prometheus in after the planner rebuilt what auto judges from the ledger:
    # the gauges must say it from the first scrape, not only after the next finished program.
    import json

    from fastapi.testclient import TestClient

    from tests.helpers import Clock
    from statebudget.api.app import create_app
    from statebudget.core.programs import AUTO_MIN

    clock = Clock()
    auth = Auth.from_json(json.dumps({"tokens": [{"token": TOK["admin"], "role": "admin"}]}), "tokens")

    def start():
        p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock, queue="auto")
        return p, TestClient(create_app(p, auth, planning_loop=False))

    def gauges(client):
        text = client.get("/metrics", headers={"Authorization": f"Bearer {TOK['admin']}"}).text
        return {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines()
                if line.startswith(("statebudget_queue_ordering", "statebudget_program_service_cv"))}

    p, client = start()
    with client:
        assert gauges(client) == {'statebudget_queue_ordering{discipline="atlas"}': "0.0",
                                  'statebudget_queue_ordering{discipline="fcfs"}': "1.0",
                                  "statebudget_program_service_cv": "NaN"}
        for i, run_s in enumerate([2000.0] + [5.0] * (AUTO_MIN - 1)):
            for kind in ("program_started", "call_arrived", "call_started"):
                p.event("a", {"type": kind, "program": f"p{i}", "call": "c", "model": "planner"})
            clock.t += run_s
            p.event("a", {"type": "call_finished", "program": f"p{i}", "call": "c", "tokens": 10})
            p.event("a", {"type": "program_finished", "program": f"p{i}"})
        assert gauges(client)['statebudget_queue_ordering{discipline="atlas"}'] == "1.0"
    _, client = start()  # a restart: the same ledger
    with client:
        g = gauges(client)
        assert g['statebudget_queue_ordering{discipline="atlas"}'] == "1.0" and g["statebudget_program_service_cv"] != "NaN"


def test_a_tenant_cannot_tell_that_another_took_its_program_id_first(client):
    # b's program "p1" is namespaced inside the planner because a took "p1" first; nothing b
    # hears says so: lease objects and reasons, refusals and answers carry b's own id.
    start_program(client, "a")
    assert ev(client, "b", type="program_started", program="p1").json()["program"] == "p1"
    assert ev(client, "b", type="call_arrived", program="p1", call="c1", model="planner").status_code == 200
    assert ev(client, "b", type="call_started", program="p1", call="c1").status_code == 200
    assert ev(client, "b", type="call_finished", program="p1", call="c1", tokens=100).status_code == 200
    r = client.post("/v1/leases", json={"program": "p1", "model": "planner", "deadline_s": 30}, headers=H("b"))
    body = r.json()
    assert r.status_code == 200 and "#" not in json.dumps(body), body
    assert ev(client, "b", type="program_finished", program="p1").status_code == 200
    late = ev(client, "b", type="call_arrived", program="p1", call="c2", model="planner")
    assert late.status_code == 409 and "'p1'" in late.json()["detail"] and "#" not in late.json()["detail"]
    assert "#" not in client.get(f"/v1/leases/{body['lease_id']}", headers=H("b")).text


def test_one_tenants_call_cancel_never_cancels_anothers_lease_with_the_same_token_text(client):
    # a's program "p" with a lease for call "x/y" and b's program "p/x" with call "y" make the
    # same default cancel token text "p/x/y"; b's cancel stops b's leases only.
    start_program(client, "a", "p")
    lid = client.post("/v1/leases", json={"program": "p", "model": "planner", "deadline_s": 30, "for_call": "x/y"},
                      headers=H("a")).json()["lease_id"]
    assert ev(client, "b", type="program_started", program="p/x").status_code == 200
    assert ev(client, "b", type="call_arrived", program="p/x", call="y", model="coder").status_code == 200
    assert ev(client, "b", type="call_cancelled", program="p/x", call="y").status_code == 200
    assert client.get(f"/v1/leases/{lid}", headers=H("a")).json()["state"] != "cancelled"


def test_the_service_saves_what_the_planner_learnt_when_it_stops(tmp_path):
    auth = Auth([TokenEntry(token=TOK["a"], role="runtime", tenant="team-a")])
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))
    with TestClient(create_app(planner, auth, planning_loop=False)) as c:
        start_program(c, program="p1")
        assert ev(c, "a", type="call_arrived", program="p1", call="c1", model="planner").status_code == 200
        assert planner.store.get_meta("learnt") is None  # no planning step has run: nothing saved yet
    saved = planner.store.get_meta("learnt")
    assert saved["called"] == ["planner"] and saved["program_starts"] > 0.0
