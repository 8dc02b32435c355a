"""GET /metrics as an operator reads it: lease outcomes (each lease once), occupancy per tier,
adapter liveness on the planner's clock, closed ops by bounded reason, and HTTP requests by route
template. Each scrape is parsed with prometheus-client's own parser."""

from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.core.decisions import Demote
from statebudget.models.load import load_catalog, load_cluster
from statebudget.models.plan import Op
from statebudget.service.journal import DROP_TRIES, OpRec, OpStatus
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner
from statebudget.service.telemetry import OP_REASONS, op_reason

from tests.helpers import Clock

TOK = {"admin": "admin-token-0123456789", "a": "runtime-a-0123456789", "n0": "adapter-n0-0123456789",
       "n1": "adapter-n1-0123456789"}
KIND = {"w": "weights", "kv": "kv", "e": "experts"}


def H(who):
    return {"Authorization": f"Bearer {TOK[who]}"}


@pytest.fixture
def svc(tmp_path):
    """The app on toy2 (two 0.4 GB GPUs, no engine overhead) with a fake clock, and the `swap`
    tool-wait rule, under which a waiting program's KV leaves HBM (so a lease can carry it)."""
    auth = Auth([TokenEntry(token=TOK["admin"], role="admin"),
                 TokenEntry(token=TOK["a"], role="runtime", tenant="team-a"),
                 TokenEntry(token=TOK["n0"], role="adapter", node="n0"),
                 TokenEntry(token=TOK["n1"], role="adapter", node="n1")])
    clock = Clock(1000.0)
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=clock,
                          kv_rule="swap")
    with TestClient(create_app(planner, auth, planning_loop=False)) as c:
        yield SimpleNamespace(c=c, p=planner, clock=clock)


def scrape(c) -> dict:
    """Every sample of one scrape: {(sample name, frozenset of its labels): value}."""
    r = c.get("/metrics", headers=H("admin"))
    assert r.status_code == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def series(m: dict, name: str, *labels: str, nonzero: bool = False) -> dict:
    """The samples called `name`, keyed by the values of `labels` (one label: the value alone)."""
    out = {}
    for (n, ls), v in m.items():
        if n == name and (v or not nonzero):
            d = dict(ls)
            key = tuple(d[k] for k in labels)
            out[key[0] if len(labels) == 1 else key] = v
    return out


def ev(s, **body):
    r = s.c.post("/v1/events", json=body, headers=H("a"))
    assert r.status_code == 200, r.text
    return r.json()


def lease(s, **body):
    body = {"program": "p1", "model": "planner", "deadline_s": 30, "confidence": 0.9, **body}
    r = s.c.post("/v1/leases", json=body, headers=H("a"))
    assert r.status_code == 200, r.text
    return r.json()


def op_of(s, lease_id: str) -> dict:
    """The open op of a lease, with the node that runs it."""
    for node in ("n0", "n1"):
        for o in s.c.get("/v1/plan", params={"node": node}, headers=H(node)).json()["ops"]:
            if o["lease_id"] == lease_id:
                return {**o, "node": node}
    raise AssertionError(f"no open op for lease {lease_id}")


def report(s, op: dict, status: str = "done", **kw):
    body = {"status": status, "bytes": op["bytes"], "seconds": 0.01, "checksum": "c", "version": op["version"],
            "epoch": op["epoch"], **kw}
    return s.c.post(f"/v1/ops/{op['op_id']}", json=body, headers=H(op["node"]))


def kv_lease_gone_stale(s) -> None:
    """Program p2's KV leaves HBM during a tool wait; a lease asks for it at version 1000; the next
    call grows it to 2000 while the lease still prepares it: the lease goes stale."""
    ev(s, type="program_started", program="p2")
    ev(s, type="call_arrived", program="p2", call="c1", model="coder")
    ev(s, type="call_started", program="p2", call="c1")
    ev(s, type="call_finished", program="p2", call="c1", tokens=1000)
    ev(s, type="tool_started", program="p2", tool="shell", call="t1")
    stale = lease(s, program="p2", model="coder")
    assert stale["decision"] == "accepted" and any(k.startswith("kv/") for k in stale["objects"]), stale
    ev(s, type="tool_finished", program="p2", tool="shell", call="t1")
    ev(s, type="call_arrived", program="p2", call="c2", model="coder", after=["c1"])
    ev(s, type="call_started", program="p2", call="c2")
    ev(s, type="call_finished", program="p2", call="c2", tokens=2000)
    assert s.c.get(f"/v1/leases/{stale['lease_id']}", headers=H("a")).json()["state"] == "stale"


def test_each_lease_is_counted_once_in_the_state_it_ended_in(svc):
    ev(svc, type="program_started", program="p1")
    used = lease(svc, model="planner", for_call="c1")
    assert report(svc, op_of(svc, used["lease_id"])).status_code == 200
    ev(svc, type="call_arrived", program="p1", call="c1", model="planner")  # the call takes the ready lease
    late = lease(svc, model="coder")
    dropped = lease(svc, model="reviewer")
    for _ in range(2):  # a runtime that retries its DELETE
        assert svc.c.delete(f"/v1/leases/{dropped['lease_id']}", headers=H("a")).json()["state"] == "cancelled"
    assert lease(svc, model="reviewer", deadline_s=0.001)["decision"] == "rejected"
    kv_lease_gone_stale(svc)
    svc.clock.t += 31  # past the coder lease's deadline: the next planning step expires it
    svc.p.tick()
    assert svc.c.get(f"/v1/leases/{late['lease_id']}", headers=H("a")).json()["state"] == "expired"

    m = scrape(svc.c)
    ends = series(m, "statebudget_lease_ends_total", "state")
    assert ends == {"consumed": 1, "rejected": 1, "cancelled": 1, "stale": 1, "expired": 1}
    assert ends == svc.p.residency().leases  # what the ledger says every lease ended as
    # the decisions at submit are another count of the same five leases, with no end among them
    assert series(m, "statebudget_leases_total", "outcome") == {"accepted": 4, "rejected": 1}


def test_a_cancel_is_counted_once_however_often_it_is_sent(svc):
    # A DELETE sent twice, and a program cancel (sent twice) that stops the program's other lease:
    # two leases cancelled, one program cancelled, each op closed once.
    ev(svc, type="program_started", program="p1")
    first = lease(svc, model="planner")
    lease(svc, model="coder")
    for _ in range(2):
        assert svc.c.delete(f"/v1/leases/{first['lease_id']}", headers=H("a")).status_code == 200
    for _ in range(2):
        assert ev(svc, type="program_cancelled", program="p1")["epoch"] == 1
    m = scrape(svc.c)
    assert series(m, "statebudget_leases_total", "outcome") == {"accepted": 2}
    assert series(m, "statebudget_lease_ends_total", "state", nonzero=True) == {"cancelled": 2}
    assert series(m, "statebudget_programs_ended_total", "status") == {"cancelled": 1}
    closed = svc.p.store.ops(OpStatus.CANCELLED)
    assert len(closed) >= 2  # the two leases' loads
    assert series(m, "statebudget_ops_total", "status", "reason") == {("cancelled", "cancelled_by_planner"): len(closed)}


def test_occupancy_per_tier_is_what_the_residency_report_holds(svc):
    ev(svc, type="program_started", program="p1")
    ready = lease(svc, model="planner")
    assert report(svc, op_of(svc, ready["lease_id"])).status_code == 200
    lease(svc, model="coder")  # its load stays in flight
    group = tuple(svc.p.tiers.groups_of[("w", "planner")])[0]
    with svc.p.store.tx():  # as the policy would evict it: the engine sleeps into host DRAM
        svc.p._apply([Demote(("w", "planner"), group, "host")])
    ev(svc, type="call_arrived", program="p1", call="c1", model="reviewer")
    ev(svc, type="call_started", program="p1", call="c1")
    ev(svc, type="call_finished", program="p1", call="c1", tokens=5000)  # 20 MB of KV, ready in HBM

    res = svc.c.get("/v1/residency", headers=H("admin")).json()
    m = scrape(svc.c)
    want_bytes, want_count, per_tier = defaultdict(float), Counter(), defaultdict(float)
    for cp in res["copies"]:
        at = (cp["tier"], KIND[cp["object"][0]], "ready" if cp["ready"] else "in_flight")
        want_bytes[at] += cp["bytes"]
        want_count[at] += 1
        per_tier[cp["tier"]] += cp["bytes"]
    assert {s for _, _, s in want_count} == {"ready", "in_flight"} and any(t.startswith("host:") for t in per_tier)
    assert series(m, "statebudget_tier_copy_bytes", "tier", "kind", "state", nonzero=True) == pytest.approx(want_bytes)
    assert series(m, "statebudget_tier_copies", "tier", "kind", "state", nonzero=True) == want_count
    # toy2's engines take no HBM of their own, so a tier's books are its copies' bytes
    used = series(m, "statebudget_tier_used_bytes", "tier")
    assert used == pytest.approx({t: per_tier.get(t, 0.0) for t in ("gpu:0", "gpu:1", "host:n0", "host:n1")})
    assert series(m, "statebudget_tier_capacity_bytes", "tier") == {"gpu:0": 0.4e9, "gpu:1": 0.4e9,
                                                                    "host:n0": 1.5e9, "host:n1": 1.5e9}
    node_of = {f"gpu:{g.index}": g.node for g in svc.p.cluster.gpus}
    engines = Counter((node_of[e["tier"]], e["state"]) for e in res["engines"])
    assert engines[(node_of[f"gpu:{group[0]}"], "asleep")] == 1 and any(s == "awake" for _, s in engines)
    assert series(m, "statebudget_engines", "node", "state", nonzero=True) == engines


def test_adapter_liveness_follows_the_planners_clock(svc):
    def ages():
        m = scrape(svc.c)
        return series(m, "statebudget_adapter_seen_age_seconds", "node"), series(m, "statebudget_adapter_up", "node")

    def healthz_up():
        body = svc.c.get("/healthz").json()
        assert body["adapters"]["nodes"] == 2
        return body["adapters"]["up"]

    assert ages() == ({"n0": float("inf"), "n1": float("inf")}, {"n0": 0.0, "n1": 0.0})
    assert healthz_up() == 0
    ev(svc, type="program_started", program="p1")
    op = op_of(svc, lease(svc, model="planner")["lease_id"])
    other = "n1" if op["node"] == "n0" else "n0"
    assert svc.c.get("/v1/plan", params={"node": other}, headers=H(other)).status_code == 200  # both polled at 1000
    svc.clock.t += 45
    assert ages() == ({"n0": 45.0, "n1": 45.0}, {"n0": 1.0, "n1": 1.0})
    assert report(svc, op).status_code == 200  # the op's adapter is heard from again
    svc.clock.t += 30
    assert ages() == ({op["node"]: 30.0, other: 75.0}, {op["node"]: 1.0, other: 0.0})
    assert healthz_up() == 1
    assert svc.c.get("/v1/plan", params={"node": other, "wait": 0}, headers=H(other)).status_code == 200
    assert ages()[0][other] == 0.0 and healthz_up() == 2


def test_closed_ops_are_counted_by_status_and_a_bounded_reason(svc):
    ev(svc, type="program_started", program="p1")
    assert report(svc, op_of(svc, lease(svc, model="planner")["lease_id"])).status_code == 200
    failed = op_of(svc, lease(svc, model="coder")["lease_id"])
    assert report(svc, failed, "failed", error="CUDA error: out of memory (pid 4242)").status_code == 200
    by_adapter = op_of(svc, lease(svc, model="reviewer")["lease_id"])
    assert report(svc, by_adapter, "cancelled").status_code == 200
    ev(svc, type="program_finished", program="p1")  # its leases end: none still asks for those models
    ev(svc, type="program_started", program="p2")
    svc.clock.t += 120  # past the failed coder load's back-off
    mismatch = op_of(svc, lease(svc, program="p2", model="coder")["lease_id"])
    r = report(svc, mismatch, version=mismatch["version"] + 1)
    assert r.status_code == 409 and "version" in r.json()["detail"]
    svc.clock.t += 120
    dropped = lease(svc, program="p2", model="reviewer")
    op_of(svc, dropped["lease_id"])
    assert svc.c.delete(f"/v1/leases/{dropped['lease_id']}", headers=H("a")).status_code == 200

    m = scrape(svc.c)
    assert series(m, "statebudget_ops_total", "status", "reason") == {
        ("done", "committed"): 1, ("failed", "engine_error"): 1, ("cancelled", "cancelled_by_adapter"): 1,
        ("cancelled", "version_mismatch"): 1, ("cancelled", "cancelled_by_planner"): 1}
    labels = {v for _, ls in m for _, v in ls}
    assert not any("CUDA" in v or "memory" in v for v in labels)  # an engine's error text is never a label


def _closed(kind="promote", status=OpStatus.FAILED, result=None, tries=0):
    op = Op(op_id="op9", kind=kind, object=["w", "coder"], src="gpu:0", dst="none" if kind == "drop" else "gpu:1",
            bytes=1e6, version=3, epoch=0)
    return OpRec(op, "n0", status, result=result, tries=tries)


@pytest.mark.parametrize("rec, in_books, reason", [
    (_closed(status=OpStatus.DONE, result={"status": "done", "version": 3, "epoch": 0}), False, "committed"),
    (_closed(status=OpStatus.CANCELLED, result={"status": "done", "version": 3, "epoch": 0}), False, "stale"),
    (_closed(status=OpStatus.CANCELLED, result={"status": "done", "version": 3, "epoch": 1}), False, "version_mismatch"),
    (_closed(result={"status": "failed"}), False, "engine_error"),
    (_closed("drop", result={"status": "failed"}, tries=DROP_TRIES - 1), False, "engine_error"),
    (_closed("drop", result={"status": "failed"}, tries=DROP_TRIES), False, "gave_up"),
    (_closed("drop", result={"status": "failed"}, tries=DROP_TRIES), True, "engine_error"),  # taken back
    (_closed(status=OpStatus.CANCELLED, result={"status": "cancelled"}), False, "cancelled_by_adapter"),
    (_closed(status=OpStatus.CANCELLED), False, "cancelled_by_planner"),
    (_closed(), False, "adapter_restarted"),
])
def test_op_reason_classes(rec, in_books, reason):
    books = SimpleNamespace(tiers=SimpleNamespace(gpu={(("w", "coder"), (0,)): object()} if in_books else {}))
    assert op_reason(rec, books) == reason and reason in OP_REASONS


def test_requests_are_timed_by_route_template_not_path(svc):
    assert svc.c.get("/healthz").status_code == 200
    assert svc.c.get("/v1/leases/L999", headers=H("a")).status_code == 404
    assert svc.c.get("/v1/leases/L998", headers=H("a")).status_code == 404
    assert svc.c.get("/no/such/route/x17").status_code == 404
    assert svc.c.post("/v1/events", json={"type": "call_arrived"}, headers=H("a")).status_code == 422
    m = scrape(svc.c)
    got = series(m, "statebudget_http_request_seconds_count", "route", "method", "status")
    assert got[("/healthz", "GET", "200")] == 1
    assert got[("/v1/leases/{lease_id}", "GET", "404")] == 2
    assert got[("unmatched", "GET", "404")] == 1
    assert got[("/v1/events", "POST", "422")] == 1
    assert not any("L99" in r or "x17" in r for r, _, _ in got)
    buckets = series(m, "statebudget_http_request_seconds_bucket", "route", "status", "le")
    assert buckets[("/v1/leases/{lease_id}", "404", "+Inf")] == 2


def test_healthz_says_nothing_secret(svc):
    body = svc.c.get("/healthz").json()
    assert body["status"] == "ok" and body["plan_version"] == svc.p.plan_version
    assert body["adapters"] == {"nodes": 2, "up": 0}
    text = svc.c.get("/healthz").text
    assert not any(t in text for t in TOK.values()) and "team-a" not in text and "n0" not in text
