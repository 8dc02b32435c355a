"""The reference data plane moves real bytes: content, checksums, capacity and the transaction."""

from __future__ import annotations

import itertools
from collections import Counter
import json

import httpx
import pytest
import torch
from safetensors.torch import load_file

from statebudget.engine_adapters import local
from statebudget.engine_adapters.local import LocalAdapter, LocalDataPlane, checksum, make_bytes, split_sizes
from statebudget.models.plan import Op

MiB = 1 << 20
W = ["w", "coder"]
KV = ["kv", "p1", "coder"]
_ids = itertools.count()


def op(kind, obj, src, dst, nbytes, **kw) -> Op:
    return Op(op_id=kw.pop("op_id", f"op{next(_ids)}"), kind=kind, object=obj, src=src, dst=dst, bytes=nbytes, **kw)


def run(plane, *args, **kw):
    """Execute and commit one op; returns its result."""
    o = op(*args, **kw)
    r = plane.execute(o)
    assert r.status == "done", r.error
    plane.commit(o)
    return r


@pytest.fixture
def plane(tmp_path):
    return LocalDataPlane(tmp_path / "dp", arena_bytes=8 * MiB, use_cuda=False)


def used(plane) -> Counter:
    """Used bytes per tier (0 for a tier not used yet)."""
    return Counter({k: v["used_bytes"] for k, v in plane.health()["tiers"].items()})


# ---- checksum ---------------------------------------------------------------------------------------

def test_checksum_composes_over_shards_and_sees_order_and_flips():
    data = make_bytes(W, 3 * MiB + 5)
    whole = checksum([data])
    for k in (2, 3, 4):
        assert checksum(list(torch.split(data, split_sizes(data.numel(), k)))) == whole
    a, b = torch.split(make_bytes(W, 2 * MiB), MiB)
    assert checksum([b, a]) != checksum([a, b])
    flipped = data.clone()
    flipped[MiB + 17] ^= 0x10
    assert checksum([flipped]) != whole
    assert checksum([data[:-1]]) != whole


def test_split_sizes_are_equal_words_summing_to_the_bytes():
    for n, k in [(1000, 2), (10, 2), (7, 3), (8 * MiB + 3, 4)]:
        sizes = split_sizes(n, k)
        assert sum(sizes) == n and len(sizes) == k
        assert all(s % 8 == 0 for s, after in zip(sizes, sizes[1:]) if after)  # words, but the last
        assert max(sizes) - min(sizes) < 8 * k or n < 8 * k


# ---- moves ---------------------------------------------------------------------------------------

def test_store_created_on_first_need_and_nvme_to_host_copies_real_bytes(plane, tmp_path):
    n = MiB + 3
    o = op("promote", W, "nvme:n0", "host:n0", n)
    r = plane.execute(o)
    assert r.status == "done" and r.bytes == n and r.seconds > 0
    files = list((tmp_path / "dp" / "nvme").glob("*.safetensors"))
    assert len(files) == 1
    on_disk = load_file(files[0])["data"]  # a plain safetensors file
    assert torch.equal(on_disk, make_bytes(W, n))
    assert r.checksum == checksum([on_disk]) == plane.copy_of(W, "nvme:n0").checksum
    assert not plane.ready(W, "host:n0")  # not before the planner's answer
    plane.commit(o)
    assert plane.ready(W, "host:n0") and plane.ready(W, "nvme:n0")  # inclusive: the store keeps its copy
    assert torch.equal(plane.read(W, "host:n0"), make_bytes(W, n))
    assert plane.stats()["nvme->host"]["bytes"] == n
    assert plane.stats()["nvme->host"]["Bps"] > 0


def test_round_trip_nvme_host_arena_host_preserves_content(plane):
    n = 2 * MiB + 11
    run(plane, "promote", W, "nvme:n0", "host:n0", n)
    run(plane, "promote", W, "host:n0", "gpu:0", n)
    assert torch.equal(plane.read(W, "gpu:0"), make_bytes(W, n))
    assert used(plane)["gpu:0"] == n
    run(plane, "drop", W, "host:n0", "none", n)
    assert not plane.ready(W, "host:n0") and used(plane)["host:n0"] == 0
    r = run(plane, "demote", W, "gpu:0", "host:n0", n)
    assert r.bytes == n
    assert plane.where(W) == ["host:n0", "nvme:n0"]
    assert used(plane)["gpu:0"] == 0 and used(plane)["host:n0"] == n
    assert torch.equal(plane.read(W, "host:n0"), make_bytes(W, n))
    assert set(plane.stats()) == {"nvme->host", "host->gpu", "gpu->host"}


def test_demote_to_a_tier_that_still_holds_the_object_moves_nothing(plane):
    n = MiB
    run(plane, "promote", W, "nvme:n0", "host:n0", n)
    run(plane, "promote", W, "host:n0", "gpu:0", n)
    r = run(plane, "demote", W, "gpu:0", "host:n0", n)
    assert r.bytes == 0 and r.checksum == plane.copy_of(W, "host:n0").checksum
    assert not plane.ready(W, "gpu:0") and used(plane)["gpu:0"] == 0


def test_tp_group_holds_two_equal_shards(plane):
    n = 3 * MiB + 5
    run(plane, "promote", W, "nvme:n0", "host:n0", n)
    r = run(plane, "promote", W, "host:n0", "gpu:0,1", n)
    c = plane.copy_of(W, "gpu:0,1")
    sizes = [s.numel() for s in c.shards]
    assert len(sizes) == 2 and sum(sizes) == n and abs(sizes[0] - sizes[1]) < 16
    assert used(plane)["gpu:0"] == sizes[0] and used(plane)["gpu:1"] == sizes[1]
    assert r.checksum == plane.copy_of(W, "host:n0").checksum
    assert torch.equal(plane.read(W, "gpu:0,1"), make_bytes(W, n))
    # from the group back to one GPU: a move, the group's shards are released
    run(plane, "promote", W, "gpu:0,1", "gpu:2", n)
    assert torch.equal(plane.read(W, "gpu:2"), make_bytes(W, n))
    assert used(plane)["gpu:0"] == used(plane)["gpu:1"] == 0


def test_arena_full_fails_clearly_and_leaks_nothing(tmp_path):
    plane = LocalDataPlane(tmp_path, arena_bytes={0: 4 * MiB, 1: MiB}, use_cuda=False)
    run(plane, "promote", W, "nvme:n0", "host:n0", 4 * MiB)
    before = used(plane)
    o = op("promote", W, "host:n0", "gpu:0,1", 4 * MiB)  # 2 MiB a shard: gpu:0 fits, gpu:1 does not
    r = plane.execute(o)
    assert r.status == "failed"
    assert "gpu:1 full" in r.error and str(2 * MiB) in r.error
    assert used(plane) == before
    assert not plane.ready(W, "gpu:0,1") and not plane.pending
    r = plane.execute(op("promote", W, "host:n0", "gpu:7", 4 * MiB))
    assert r.status == "failed" and "no GPU index 7" in r.error


def test_abort_releases_the_target_and_keeps_the_source(plane):
    n = MiB
    run(plane, "promote", W, "nvme:n0", "host:n0", n)
    src_sum = plane.copy_of(W, "host:n0").checksum
    o = op("promote", W, "host:n0", "gpu:0", n)
    assert plane.execute(o).status == "done"
    assert used(plane)["gpu:0"] == n and not plane.ready(W, "gpu:0")
    plane.abort(o)
    assert used(plane)["gpu:0"] == 0 and not plane.ready(W, "gpu:0") and not plane.pending
    assert plane.ready(W, "host:n0") and plane.copy_of(W, "host:n0").checksum == src_sum
    assert torch.equal(plane.read(W, "host:n0"), make_bytes(W, n))


def test_commit_of_a_demote_releases_the_source(plane):
    n = MiB + 1
    run(plane, "promote", KV, "none", "gpu:0", n)  # a simulated prefill
    assert torch.equal(plane.read(KV, "gpu:0"), make_bytes(KV, n))
    o = op("demote", KV, "gpu:0", "host:n0", n)
    assert plane.execute(o).status == "done"
    assert plane.ready(KV, "gpu:0") and not plane.ready(KV, "host:n0")  # before commit: source still the copy
    plane.commit(o)
    assert not plane.ready(KV, "gpu:0") and used(plane)["gpu:0"] == 0
    assert torch.equal(plane.read(KV, "host:n0"), make_bytes(KV, n))


def test_demote_to_nvme_writes_a_file_only_visible_after_commit(plane, tmp_path):
    n = MiB
    run(plane, "promote", KV, "none", "host:n0", n)
    o = op("demote", KV, "host:n0", "nvme:n0", n)
    assert plane.execute(o).status == "done"
    nvme = tmp_path / "dp" / "nvme"
    assert [p.name.endswith(".pending.safetensors") for p in nvme.iterdir()] == [True]
    plane.abort(o)
    assert list(nvme.iterdir()) == [] and used(plane)["nvme:n0"] == 0 and plane.ready(KV, "host:n0")
    o = op("demote", KV, "host:n0", "nvme:n0", n)
    assert plane.execute(o).status == "done"
    plane.commit(o)
    [f] = nvme.iterdir()
    assert not f.name.endswith(".pending.safetensors")
    assert torch.equal(load_file(f)["data"], make_bytes(KV, n))
    assert not plane.ready(KV, "host:n0") and used(plane) == Counter({"nvme:n0": n})
    # a restarted data plane finds its NVMe copies again
    again = LocalDataPlane(tmp_path / "dp", use_cuda=False)
    assert again.ready(KV, "nvme:n0") and again.copy_of(KV, "nvme:n0").checksum == plane.copy_of(KV, "nvme:n0").checksum
    run(again, "promote", KV, "nvme:n0", "gpu:0", n)
    assert torch.equal(again.read(KV, "gpu:0"), make_bytes(KV, n))


def test_drop_to_none_releases_and_recompute_is_deterministic(plane, tmp_path):
    n = MiB
    r1 = run(plane, "promote", KV, "none", "gpu:0", n)
    run(plane, "drop", KV, "gpu:0", "none", n)
    assert plane.where(KV) == [] and used(plane)["gpu:0"] == 0
    other = LocalDataPlane(tmp_path / "other", use_cuda=False)
    r2 = run(other, "promote", KV, "none", "gpu:3", n)
    assert r1.checksum == r2.checksum
    r3 = run(plane, "drop", KV, "host:n0", "none", n)  # nothing there: already dropped
    assert r3.bytes == 0


def test_corrupted_copy_is_caught_by_the_checksum(plane, monkeypatch):
    n = MiB
    run(plane, "promote", W, "nvme:n0", "host:n0", n)
    real = local.copy_ranges

    def flip_a_byte(src, dst):
        real(src, dst)
        dst[-1][dst[-1].numel() // 2] ^= 1

    monkeypatch.setattr(local.plane, "copy_ranges", flip_a_byte)
    before = used(plane)
    r = plane.execute(op("promote", W, "host:n0", "gpu:0", n))
    assert r.status == "failed" and "checksum mismatch" in r.error
    assert used(plane) == before and not plane.ready(W, "gpu:0") and not plane.pending


def test_corrupted_file_is_caught_by_reading_it_back(plane, monkeypatch, tmp_path):
    n = MiB
    run(plane, "promote", KV, "none", "host:n0", n)
    real = local.write_safetensors

    def flip_on_disk(path, data, metadata, fsync=False):
        real(path, data, metadata, fsync)
        with open(path, "r+b") as f:
            f.seek(-100, 2)
            b = f.read(1)
            f.seek(-100, 2)
            f.write(bytes([b[0] ^ 0xFF]))

    monkeypatch.setattr(local.plane, "write_safetensors", flip_on_disk)
    r = plane.execute(op("demote", KV, "host:n0", "nvme:n0", n))
    assert r.status == "failed" and "checksum mismatch" in r.error
    assert list((tmp_path / "dp" / "nvme").iterdir()) == [] and used(plane)["nvme:n0"] == 0
    assert torch.equal(plane.read(KV, "host:n0"), make_bytes(KV, n))


def test_bad_ops_fail_with_a_reason(plane):
    cases = [
        (op("promote", KV, "host:n0", "gpu:0", MiB), "no ready copy"),
        (op("promote", W, "nvme:n9", "host:n9", MiB), "serves node 'n0'"),
        (op("promote", W, "none", "gpu:0", MiB), "model store"),
        (op("promote", W, "disk:n0", "gpu:0", MiB), "unknown tier"),
    ]
    for o, why in cases:
        r = plane.execute(o)
        assert r.status == "failed" and why in r.error, r.error
    assert not plane.pending and used(plane)["gpu:0"] == 0


def test_bytes_scale_shrinks_new_objects(tmp_path):
    plane = LocalDataPlane(tmp_path, bytes_scale=1e-3, use_cuda=False)
    r = run(plane, "promote", W, "nvme:n0", "gpu:0", 16e9)
    assert r.bytes == 16_000_000 and plane.copy_of(W, "gpu:0").nbytes == 16_000_000


# ---- the adapter over the planner protocol ---------------------------------------------------------

def test_adapter_commits_on_200_and_aborts_on_409(tmp_path):
    ops = [op("promote", KV, "none", "gpu:0", MiB, op_id="a"), op("promote", ["kv", "p2", "coder"], "none", "gpu:0", MiB, op_id="b")]
    posted = []

    def planner(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"version": 1, "ops": [o.model_dump() for o in ops]})
        body = json.loads(request.content)
        posted.append((request.url.path, body))
        return httpx.Response(200 if request.url.path.endswith("/a") else 409, json={})

    client = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(planner))
    ad = LocalAdapter("http://planner", "n0", "t", client=client, root=tmp_path, use_cuda=False)
    assert ad.step(0) == 2
    assert ad.plane.ready(KV, "gpu:0") and not ad.plane.ready(["kv", "p2", "coder"], "gpu:0")
    assert ad.plane.health()["tiers"]["gpu:0"]["used_bytes"] == MiB and not ad.plane.pending
    assert [b["status"] for _, b in posted] == ["done", "done"]
    assert posted[0][1]["checksum"] == checksum([make_bytes(KV, MiB)])
    assert ad.step(0) == 0  # offered again: reported again, not executed twice
    assert ad.executed == ["a", "b"] and len(posted) == 4
    h = ad.health()
    assert h["kind"] == "local" and h["device"] == "arena" and h["copies"] == {"gpu:0": 1}


def test_stocking_a_store_larger_than_the_free_disk_refuses_before_writing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from statebudget.models.load import load_catalog

    cat = load_catalog("agent-team")  # 439 GB at full size
    plane = LocalDataPlane(tmp_path / "n0", node="n0")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, 50 * 10**9))
    with pytest.raises(local.DataPlaneError, match="needs 439.3 GB.*50.0 GB free"):
        plane.stock(cat)
    assert not any(plane.nvme_dir.rglob("*.safetensors"))  # nothing written
    small = LocalDataPlane(tmp_path / "n1", node="n1", bytes_scale=1e-4)  # 44 MB: fits
    assert small.stock(cat) == sum(1 + (m.moe.pages if m.moe else 0) for m in cat.models)


def test_an_adapter_whose_token_the_planner_keeps_refusing_stops_and_says_why(tmp_path, monkeypatch):
    # 401/403 that last REFUSED_GRACE_S stop the adapter with what to do, instead of retrying
    # forever as it does while the planner is away; a shorter refusal (a token file being
    # rewritten, a planner restarting) is retried. A fake clock: sleeping moves it.
    from statebudget.engine_adapters import base

    clock = {"t": 0.0}
    monkeypatch.setattr(base.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(base.time, "sleep", lambda s: clock.__setitem__("t", clock["t"] + s))
    answers = [httpx.Response(401, json={"detail": "unknown bearer token"}), httpx.Response(503, json={}),
               httpx.Response(200, json={"version": 0, "ops": []})]
    seen = []

    def planner(request: httpx.Request) -> httpx.Response:
        seen.append(clock["t"])
        return answers.pop(0) if answers else httpx.Response(403, json={"detail": "token is for node n1"})

    client = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(planner))
    ad = LocalAdapter("http://planner", "n0", "t", client=client, root=tmp_path, use_cuda=False)
    with pytest.raises(PermissionError, match=r"refused node n0's token \(403: .*token is for node n1.*--role adapter --node n0"):
        ad.run(wait_s=0)
    first_403 = seen[3]  # after the 401, the 503 and the poll that went through
    assert seen[-1] - first_403 >= base.REFUSED_GRACE_S > seen[-2] - first_403  # stopped once the grace ran out


# ---- inventories -----------------------------------------------------------------------------------

def test_an_announce_after_a_lost_answer_undoes_the_unanswered_target_and_drops_what_the_planner_refuses(tmp_path):
    seen = []

    def planner(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "GET":
            return httpx.Response(200, json={"version": 1, "ops": [op("promote", KV, "none", "host:n0", MiB, op_id="a").model_dump()]})
        if request.method == "POST":
            raise httpx.ReadError("the planner went away")
        body = json.loads(request.content)
        assert body["node"] == "n0" and body["reason"] == "engine restarted"
        return httpx.Response(200, json={"drop": [{"object": c["object"], "tier": c["tier"]} for c in body["copies"]]})

    client = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(planner))
    ad = LocalAdapter("http://planner", "n0", "t", client=client, root=tmp_path, use_cuda=False)
    with pytest.raises(httpx.ReadError):
        ad.step(0)
    assert ad.plane.pending and ad.plane.host_pool.used == MiB  # executed, its answer lost
    extra = ad.plane.store(["w", "coder"], MiB)  # a copy in the model store: not in the inventory
    ad.plane.copies[(("kv", "p9", "coder"), "gpu:0")] = ad.plane._alloc(("kv", "p9", "coder"), "gpu:0", MiB, "x")
    assert {c["tier"] for c in ad.plane.held()} == {"gpu:0"}  # HBM and host only, ready copies only
    ad.announce("engine restarted")
    assert not ad.plane.pending and ad.plane.host_pool.used == 0  # the unanswered target is undone
    assert not ad.plane.ready(["kv", "p9", "coder"], "gpu:0") and ad.plane.ready(["w", "coder"], extra.tier)
    assert ad.version == 0 and ("PUT", "/v1/inventory") in seen


def test_an_adapter_goes_on_without_reconciliation_against_a_planner_that_takes_no_inventory(tmp_path):
    def planner(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json={"version": 0, "ops": []})

    client = httpx.Client(base_url="http://planner", transport=httpx.MockTransport(planner))
    ad = LocalAdapter("http://planner", "n0", "t", client=client, root=tmp_path, use_cuda=False)
    steps = []
    ad.run(stop=lambda: len(steps) >= 2, wait_s=0, on_step=steps.append)
    assert steps == [0, 0]  # it polled on, instead of retrying the inventory for ever


def test_losing_the_gpus_frees_every_hbm_copy_and_moves_the_generation(tmp_path):
    plane = LocalDataPlane(tmp_path, node="n0", arena_bytes=8 * MiB, use_cuda=False)
    for i, o in enumerate((op("promote", KV, "none", "gpu:0", MiB, op_id="a"),
                           op("promote", ["kv", "p2", "coder"], "none", "host:n0", MiB, op_id="b"))):
        assert plane.execute(o).status == "done"
        plane.commit(o)
    pending = op("promote", ["kv", "p3", "coder"], "none", "gpu:0", MiB, op_id="c")
    plane.execute(pending)
    assert plane.lose_gpus() == 1 and plane.generation == 1
    assert plane.gpu_pools[0].used == 0 and "c" not in plane.pending
    assert [c["tier"] for c in plane.held()] == ["host:n0"]
