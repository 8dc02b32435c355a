"""The vLLM adapter against the real planner (in process) and fake vLLM servers (started here):
the planner's ops, as they come, drive the engines' sleep/wake endpoints, and a lease becomes ready
only when the engine is awake with its weights."""

from fastapi.testclient import TestClient

from tests.fake_engines import FakeVllm, serve
from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.engine_adapters.vllm import VllmAdapter
from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import lease_config
from statebudget.service.live import LivePlanner
from statebudget.core.decisions import Demote, apply

RUNTIME, ADAPTER = "runtime-token-0123456789", "adapter-n0-token-0123456789"


def test_a_lease_wakes_the_vllm_server_of_its_model():
    fakes = {m: FakeVllm() for m in ("planner", "coder", "reviewer")}
    for f in fakes.values():  # servers start asleep at level 2: weights not loaded
        f.asleep, f.weights_valid = {"weights", "kv_cache"}, False
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), config=lease_config(stage_host=False))
    auth = Auth([TokenEntry(token=RUNTIME, role="runtime", tenant="t"), TokenEntry(token=ADAPTER, role="adapter", node="n0")])
    with TestClient(create_app(planner, auth, planning_loop=False)) as client, \
            serve(fakes["planner"].app) as u1, serve(fakes["coder"].app) as u2, serve(fakes["reviewer"].app) as u3:
        client.headers["Authorization"] = f"Bearer {ADAPTER}"
        adapter = VllmAdapter("http://testserver", "n0", ADAPTER, client=client,
                              endpoints={("planner", "gpu:0"): u1, ("coder", "gpu:0"): u2, ("reviewer", "gpu:0"): u3})
        rt = {"Authorization": f"Bearer {RUNTIME}"}
        assert client.post("/v1/events", json={"type": "program_started", "program": "p"}, headers=rt).status_code == 200
        lease = client.post("/v1/leases", json={"program": "p", "model": "planner", "deadline_s": 60}, headers=rt).json()
        assert lease["decision"] == "accepted" and not lease["ready"]
        (op,) = planner.plan_for("n0", 0).ops  # ties in free HBM go to the lower GPU index: gpu:0 on n0
        assert op.dst == "gpu:0" and op.src == "nvme:n0" and op.lease_id == lease["lease_id"]
        assert adapter.step(wait_s=0) == 1
        assert "POST /collective_rpc" in fakes["planner"].lines()  # from NVMe: wake, then reload the weights
        assert not fakes["planner"].asleep and fakes["planner"].weights_valid
        assert client.get(f"/v1/leases/{lease['lease_id']}", headers=rt).json()["ready"]
        assert fakes["coder"].lines() == [] and fakes["reviewer"].lines() == []  # only the leased model's server
        # the planner demotes the idle weights to host DRAM: the server sleeps at level 1
        with planner.store.tx():
            apply([Demote(("w", "planner"), (0,), "host")], planner)
        assert adapter.step(wait_s=0) == 1
        assert fakes["planner"].lines()[-2:] == ["POST /sleep?level=1", "GET /is_sleeping"] and fakes["planner"].asleep
        where = {(tuple(c["object"]), c["tier"]): c["ready"] for c in planner.residency().copies}
        assert where == {(("w", "planner"), "host:n0"): True}
