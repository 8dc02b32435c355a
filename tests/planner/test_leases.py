"""The HandoffLease state machine: every transition, and that a cancelled or stale
lease never publishes state."""

import pytest

from statebudget.planner.leases import LeaseLedger, LeaseRequest, LeaseState, Quote, UnknownLease, decide, rank_key

W, KV = ("w", "coder"), ("kv", "p1", "coder")


def req(deadline=10.0, conf=0.9, kv=100, token="p1/n3"):
    return LeaseRequest(program="p1", tenant="t", model="coder", version="v1", deadline_s=deadline,
                        confidence=conf, cancel_token=token, kv_version=kv, for_call="n3")


def quote(p95=2.0, w95=1.0, objects=(W, KV), nbytes=1e9, stall=2.0):
    return Quote(p50_s=p95 / 2, p95_s=p95, weights_p95_s=w95, bytes=nbytes, stall_saved_s=stall, objects=objects)


def accepted(ledger=None, **kw):
    ledger = ledger or LeaseLedger()
    lease = ledger.submit(req(**kw), quote(), LeaseState.ACCEPTED, now=0.0)
    return ledger, lease


def test_admission_by_p95_against_the_deadline_and_budget():
    assert decide(req(deadline=10), quote(p95=2), now=0, budget_ok=True) == LeaseState.ACCEPTED
    assert decide(req(deadline=10), quote(p95=2), now=0, budget_ok=False) == LeaseState.REJECTED
    # P95 too late with the KV, in time without it: prepare the weights only.
    assert decide(req(deadline=3), quote(p95=5, w95=2), now=0, budget_ok=True) == LeaseState.PARTIAL
    assert decide(req(deadline=3, kv=None), quote(p95=5, w95=2), now=0, budget_ok=True) == LeaseState.REJECTED
    assert decide(req(deadline=1), quote(p95=5, w95=2), now=0, budget_ok=True) == LeaseState.REJECTED
    assert decide(req(deadline=10), quote(p95=2), now=11, budget_ok=True) == LeaseState.REJECTED


def test_ranking_is_lateness_loss_minus_cancellation_risk_not_size():
    sure_small = rank_key(req(conf=0.95), quote(nbytes=1e9, stall=1.0), link_gbps=25)
    unsure_big = rank_key(req(conf=0.3), quote(nbytes=100e9, stall=5.0), link_gbps=25)
    sure_big = rank_key(req(conf=0.95), quote(nbytes=100e9, stall=5.0), link_gbps=25)
    assert sure_big > sure_small > unsure_big


def test_accepted_transfers_then_ready_then_consumed():
    ledger, lease = accepted()
    assert ledger.begin(lease.lease_id, W) and ledger.begin(lease.lease_id, KV)
    assert lease.state == LeaseState.TRANSFERRING
    assert ledger.commit(lease.lease_id, W, "v1", now=1.0)
    assert lease.state == LeaseState.TRANSFERRING  # the KV is not there yet
    assert ledger.commit(lease.lease_id, KV, 100, now=1.5)
    assert lease.state == LeaseState.READY and lease.ready_s == 1.5
    assert ledger.consume(lease.lease_id, now=2.0)
    assert lease.state == LeaseState.CONSUMED
    assert not ledger.consume(lease.lease_id, now=2.0)


def test_partial_lease_prepares_weights_only():
    ledger = LeaseLedger()
    lease = ledger.submit(req(), quote(), LeaseState.PARTIAL, now=0.0)
    assert set(lease.objects) == {W}
    assert lease.decision == "partial"
    ledger.begin(lease.lease_id, W)
    assert ledger.commit(lease.lease_id, W, "v1", now=1.0)
    assert lease.state == LeaseState.READY


def test_cancel_during_transfer_stops_it_and_refuses_the_commit():
    ledger, lease = accepted()
    ledger.begin(lease.lease_id, W)
    ledger.commit(lease.lease_id, W, "v1", now=0.5)
    ledger.begin(lease.lease_id, KV)
    stopped = ledger.cancel_token("p1/n3", now=1.0)
    assert stopped == [(lease.lease_id, [KV])]
    assert lease.state == LeaseState.CANCELLED
    assert not ledger.commit(lease.lease_id, KV, 100, now=1.2)  # never published
    assert lease.state == LeaseState.CANCELLED and lease.ready_s is None


def test_version_change_during_transfer_makes_it_stale():
    ledger, lease = accepted()
    ledger.begin(lease.lease_id, KV)
    assert ledger.version_changed(KV, 100, now=0.5) == []  # same version: nothing happens
    stopped = ledger.version_changed(KV, 140, now=1.0)
    assert stopped == [(lease.lease_id, [W, KV])]
    assert lease.state == LeaseState.STALE
    assert not ledger.commit(lease.lease_id, KV, 100, now=1.2)


def test_commit_at_another_version_is_refused_and_stales_the_lease():
    ledger, lease = accepted()
    ledger.begin(lease.lease_id, KV)
    assert not ledger.commit(lease.lease_id, KV, 99, now=1.0)
    assert lease.state == LeaseState.STALE


def test_deadline_miss_falls_back():
    ledger, lease = accepted(deadline=5.0)
    ledger.begin(lease.lease_id, W)
    assert ledger.expire(now=4.0) == []
    assert ledger.expire(now=5.5) == [lease.lease_id]
    assert lease.state == LeaseState.EXPIRED
    assert not ledger.commit(lease.lease_id, W, "v1", now=6.0)
    # A lease that was ready in time does not expire.
    ledger2, ready = accepted(deadline=5.0)
    for k in (W, KV):
        ledger2.begin(ready.lease_id, k)
    ledger2.commit(ready.lease_id, W, "v1", 1.0)
    ledger2.commit(ready.lease_id, KV, 100, 1.0)
    assert ledger2.expire(now=9.0) == [] and ready.state == LeaseState.READY


def test_double_cancel_is_a_no_op():
    ledger, lease = accepted()
    assert ledger.cancel(lease.lease_id, now=1.0) == [W, KV]
    assert ledger.cancel(lease.lease_id, now=2.0) == []
    assert ledger.cancel_token("p1/n3", now=3.0) == []
    assert lease.state == LeaseState.CANCELLED


def test_unknown_lease():
    ledger = LeaseLedger()
    with pytest.raises(UnknownLease):
        ledger.cancel("L404", now=0.0)
    with pytest.raises(UnknownLease):
        ledger.commit("L404", W, "v1", now=0.0)


def test_rejected_lease_holds_nothing():
    ledger = LeaseLedger()
    lease = ledger.submit(req(), quote(), LeaseState.REJECTED, now=0.0)
    assert lease.decision == "rejected" and lease.objects == {}
    assert not ledger.begin(lease.lease_id, W)
    assert ledger.live_for(W) == [] and not ledger.held(W)


def test_ended_leases_release_their_index_entries():
    ledger, a = accepted(token="t1")
    _, b = accepted(ledger, token="t2")
    assert {l.lease_id for l in ledger.live_for(W)} == {a.lease_id, b.lease_id}
    assert ledger.held(W) and ledger.held(KV)
    ledger.cancel(a.lease_id, 1.0)
    assert ledger.held(W)  # b still holds it
    ledger.version_changed(KV, 7, 1.0)
    assert ledger.live_for(W) == [] and ledger.live_for(KV) == []
    assert not ledger.held(W) and not ledger.held(KV)
    assert ledger.counts() == {"cancelled": 1, "stale": 1}
