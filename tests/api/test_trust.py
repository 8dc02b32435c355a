"""The service's answers when its ledger refuses writes, and on an adapter's inventory and
implausible reports, as a client sees them over HTTP."""

import pytest

from statebudget.api.auth import TokenEntry
from tests.helpers import toy_service
from tests.service.test_ledger_faults import fill_disk, free_disk

TOK = {"a": "runtime-a-0123456789", "n0": "adapter-n0-0123456789", "n1": "adapter-n1-0123456789"}


def H(who):
    return {"Authorization": f"Bearer {TOK[who]}"}


@pytest.fixture
def client(tmp_path):
    with toy_service(tmp_path, [TokenEntry(token=TOK["a"], role="runtime", tenant="a"),
                                TokenEntry(token=TOK["n0"], role="adapter", node="n0"),
                                TokenEntry(token=TOK["n1"], role="adapter", node="n1")]) as (c, _):
        yield c


def test_a_full_ledger_answers_503_with_retry_after_and_healthz_says_so_until_freed(client):
    p = client.app.state.service.planner
    assert client.get("/healthz").json()["ledger"] == {"writable": True}
    fill_disk(p.store)
    name = "p-" + "x" * 190
    answers = [client.post("/v1/events", json={"type": "program_started", "program": f"{name[:195]}{i:03d}"},
                           headers=H("a")) for i in range(40)]
    refused = [r for r in answers if r.status_code != 200]
    assert refused and all(r.status_code == 503 and r.headers["retry-after"] == "1" and "full" in r.json()["detail"]
                           for r in refused)
    h = client.get("/healthz")
    assert h.status_code == 503 and h.json()["status"] == "degraded" and not h.json()["ledger"]["writable"]
    acked = {f"{name[:195]}{i:03d}" for i, r in enumerate(answers) if r.status_code == 200}
    assert {r["program"] for r in p.store.programs()} == acked  # 200 means on disk, 503 means not
    free_disk(p.store)
    p.tick()
    assert client.get("/healthz").status_code == 200
    i = answers.index(refused[0])
    again = client.post("/v1/events", json={"type": "program_started", "program": f"{name[:195]}{i:03d}"},
                        headers=H("a"))
    assert again.status_code == 200 and again.json()["status"] == "running"


def test_an_inventory_is_for_the_tokens_own_node_and_answers_what_changed(client):
    r = client.put("/v1/inventory", json={"node": "n1", "copies": []}, headers=H("n0"))
    assert r.status_code == 403 and "node 'n0'" in r.json()["detail"]
    r = client.put("/v1/inventory", json={"node": "n0", "copies": [{"object": ["w", "planner"], "tier": "gpu:9"}]},
                   headers=H("n0"))
    assert r.status_code == 422 and "copies[0]" in r.json()["detail"]
    r = client.put("/v1/inventory", json={"node": "n0", "copies": [{"object": ["w", "planner"], "tier": "gpu:0"}]},
                   headers=H("n0"))
    assert r.status_code == 200 and r.json()["adopted"] == [{"object": ["w", "planner"], "tier": "gpu:0"}]


def test_a_report_of_more_bytes_than_the_object_is_a_422_and_the_op_fails(client):
    assert client.post("/v1/events", json={"type": "program_started", "program": "p1"}, headers=H("a")).status_code == 200
    lid = client.post("/v1/leases", json={"program": "p1", "model": "planner", "deadline_s": 60},
                      headers=H("a")).json()["lease_id"]
    p = client.app.state.service.planner
    (rec,) = [r for r in p.ops.values() if r.op.lease_id == lid]
    who = "n0" if rec.node == "n0" else "n1"
    r = client.post(f"/v1/ops/{rec.op.op_id}", json={"status": "done", "bytes": 1e15, "version": rec.op.version,
                                                     "epoch": rec.op.epoch}, headers=H(who))
    assert r.status_code == 422 and "bytes copied" in r.json()["detail"]
    assert client.get(f"/v1/leases/{lid}", headers=H("a")).json()["ready"] is False
