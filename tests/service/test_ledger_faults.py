"""Memory follows the ledger: a write SQLite refuses (here a real SQLITE_FULL, from a page limit
set to what the file holds) is rolled back, the books are rebuilt from disk, the caller hears 503,
and once the disk is freed the same request is taken, and a restart keeps it."""


import pytest

from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.errors import Unavailable
from statebudget.service.ledger import LedgerError, Store
from statebudget.service.live import LivePlanner


def planner(db):
    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db))


def fill_disk(store: Store) -> None:
    """No page beyond those the file has: the next write that needs room fails as on a full disk."""
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")


def free_disk(store: Store) -> None:
    store.db.execute("PRAGMA max_page_count = 1073741823")


def test_a_full_ledger_refuses_with_503_keeps_memory_as_on_disk_and_recovers(tmp_path):
    p = planner(tmp_path / "sb.db")
    p.event("a", {"type": "program_started", "program": "p0"})
    before = (sorted(p.programs), p.plan_version, dict(p.kv_tokens), len(p.ops))
    fill_disk(p.store)
    big = "x" * 3000  # a tool result: the program's row no longer fits in the pages there are
    with pytest.raises(Unavailable, match="full"):
        for i in range(50):
            p.event("a", {"type": "program_started", "program": f"p{i + 1}-{big[:150]}"})
    assert p.ledger_error is not None and "full" in p.ledger_error
    on_disk = sorted(r["program"] for r in p.store.programs())
    assert sorted(p.programs) == on_disk  # nothing acknowledged or held that is not on disk
    refused = next(f"p{i + 1}-{big[:150]}" for i in range(50) if f"p{i + 1}-{big[:150]}" not in p.programs)
    assert p.tick() == 0 and p.ledger_error is not None  # still full: the probe says so, no step
    free_disk(p.store)
    p.tick()
    assert p.ledger_error is None
    out = p.event("a", {"type": "program_started", "program": refused})  # the retry is new, not a repeat
    assert out.status == "running"
    p.store.close()
    q = planner(tmp_path / "sb.db")
    assert refused in q.programs and before[0][0] in q.programs


def test_a_lease_refused_by_a_full_ledger_leaves_no_op_and_no_copy(tmp_path):
    p = planner(tmp_path / "sb.db")
    p.event("a", {"type": "program_started", "program": "p1"})
    fill_disk(p.store)
    with pytest.raises(Unavailable):
        for _ in range(20):  # each accepted lease writes ops and copies until a page is needed
            p.submit_lease("a", {"program": "p1", "model": "planner", "deadline_s": 60, "for_call": "c" * 150})
    ops_on_disk = {r["op_id"] for r in p.store.ops("open")}
    assert set(p.ops) == ops_on_disk
    copies_on_disk = {(tuple(r["key"]), r["tier"]) for r in p.store.copies()}
    from statebudget.service.journal import gpu_tier
    assert {(k, gpu_tier(g)) for (k, g) in p.tiers.gpu} <= copies_on_disk
    assert sum(p.tiers.hbm_used) == pytest.approx(sum(r["bytes"] for r in p.store.copies() if r["tier"].startswith("gpu")))


def test_a_failed_commit_rolls_back_and_raises_ledger_error(tmp_path):
    s = Store(tmp_path / "x.db")
    with s.tx():
        s.set_meta("a", 1)
    fill_disk(s)
    with pytest.raises(LedgerError):
        with s.tx():
            for i in range(100):
                s.set_meta(f"k{i}", "y" * 2000)
    assert not s.db.in_transaction and s.get_meta("k0") is None and s.get_meta("a") == 1
    free_disk(s)
    with s.tx():
        s.set_meta("k0", 2)
    assert s.get_meta("k0") == 2


def test_full_synchronous_is_the_default_and_normal_can_be_chosen(tmp_path):
    assert Store(tmp_path / "a.db").db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert Store(tmp_path / "b.db", synchronous="normal").db.execute("PRAGMA synchronous").fetchone()[0] == 1
    with pytest.raises(ValueError, match="synchronous"):
        Store(tmp_path / "c.db", synchronous="off")


class Counting:
    """Telemetry that counts each hook by name."""

    def __init__(self):
        from collections import Counter
        self.n = Counter()

    def __getattr__(self, name):
        return lambda *a, **k: self.n.update([name])


def test_a_request_the_ledger_refuses_counts_nothing_and_its_retry_counts_once(tmp_path):
    p = planner(tmp_path / "sb.db")
    p.telemetry = Counting()
    p.event("a", {"type": "program_started", "program": "p" * 190})
    fill_disk(p.store)
    with pytest.raises(Unavailable):
        for i in range(30):  # program rows until one needs a page
            p.event("a", {"type": "program_started", "program": f"{'q' * 190}{i}"})
    refused = next(f"{'q' * 190}{i}" for i in range(30) if f"{'q' * 190}{i}" not in p.programs)
    with pytest.raises(Unavailable):
        p.event("a", {"type": "program_cancelled", "program": "p" * 190})
    assert p.telemetry.n["program_ended"] == 0  # held back, then dropped with the rollback
    free_disk(p.store)
    p.event("a", {"type": "program_cancelled", "program": "p" * 190})
    p.event("a", {"type": "program_started", "program": refused})
    assert p.telemetry.n["program_ended"] == 1


def test_while_the_ledger_refuses_writes_requests_are_refused_before_touching_memory(tmp_path, monkeypatch):
    p = planner(tmp_path / "sb.db")
    fill_disk(p.store)
    rebuilds = []
    real = p._rebuild
    monkeypatch.setattr(p, "_rebuild", lambda err: (rebuilds.append(err), real(err)))
    with pytest.raises(Unavailable):
        for i in range(30):
            p.event("a", {"type": "program_started", "program": f"{'q' * 190}{i}"})
    for i in range(20):  # the probe refuses them: no rebuild of the books each time
        with pytest.raises(Unavailable):
            p.event("a", {"type": "program_started", "program": f"again{i}"})
    assert len(rebuilds) == 1


def test_a_cluster_change_the_ledger_refuses_leaves_the_old_cluster_in_memory(tmp_path):
    p = planner(tmp_path / "sb.db")
    fill_disk(p.store)
    with pytest.raises(LedgerError):  # every free page taken, so the bigger cluster cannot be written
        for i in range(10_000):
            with p.store.tx():
                p.store.set_meta(f"filler{i}", "z" * 500)
    big, cat = load_cluster("hetero16"), load_catalog("agent-team")
    with pytest.raises(Unavailable):
        p.set_cluster(big.model_dump(mode="json"), cat.model_dump(mode="json"))
    assert p.cluster.name == "toy2" and len(p.gpus) == 2 and p.catalog.name == load_catalog("toy").name
