"""The vLLM, SGLang and LMCache adapters against fake engine servers (tests/fake_engines.py) over
real HTTP: which calls each op makes, the state the engine ends in, engine errors becoming failed
ops, and `Adapter.step` against a fake planner (an op offered twice runs once; a 409 undoes)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.fake_engines import FakeLMCache, FakePlanner, FakeSglang, FakeVllm, serve
from statebudget.engine_adapters.lmcache import LMCacheAdapter
from statebudget.engine_adapters.sglang import SglangAdapter
from statebudget.engine_adapters.vllm import VllmAdapter
from statebudget.models.plan import Op

PLANNER = "http://planner.invalid"  # execute() never talks to the planner
GB = 1e9
CPU, DISK = "LocalCPUBackend", "LocalDiskBackend"
TOKENS = {("p1", "coder"): [1, 2, 3, 4], ("p2", "coder"): [9, 8, 7]}


def op(op_id, kind, obj, src, dst, nbytes=2 * GB, **kw) -> Op:
    return Op(op_id=op_id, kind=kind, object=obj, src=src, dst=dst, bytes=nbytes, epoch=3, version=7, **kw)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- fixtures -----------------------------------------------------------------------------------------

@pytest.fixture
def vllm():
    fake = FakeVllm(tp=2)
    with serve(fake.app) as url:
        fake.url = url
        yield fake


@pytest.fixture
def lmcache():
    fake = FakeLMCache(finish_polls=3)
    with serve(fake.app) as url:
        fake.url = url
        yield fake


@pytest.fixture
def sglang():
    fake = FakeSglang(model_paths={"/models/coder"})
    with serve(fake.app) as url:
        fake.url = url
        yield fake


def vllm_adapter(fake, **kw) -> VllmAdapter:
    return VllmAdapter(PLANNER, "n0", "tok", {("coder", "gpu:0,1"): fake.url}, poll_interval_s=0.001, **kw)


def lmcache_adapter(fake, **kw) -> LMCacheAdapter:
    """With /check_finish and pins on (the fake's moves finish over a few checks, as an
    asynchronous LMCache would); `test_lmcache_defaults_*` covers the defaults."""
    kw = {"wait_for_finish": True, "pin_leased": True, **kw}
    return LMCacheAdapter(PLANNER, "n0", "tok", fake.url, tokens_of=lambda p, m: TOKENS[(p, m)],
                          instance_of={"coder": "inst0"}, poll_interval_s=0.001, **kw)


def sglang_adapter(fake, **kw) -> SglangAdapter:
    return SglangAdapter(PLANNER, "n0", "tok", {("coder", "gpu:0"): fake.url},
                         model_paths={"coder": "/models/coder"}, **kw)


# ---- vLLM ---------------------------------------------------------------------------------------------

def test_vllm_demote_sleeps_level_1_and_promote_wakes(vllm):
    a = vllm_adapter(vllm)
    r = a.execute(op("d1", "demote", ["w", "coder"], "gpu:0,1", "host:n0"))
    assert (r.status, r.bytes, r.version, r.epoch) == ("done", 2 * GB, 7, 3) and r.seconds > 0
    assert vllm.lines() == ["POST /sleep?level=1", "GET /is_sleeping"]
    assert vllm.asleep == {"weights", "kv_cache"} and vllm.weights_valid

    vllm.calls.clear()
    r = a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:1,0"))  # same group, other order
    assert r.status == "done", r.error
    assert vllm.lines() == ["POST /wake_up", "GET /is_sleeping", "GET /health"]
    assert not vllm.asleep and vllm.weights_valid


@pytest.mark.parametrize("kind, dst", [("drop", "none"), ("demote", "nvme:n0")])
def test_vllm_drop_sleeps_level_2_and_promote_reloads_weights(vllm, kind, dst):
    a = vllm_adapter(vllm)
    assert a.execute(op("d1", kind, ["w", "coder"], "gpu:0,1", dst)).status == "done"
    assert vllm.lines() == ["POST /sleep?level=2", "GET /is_sleeping"] and not vllm.weights_valid

    vllm.calls.clear()
    r = a.execute(op("p1", "promote", ["w", "coder"], "nvme:n0", "gpu:0,1"))
    assert r.status == "done", r.error
    assert vllm.lines() == ["POST /wake_up?tags=weights", "POST /collective_rpc", "POST /wake_up?tags=kv_cache",
                            "GET /is_sleeping", "GET /health"]
    assert vllm.calls[1][1] == {"method": "reload_weights"}
    assert not vllm.asleep and vllm.weights_valid


def test_vllm_promote_after_its_own_level_2_sleep_reloads_even_from_host(vllm):
    a = vllm_adapter(vllm)
    a.execute(op("d1", "drop", ["w", "coder"], "gpu:0,1", "none"))
    r = a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1"))
    assert r.status == "done" and vllm.weights_valid
    assert "POST /collective_rpc" in vllm.lines()


def test_vllm_promote_waits_until_the_engine_is_awake(vllm):
    vllm.wake_polls = 4
    vllm.asleep = {"weights", "kv_cache"}
    r = vllm_adapter(vllm).execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1"))
    assert r.status == "done"
    assert vllm.lines().count("GET /is_sleeping") == 5 and vllm.lines()[-1] == "GET /health"


def test_vllm_promote_fails_when_the_engine_is_not_awake_by_the_deadline(vllm):
    vllm.wake_polls = 10**6
    vllm.asleep = {"weights", "kv_cache"}
    r = vllm_adapter(vllm).execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1",
                                      deadline=time.time() - 1.0))
    assert r.status == "failed" and r.bytes == 0 and "timed out" in r.error
    assert vllm.lines().count("GET /is_sleeping") == 1


def test_vllm_sleep_is_done_only_once_the_engine_says_it_sleeps(vllm):
    """The verify step of a demote: /sleep answered 200, but /is_sleeping says the engine is awake."""
    vllm.inject("/is_sleeping", 200, {"is_sleeping": False})
    a = vllm_adapter(vllm)
    r = a.execute(op("d1", "demote", ["w", "coder"], "gpu:0,1", "host:n0", deadline=time.time() - 1.0))
    assert r.status == "failed" and r.bytes == 0 and "not verified" in r.error and "/sleep?level=1" in r.error
    vllm.calls.clear()
    vllm.inject("/is_sleeping", 200, {"is_sleeping": False})  # not yet at the first poll, then asleep
    assert a.execute(op("d2", "demote", ["w", "coder"], "gpu:0,1", "host:n0")).status == "done"
    assert vllm.lines() == ["POST /sleep?level=1", "GET /is_sleeping", "GET /is_sleeping"]


def test_an_undo_that_meets_an_odd_engine_answer_is_logged_and_the_adapter_goes_on(vllm):
    # vLLM's /is_sleeping answering without its field raises inside abort (a KeyError, not an
    # engine error); settling a refused op must not take the adapter's loop down with it.
    a = vllm_adapter(vllm)
    o = op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1")
    vllm.asleep = {"weights", "kv_cache"}
    assert a.execute(o).status == "done"
    vllm.inject("/is_sleeping", 200, {})
    a._settle(o, 409)  # the undo sleeps the server again, then fails to read /is_sleeping
    assert vllm.lines()[-2:] == ["POST /sleep?level=1", "GET /is_sleeping"]


def test_vllm_engine_error_fails_the_op_with_the_engines_message(vllm):
    vllm.inject("/sleep", 500, {"error": {"message": "CUDA error: out of memory", "type": "Internal Server Error",
                                          "code": 500}})
    r = vllm_adapter(vllm).execute(op("d1", "demote", ["w", "coder"], "gpu:0,1", "host:n0"))
    assert r.status == "failed" and "CUDA error: out of memory" in r.error and "500" in r.error
    assert r.bytes == 0 and (r.version, r.epoch) == (7, 3)


def test_vllm_failed_weight_reload_fails_the_promote(vllm):
    a = vllm_adapter(vllm)
    a.execute(op("d1", "drop", ["w", "coder"], "gpu:0,1", "none"))
    vllm.calls.clear()
    vllm.inject("/collective_rpc", 500, {"error": {"message": "safetensors: file not found"}})
    r = a.execute(op("p1", "promote", ["w", "coder"], "nvme:n0", "gpu:0,1"))
    assert r.status == "failed" and "safetensors: file not found" in r.error
    assert "GET /is_sleeping" not in vllm.lines()


def test_vllm_cannot_page_experts_and_needs_lmcache_for_kv(vllm):
    a = vllm_adapter(vllm)
    r = a.execute(op("e1", "promote", ["e", "coder", "17"], "host:n0", "gpu:0,1"))
    assert r.status == "failed" and "expert" in r.error
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "gpu:0,1", "host:n0"))
    assert r.status == "failed" and "LMCache" in r.error
    assert vllm.calls == []


def test_vllm_hands_kv_ops_to_lmcache(vllm, lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    a = vllm_adapter(vllm, lmcache=lmcache_adapter(lmcache))
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))
    assert r.status == "done", r.error
    assert lmcache.kv[(1, 2, 3, 4)] == {("inst0", DISK)} and vllm.calls == []


def test_vllm_unknown_server_or_unreachable_server_fails(vllm):
    a = vllm_adapter(vllm)
    r = a.execute(op("d1", "demote", ["w", "coder"], "gpu:2", "host:n0"))
    assert r.status == "failed" and "no vLLM server" in r.error
    down = VllmAdapter(PLANNER, "n0", "tok", {("coder", "gpu:0"): f"http://127.0.0.1:{closed_port()}"})
    r = down.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0"))
    assert r.status == "failed" and "Connect" in r.error
    assert not down.health()["ok"]


def test_vllm_health_reports_each_server(vllm):
    a = vllm_adapter(vllm)
    assert a.health()["ok"]
    vllm.dead = True
    h = a.health()
    assert not h["ok"] and h["servers"][vllm.url]["status"] == 503


def test_fake_vllm_answers_like_vllm(vllm):
    """The fake's error answers and sleep state (the adapter tests rely on them)."""
    with httpx.Client(base_url=vllm.url) as c:
        assert c.post("/sleep", params={"level": "7"}).status_code == 400
        r = c.post("/collective_rpc", json={})
        assert r.status_code == 400 and r.json()["error"]["message"] == "Missing 'method' in request body"
        assert c.post("/collective_rpc", json={"method": "nope"}).status_code == 500
        assert c.post("/wake_up").status_code == 200  # waking an awake engine is fine
        c.post("/sleep", params={"level": "2"})
        c.post("/wake_up", params={"tags": "weights"})
        assert c.get("/is_sleeping").json() == {"is_sleeping": True}  # kv_cache still asleep
        assert c.post("/collective_rpc", json={"method": "reload_weights"}).json() == {"results": [None, None]}


# ---- SGLang -------------------------------------------------------------------------------------------

def test_sglang_demote_releases_and_promote_resumes_weights(sglang):
    a = sglang_adapter(sglang)
    r = a.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0"))
    assert r.status == "done" and r.bytes == 2 * GB
    assert sglang.calls == [("POST /release_memory_occupation", {"tags": ["weights"]})]
    assert sglang.released == {"weights"}

    sglang.calls.clear()
    assert a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
    assert sglang.calls == [("POST /resume_memory_occupation", {"tags": ["weights"]}), ("GET /health", None)]
    assert not sglang.released and sglang.weights_valid


def test_sglang_drop_then_promote_rereads_weights_from_disk(sglang):
    a = sglang_adapter(sglang)
    assert a.execute(op("d1", "drop", ["w", "coder"], "gpu:0", "none")).status == "done"
    r = a.execute(op("p1", "promote", ["w", "coder"], "nvme:n0", "gpu:0"))
    assert r.status == "done", r.error
    assert sglang.lines() == ["POST /release_memory_occupation", "POST /resume_memory_occupation",
                              "POST /update_weights_from_disk", "GET /health"]
    assert sglang.calls[2][1]["model_path"] == "/models/coder"
    assert sglang.loaded_path == "/models/coder" and sglang.weights_valid and not sglang.released


def test_sglang_without_cpu_backup_rereads_weights_after_a_demote():
    fake = FakeSglang(model_paths={"/models/coder"}, cpu_backup=False)
    with serve(fake.app) as url:
        fake.url = url
        a = sglang_adapter(fake, cpu_backup=False)
        a.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0"))
        assert not fake.weights_valid
        assert a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
        assert fake.weights_valid and "POST /update_weights_from_disk" in fake.lines()


def test_sglang_engine_errors_fail_the_op_with_the_engines_message(sglang):
    r = sglang_adapter(sglang).execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0"))
    assert r.status == "failed" and "cannot resume ['weights']: not released" in r.error

    wrong = SglangAdapter(PLANNER, "n0", "tok", {("coder", "gpu:0"): sglang.url}, model_paths={"coder": "/nowhere"})
    wrong.execute(op("d1", "drop", ["w", "coder"], "gpu:0", "none"))
    r = wrong.execute(op("p2", "promote", ["w", "coder"], "nvme:n0", "gpu:0"))
    assert r.status == "failed" and "Failed to get weights iterator" in r.error


def test_sglang_health_does_not_probe_a_server_with_a_region_released(sglang):
    # /health is a one-token generation in SGLang: sent to a server whose weights are released it
    # fails or hangs. Such a server is reported unprobed, and the rest decide `ok`.
    a = sglang_adapter(sglang)
    assert a.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0")).status == "done"
    sglang.calls.clear()
    h = a.health()
    assert h["ok"] and h["servers"][sglang.url] == {"model": "coder", "gpus": [0], "ok": None, "probed": False,
                                                    "released": ["weights"]}
    assert sglang.lines() == []  # not probed
    assert a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
    assert a.health()["servers"][sglang.url]["status"] == 200 and sglang.lines()[-1] == "GET /health"
    # Weights come back while the KV pool is still released: the promote takes the engine's word.
    assert a.execute(op("k1", "drop", ["kv", "p1", "coder"], "gpu:0", "none")).status == "done"
    assert a.execute(op("d2", "demote", ["w", "coder"], "gpu:0", "host:n0")).status == "done"
    sglang.calls.clear()
    assert a.execute(op("p2", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
    assert sglang.lines() == ["POST /resume_memory_occupation"]  # no /health with kv_cache released


def test_sglang_kv_pool_release_and_resume_without_lmcache(sglang):
    a = sglang_adapter(sglang)
    assert a.execute(op("k1", "drop", ["kv", "p1", "coder"], "gpu:0", "none")).status == "done"
    assert sglang.released == {"kv_cache"}
    assert a.execute(op("k2", "promote", ["kv", "p1", "coder"], "host:n0", "gpu:0")).status == "done"
    assert [b for _, b in sglang.calls[:2]] == [{"tags": ["kv_cache"]}, {"tags": ["kv_cache"]}]
    assert not sglang.released
    r = a.execute(op("e1", "promote", ["e", "coder", "3"], "host:n0", "gpu:0"))
    assert r.status == "failed" and "expert" in r.error


# ---- LMCache ------------------------------------------------------------------------------------------

def test_lmcache_move_waits_for_check_finish_when_asked(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    r = lmcache_adapter(lmcache).execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))
    assert r.status == "done" and r.bytes == 2 * GB
    assert lmcache.lines() == ["POST /move"] + ["POST /check_finish"] * 3 + ["POST /lookup"]  # then verified
    assert lmcache.calls[0][1] == {"old_position": ("inst0", CPU), "new_position": ("inst0", DISK),
                                   "tokens": [1, 2, 3, 4], "copy": False}
    assert lmcache.kv[(1, 2, 3, 4)] == {("inst0", DISK)}  # moved only at the third check


def test_lmcache_promote_to_gpu_stages_on_host_and_pins_for_the_lease(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", DISK)}
    a = lmcache_adapter(lmcache)
    r = a.execute(op("k1", "promote", ["kv", "p1", "coder"], "nvme:n0", "gpu:0", lease_id="L4"))
    assert r.status == "done", r.error
    assert lmcache.lines()[0] == "POST /move" and lmcache.lines()[-1] == "POST /pin"
    assert lmcache.kv[(1, 2, 3, 4)] == {("inst0", CPU)} and lmcache.pinned == {((1, 2, 3, 4), "inst0", CPU)}

    lmcache.calls.clear()
    lmcache.kv[(9, 8, 7)] = {("inst0", CPU)}
    assert a.execute(op("k2", "promote", ["kv", "p2", "coder"], "host:n0", "gpu:0", lease_id="L5")).status == "done"
    assert lmcache.lines() == ["POST /pin"]  # already on host: nothing to move


def test_lmcache_demote_from_gpu_finds_the_kv_the_connector_stored(lmcache):
    a = lmcache_adapter(lmcache)
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "gpu:0", "host:n0"))
    assert r.status == "failed" and "holds no KV" in r.error
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    lmcache.calls.clear()
    assert a.execute(op("k2", "demote", ["kv", "p1", "coder"], "gpu:0", "host:n0")).status == "done"
    assert lmcache.lines() == ["POST /lookup"]
    lmcache.calls.clear()
    assert a.execute(op("k3", "demote", ["kv", "p1", "coder"], "gpu:0", "nvme:n0")).status == "done"
    assert lmcache.lines()[:2] == ["POST /lookup", "POST /move"] and lmcache.kv[(1, 2, 3, 4)] == {("inst0", DISK)}


def test_lmcache_drop_clears_the_location(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    assert lmcache_adapter(lmcache).execute(op("k1", "drop", ["kv", "p1", "coder"], "host:n0", "none")).status == "done"
    assert lmcache.calls == [("POST /clear", {"instance_id": "inst0", "location": CPU})]
    assert lmcache.kv[(1, 2, 3, 4)] == set()


def test_lmcache_errors_fail_the_op(lmcache):
    a = lmcache_adapter(lmcache)
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))  # nothing there
    assert r.status == "failed" and "no KV of 4 tokens at ['inst0', 'LocalCPUBackend']" in r.error

    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    lmcache.inject("/check_finish", 200, {"status": "failed"})
    r = a.execute(op("k2", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))
    assert r.status == "failed" and "failed" in r.error

    r = a.execute(op("k3", "demote", ["kv", "p1", "other"], "host:n0", "nvme:n0"))
    assert r.status == "failed" and "no LMCache instance" in r.error
    r = a.execute(op("w1", "demote", ["w", "coder"], "gpu:0", "host:n0"))
    assert r.status == "failed" and "KV only" in r.error


def test_lmcache_move_not_finished_by_the_deadline_fails(lmcache):
    lmcache.finish_polls = 10**6
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    r = lmcache_adapter(lmcache).execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0",
                                            deadline=time.time() - 1.0))
    assert r.status == "failed" and "timed out" in r.error


@pytest.mark.parametrize("layout, error", [
    ({}, "no instance holding the 4 tokens"),
    ({"inst0": [CPU, 4]}, "4 tokens at LocalCPUBackend on 'inst0', not 4 tokens at LocalDiskBackend"),
    ({"inst0": [DISK, 2]}, "2 tokens at LocalDiskBackend on 'inst0', not 4 tokens at LocalDiskBackend"),
    ({"inst1": [CPU, 4]}, None)], ids=["lost", "still-at-source", "partial", "hidden-by-another-instance"])
def test_lmcache_move_is_done_only_if_lookup_does_not_refute_it(layout, error):
    """The verify step: a move LMCache acknowledged fails if /lookup shows the KV elsewhere, partial,
    or held by no instance at all; the controller names one instance per chunk, so a prefix held
    by another instance hides this one, and that is taken as done."""
    fake = FakeLMCache(finish_polls=0)
    fake.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    with serve(fake.app) as url:
        fake.url = url
        a = lmcache_adapter(fake, wait_for_finish=False)
        fake.inject("/lookup", 200, {"event_id": "L", "layout_info": layout})
        r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0", deadline=time.time() - 1.0))
        if error is None:
            assert r.status == "done", r.error
            return
        assert r.status == "failed" and "not verified" in r.error and error in r.error, r.error
        assert "k1" not in a.moved  # it never counted as moved: nothing to undo
        # the same move, with /lookup telling the truth, is verified
        fake.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
        assert a.execute(op("k2", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")).status == "done"


def test_lmcache_move_of_no_tokens_fails_unless_the_kv_is_already_at_the_target(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    lmcache.inject("/move", 200, {"event_id": "Move0", "num_tokens": 0})
    a = lmcache_adapter(lmcache)
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))
    assert r.status == "failed" and "moved none of 4 tokens" in r.error
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", DISK)}  # an earlier run of the op moved it (an adapter restart)
    lmcache.inject("/move", 200, {"event_id": "Move1", "num_tokens": 0})
    assert a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")).status == "done"


@pytest.mark.parametrize("answer", [{"event_id": "L"}, {"layout_info": {"inst0": []}}, {"layout_info": {"inst0": None}}])
def test_lmcache_lookup_of_another_shape_fails_the_op_and_an_undo_does_not_stop_the_loop(lmcache, answer):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    a = lmcache_adapter(lmcache)
    lmcache.inject("/move", 200, {"event_id": "Move0", "num_tokens": 0})  # ... then asks /lookup
    lmcache.inject("/lookup", 200, answer)
    r = a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0"))
    assert r.status == "failed" and "/lookup answered" in r.error
    # a refused op whose undo meets the same answer is logged; the adapter goes on
    o = op("k2", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")
    assert a.execute(o).status == "done"
    lmcache.inject("/move", 200, {"event_id": "Move9", "num_tokens": 0})
    lmcache.inject("/lookup", 200, answer)
    a._settle(o, 409)  # no exception
    assert lmcache.lines()[-2:] == ["POST /move", "POST /lookup"]


def test_lmcache_abort_moves_the_kv_back(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    a = lmcache_adapter(lmcache)
    o = op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")
    assert a.execute(o).status == "done"
    a.abort(o)
    assert lmcache.kv[(1, 2, 3, 4)] == {("inst0", CPU)}
    a.abort(o)  # only once
    assert lmcache.lines().count("POST /move") == 2


def test_lmcache_defaults_a_blocking_move_no_check_finish_and_no_pins():
    # The LMCache source followed answers /move once moved, raises in /check_finish, and has no
    # route to unpin: by default the adapter moves, verifies with /lookup, and pins nothing.
    fake = FakeLMCache(finish_polls=0)
    fake.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    with serve(fake.app) as url:
        fake.url = url
        a = LMCacheAdapter(PLANNER, "n0", "tok", url, tokens_of=lambda p, m: TOKENS[(p, m)],
                           instance_of={"coder": "inst0"}, poll_interval_s=0.001)
        assert a.execute(op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")).status == "done"
        assert fake.lines() == ["POST /move", "POST /lookup"] and fake.kv[(1, 2, 3, 4)] == {("inst0", DISK)}
        fake.calls.clear()
        leased = op("k2", "promote", ["kv", "p1", "coder"], "nvme:n0", "gpu:0", lease_id="L1")
        assert a.execute(leased).status == "done" and "POST /pin" not in fake.lines() and not fake.pinned
        assert a.health() == {"kind": "lmcache", "ok": True,
                              "instances": {"inst0": {"ok": True, "error_codes": {"0": 0}}}}
        fake.inject("/health", 200, {"event_id": "e", "error_code": 0})  # the other versions' answer
        assert a.health()["instances"]["inst0"] == {"ok": True, "error_codes": {"all": 0}}
        fake.inject("/health", 200, {"event_id": "e"})
        h = a.health()
        assert not h["ok"] and "no error_codes or error_code" in h["instances"]["inst0"]["error"]


# ---- Adapter.step against a fake planner --------------------------------------------------------------

def as_offer(o: Op) -> dict:
    return o.model_dump()


def test_step_executes_an_op_offered_twice_once_and_reports_it_again(vllm):
    demote = op("d1", "demote", ["w", "coder"], "gpu:0,1", "host:n0")
    promote = op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1")
    planner = FakePlanner([[as_offer(demote), as_offer(promote)], [as_offer(demote), as_offer(promote)]])
    with serve(planner.app) as planner_url:
        a = VllmAdapter(planner_url, "n0", "tok", {("coder", "gpu:0,1"): vllm.url}, poll_interval_s=0.001)
        assert a.step(wait_s=0) == 2
        assert a.step(wait_s=0) == 0  # offered again: reported, not executed
    assert a.executed == ["d1", "p1"]
    assert vllm.lines().count("POST /sleep?level=1") == 1 and vllm.lines().count("POST /wake_up") == 1
    assert [op_id for op_id, _ in planner.reports] == ["d1", "p1", "d1", "p1"]
    assert planner.reports[0][1] == planner.reports[2][1] and planner.reports[0][1]["status"] == "done"
    assert planner.reports[0][1]["bytes"] == 2 * GB and planner.reports[0][1]["version"] == 7
    assert planner.lines()[0] == "GET /v1/plan?node=n0&after=0&wait=0"
    assert planner.lines()[3] == "GET /v1/plan?node=n0&after=1&wait=0"  # after the first plan's version
    assert planner.auth == {"Bearer tok"}


def test_step_aborts_a_done_op_the_planner_refuses(vllm):
    vllm.asleep = {"weights", "kv_cache"}
    promote = op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0,1")
    planner = FakePlanner([[as_offer(promote)]], refuse={"p1"})
    with serve(planner.app) as planner_url:
        a = VllmAdapter(planner_url, "n0", "tok", {("coder", "gpu:0,1"): vllm.url}, poll_interval_s=0.001)
        assert a.step(wait_s=0) == 1
    assert a.reported["p1"].status == "done"
    assert vllm.lines()[0] == "POST /wake_up" and vllm.lines()[-2:] == ["POST /sleep?level=1", "GET /is_sleeping"]  # undone
    assert vllm.asleep == {"weights", "kv_cache"} and vllm.weights_valid


def test_step_refused_kv_move_is_moved_back(lmcache):
    lmcache.kv[(1, 2, 3, 4)] = {("inst0", CPU)}
    demote = op("k1", "demote", ["kv", "p1", "coder"], "host:n0", "nvme:n0")
    planner = FakePlanner([[as_offer(demote)]], refuse={"k1"})
    with serve(planner.app) as planner_url:
        a = LMCacheAdapter(planner_url, "n0", "tok", lmcache.url, tokens_of=lambda p, m: TOKENS[(p, m)],
                           instance_of={"coder": "inst0"}, poll_interval_s=0.001, wait_for_finish=True)
        assert a.step(wait_s=0) == 1
    assert lmcache.lines().count("POST /move") == 2 and lmcache.kv[(1, 2, 3, 4)] == {("inst0", CPU)}


def test_an_engine_file_with_an_api_key_sends_it_to_the_engine_servers(sglang, tmp_path):
    # Servers run with --api-key answer 401 to a request without it.
    import json

    from statebudget.engine_adapters.http import load_engine_file

    path = tmp_path / "engines.json"
    path.write_text(json.dumps({"endpoints": {"coder@gpu:0": sglang.url}, "api_key": "sk-local"}))
    cfg = load_engine_file(path)
    a = SglangAdapter(PLANNER, "n0", "tok", cfg.endpoint_map(), model_paths={}, engine_client=cfg.engine_client())
    assert a.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0")).status == "done"
    assert a.execute(op("p1", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
    assert sglang.engine_auth == ["Bearer sk-local"] * 3  # release, resume, health
    path.write_text(json.dumps({"endpoints": {"coder@gpu:0": sglang.url}}))
    assert load_engine_file(path).engine_client() is None  # the adapter's own client, no header


# ---- inventories of engine servers ----------------------------------------------------------------------

def test_a_vllm_server_that_died_and_came_back_moves_the_engine_generation_and_lists_its_awake_weights(vllm):
    a = vllm_adapter(vllm)
    assert a.engine_generation() == 0
    assert a.held() == [{"object": ["w", "coder"], "tier": "gpu:0,1", "version": None}]
    vllm.dead = True
    assert a.engine_generation() == 0  # down: nothing to announce yet
    vllm.dead = False
    assert a.engine_generation() == 1  # back: it restarted and lost its memory
    assert a.engine_generation() == 1
    vllm.asleep = {"weights", "kv_cache"}
    assert a.held() == []  # an asleep server's host copy is not vouched for


# ---- supervised servers ---------------------------------------------------------------------------------

class StandInSupervisor:
    """The `Supervisor` interface over a server already running in this process: `start` and
    `stop` only record, as the process would start or stop."""

    def __init__(self, url):
        self.url, self.up, self.log, self.asleep = url, False, [], None

    def supervises(self, url):
        return url == self.url

    def running(self, url):
        return self.up

    def start(self, url, budget_s):
        self.up = True
        self.log.append("start")

    def stop(self, url):
        self.up = False
        self.log.append("stop")

    def slept(self, url, asleep):
        self.asleep = asleep

    def check(self):
        return []


def test_vllm_supervised_promote_starts_the_server_drop_stops_it_and_demote_sleeps_it(vllm):
    sup = StandInSupervisor(vllm.url)
    a = vllm_adapter(vllm, supervisor=sup)
    assert a.execute(op("p1", "promote", ["w", "coder"], "nvme:n0", "gpu:0,1")).status == "done"
    assert sup.log == ["start"] and vllm.lines() == []  # a fresh server loads its weights itself
    assert a.execute(op("d1", "demote", ["w", "coder"], "gpu:0,1", "host:n0")).status == "done"
    assert vllm.lines() == ["POST /sleep?level=1", "GET /is_sleeping"] and sup.asleep is True
    vllm.calls.clear()
    assert a.execute(op("p2", "promote", ["w", "coder"], "host:n0", "gpu:0,1")).status == "done"
    assert vllm.lines()[0] == "POST /wake_up" and sup.log == ["start"] and sup.asleep is False
    assert a.execute(op("x1", "drop", ["w", "coder"], "gpu:0,1", "none")).status == "done"
    assert sup.log == ["start", "stop"] and not sup.up
    assert a.engine_generation() == 0  # a server its supervisor stopped is not down


def test_sglang_supervised_promote_starts_the_server_and_drop_stops_it(sglang):
    sup = StandInSupervisor(sglang.url)
    a = sglang_adapter(sglang, supervisor=sup)
    assert a.execute(op("p1", "promote", ["w", "coder"], "nvme:n0", "gpu:0")).status == "done"
    assert sup.log == ["start"] and sglang.lines() == []
    assert a.execute(op("d1", "demote", ["w", "coder"], "gpu:0", "host:n0")).status == "done"
    assert sglang.lines() == ["POST /release_memory_occupation"] and sup.asleep is True
    assert a.execute(op("p2", "promote", ["w", "coder"], "host:n0", "gpu:0")).status == "done"
    assert sup.asleep is False and sup.log == ["start"]
    assert a.execute(op("x1", "drop", ["w", "coder"], "gpu:0", "none")).status == "done"
    assert sup.log == ["start", "stop"] and a.released.get(sglang.url) is None
