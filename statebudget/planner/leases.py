"""HandoffLease (seed 000 §3): a revocable hint from the agent runtime that names a target model
(and the program's KV), the state version, the earliest use, a must-be-ready deadline, a
confidence and a cancel token.

    submit ─▶ quote (P50/P95 ready time from the cost model and the link queues)
           ─▶ accepted | partial (weights only) | rejected
    accepted/partial ─▶ transferring ─▶ ready (every object committed at the lease's version)
                                     ─▶ consumed (the call used it)
    any live state ─▶ cancelled (cancel token)   — transfers stop, reservations are freed
                   ─▶ stale (a version changed)  — same; nothing of the old version is published
                   ─▶ expired (deadline passed before ready) — the synchronous path takes over

    time ──────────────────────────────────────────────────────────▶
          submit      earliest                    deadline
            │   quote    │◀── transfer (P50 .. P95) ──▶│ ready ≤ deadline, or fall back

The ledger is a plain object: the simulator's policy and the service share it. It records states
and answers what to stop; it moves no bytes. A commit is accepted only from a live lease and with
the version the lease was made for, so a cancelled or stale lease never publishes state.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum


class LeaseState(IntEnum):
    SUBMITTED = 0
    ACCEPTED = 1
    PARTIAL = 2
    TRANSFERRING = 3
    READY = 4
    CONSUMED = 5
    REJECTED = 6
    CANCELLED = 7
    STALE = 8
    EXPIRED = 9

    @property
    def live(self) -> bool:
        """Holds reservations and may still publish."""
        return self in (LeaseState.ACCEPTED, LeaseState.PARTIAL, LeaseState.TRANSFERRING, LeaseState.READY)

    @property
    def terminal(self) -> bool:
        return self >= LeaseState.CONSUMED


class UnknownLease(KeyError):
    """No lease has that id (the service answers 404)."""


@dataclass(frozen=True)
class LeaseRequest:
    program: str
    tenant: str
    model: str
    version: str            # the model's version (weights)
    deadline_s: float       # absolute time by which the state must be ready
    confidence: float
    cancel_token: str
    earliest_s: float = 0.0
    kv_version: int | None = None  # the program KV's version (token count) to prepare, if any
    for_call: str | None = None


@dataclass(frozen=True)
class Quote:
    """Ready-time estimate (seconds from now) and what it would move."""
    p50_s: float
    p95_s: float
    weights_p95_s: float    # the weights (and pages) alone, for a partial lease
    bytes: float
    stall_saved_s: float    # the restore the call would wait for without the lease
    objects: tuple = ()     # state keys to prepare


@dataclass
class Lease:
    lease_id: str
    request: LeaseRequest
    state: LeaseState
    quote: Quote
    created_s: float
    objects: dict = field(default_factory=dict)  # key -> "pending" | "moving" | "done" | "stopped"
    ready_s: float | None = None
    ended_s: float | None = None
    reason: str = ""
    retry_after_s: float | None = None  # rejected past capacity (`overload.py`): ask again after this

    @property
    def decision(self) -> str:
        if self.state == LeaseState.REJECTED:
            return "rejected"
        return "partial" if self.state == LeaseState.PARTIAL or self.reason == "partial" else "accepted"


def rank_key(req: LeaseRequest, quote: Quote, link_gbps: float) -> float:
    """Competing leases go by expected lateness loss minus cancellation risk (seed 000 §3), not by
    size or history: confidence x the stall it saves, less (1 - confidence) x the link time its
    bytes would waste if the branch is abandoned."""
    waste_s = quote.bytes / (link_gbps * 1e9) if link_gbps > 0 else 0.0
    return req.confidence * quote.stall_saved_s - (1.0 - req.confidence) * waste_s


def decide(req: LeaseRequest, quote: Quote, now: float, budget_ok: bool) -> LeaseState:
    """Admit only if the P95 completion is before the deadline and the background bandwidth
    budget leaves the SLO margin; if only the weights make it, admit them alone (partial)."""
    window = req.deadline_s - now
    if not budget_ok or window <= 0:
        return LeaseState.REJECTED
    if quote.p95_s <= window:
        return LeaseState.ACCEPTED
    if req.kv_version is not None and quote.weights_p95_s <= window:
        return LeaseState.PARTIAL
    return LeaseState.REJECTED


def rejection_reason(req: LeaseRequest, quote: Quote, now: float, budget_ok: bool) -> str:
    """Why `decide` rejected a lease, in words a runtime can log."""
    window = req.deadline_s - now
    if window <= 0:
        return f"the deadline passed {-window:.1f} s ago"
    if quote.p95_s > window:
        return f"quoted P95 ready in {quote.p95_s:.1f} s, after the deadline in {window:.1f} s"
    return "the links cannot carry it by the deadline and keep the SLO margin for calls without a lease"


class LeaseLedger:
    def __init__(self):
        self.leases: dict[str, Lease] = {}
        self._by_token: dict[str, set[str]] = {}
        self._by_object: dict[tuple, set[str]] = {}
        self._ids = itertools.count(1)
        self.new_id = None  # a callable for lease ids (the service: random ones); else L1, L2, ...
        self.changed: set[str] = set()  # ids of leases changed since the owner last persisted them
        self.on_end = lambda lease: None  # told of each lease once, as it ends (the service counts outcomes)

    # ---- submit ---------------------------------------------------------------------------------
    def submit(self, req: LeaseRequest, quote: Quote, state: LeaseState, now: float) -> Lease:
        assert state in (LeaseState.ACCEPTED, LeaseState.PARTIAL, LeaseState.REJECTED)
        lease = Lease(self.new_id() if self.new_id else f"L{next(self._ids)}", req, state, quote, now)
        if state == LeaseState.PARTIAL:
            lease.reason = "partial"
        self._index(lease)
        if state.live:
            keys = quote.objects if state == LeaseState.ACCEPTED else tuple(k for k in quote.objects if k[0] != "kv")
            lease.objects = {k: "pending" for k in keys}
            self._index(lease)
            if not keys:
                self._ready(lease, now)
        else:
            self.on_end(lease)  # rejected at submit: it ends here
        return lease

    def restore(self, lease: Lease) -> None:
        """Put back a lease read from durable storage (a restart): same id, state and objects."""
        self._index(lease)
        n = int(lease.lease_id[1:]) if lease.lease_id[1:].isdigit() else 0
        if n >= self._peek_id():
            self._ids = itertools.count(n + 1)

    def _peek_id(self) -> int:
        n = next(self._ids)
        self._ids = itertools.count(n)
        return n

    def _index(self, lease: Lease) -> None:
        self.leases[lease.lease_id] = lease
        self.changed.add(lease.lease_id)
        if lease.state.live:
            self._by_token.setdefault(lease.request.cancel_token, set()).add(lease.lease_id)
            for k in lease.objects:
                self._by_object.setdefault(k, set()).add(lease.lease_id)

    def get(self, lease_id: str) -> Lease:
        try:
            return self.leases[lease_id]
        except KeyError:
            raise UnknownLease(lease_id) from None

    # ---- transfers ------------------------------------------------------------------------------
    def begin(self, lease_id: str, key) -> bool:
        """An op for one of the lease's objects started. False if the lease is no longer live."""
        lease = self.get(lease_id)
        if not lease.state.live or key not in lease.objects:
            return False
        lease.objects[key] = "moving"
        self.changed.add(lease_id)
        if lease.state in (LeaseState.ACCEPTED, LeaseState.PARTIAL):
            lease.state = LeaseState.TRANSFERRING
        return True

    def commit(self, lease_id: str, key, version, now: float) -> bool:
        """An object's copy is whole and verified. It is published only if the lease is live and
        the version is the one the lease was made for; otherwise the commit is refused (and a
        version mismatch makes the lease stale)."""
        lease = self.get(lease_id)
        if not lease.state.live or key not in lease.objects or lease.objects[key] == "stopped":
            return False
        if version != self._expected_version(lease, key):
            self._end(lease, LeaseState.STALE, now, f"{key} committed at version {version!r}")
            return False
        lease.objects[key] = "done"
        self.changed.add(lease_id)
        if all(v == "done" for v in lease.objects.values()):
            self._ready(lease, now)
        return True

    def _expected_version(self, lease: Lease, key):
        return lease.request.kv_version if key[0] == "kv" else lease.request.version

    def _ready(self, lease: Lease, now: float) -> None:
        lease.state = LeaseState.READY
        lease.ready_s = now
        self.changed.add(lease.lease_id)

    def consume(self, lease_id: str, now: float) -> bool:
        """The call the lease prepared for has started using its state."""
        lease = self.get(lease_id)
        if lease.state != LeaseState.READY:
            return False
        self._end(lease, LeaseState.CONSUMED, now, "")
        return True

    # ---- revocation ----------------------------------------------------------------------------
    def cancel(self, lease_id: str, now: float, reason: str = "cancelled") -> list:
        """Cancel one lease; returns the objects whose transfers must stop (none if it was already
        over: a second cancel is a no-op)."""
        lease = self.get(lease_id)
        if not lease.state.live:
            return []
        return self._end(lease, LeaseState.CANCELLED, now, reason)

    def refuse(self, lease_id: str, now: float, reason: str) -> list:
        """An admitted lease the mechanism could not start (no room): it ends rejected, with the
        reason, and its objects' transfers stop."""
        lease = self.get(lease_id)
        if not lease.state.live:
            return []
        return self._end(lease, LeaseState.REJECTED, now, reason)

    def lose(self, lease_id: str, now: float, reason: str) -> list:
        """A live lease whose prepared state was lost (its engine or adapter restarted): stale."""
        lease = self.get(lease_id)
        if not lease.state.live:
            return []
        return self._end(lease, LeaseState.STALE, now, reason)

    def forget(self, lease_id: str) -> None:
        """An ended lease leaves the ledger (compaction)."""
        lease = self.leases.pop(lease_id, None)
        assert lease is None or not lease.state.live, "only an ended lease is forgotten"
        self.changed.discard(lease_id)

    def cancel_token(self, token: str, now: float, program: str | None = None) -> list[tuple[str, list]]:
        """Cancel every live lease holding `token` (of `program` only, if given: a token made of a
        program and a call id could be another program's too): [(lease_id, objects to stop)]."""
        out = []
        for lid in sorted(self._by_token.get(token, ())):
            if program is not None and self.leases[lid].request.program != program:
                continue
            stop = self.cancel(lid, now, f"token {token}")
            out.append((lid, stop))
        return out

    def version_changed(self, key, version, now: float) -> list[tuple[str, list]]:
        """A state object changed version: live leases made for another version go stale."""
        out = []
        for lid in sorted(self._by_object.get(key, ())):
            lease = self.leases[lid]
            if lease.state.live and self._expected_version(lease, key) != version:
                out.append((lid, self._end(lease, LeaseState.STALE, now, f"{key} is now version {version!r}")))
        return out

    def expire(self, now: float) -> list[str]:
        """Leases past their deadline and not ready: the synchronous path takes over (their
        transfers may go on, but the lease no longer holds them)."""
        out = []
        for lid in sorted(set().union(*self._by_token.values())):  # the live leases
            lease = self.leases[lid]
            if lease.state.live and lease.state != LeaseState.READY and now > lease.request.deadline_s:
                self._end(lease, LeaseState.EXPIRED, now, "deadline passed before ready")
                out.append(lid)
        return out

    def _end(self, lease: Lease, state: LeaseState, now: float, reason: str) -> list:
        stop = [k for k, v in lease.objects.items() if v in ("pending", "moving")]
        for k in lease.objects:
            if lease.objects[k] != "done":
                lease.objects[k] = "stopped"
            ids = self._by_object.get(k)
            if ids is not None:
                ids.discard(lease.lease_id)
                if not ids:
                    del self._by_object[k]
        ids = self._by_token.get(lease.request.cancel_token)
        if ids is not None:
            ids.discard(lease.lease_id)
            if not ids:
                del self._by_token[lease.request.cancel_token]
        lease.state = state
        lease.ended_s = now
        self.changed.add(lease.lease_id)
        lease.reason = reason or lease.reason
        self.on_end(lease)
        return stop

    # ---- views ------------------------------------------------------------------------------------
    def live_for(self, key) -> list[Lease]:
        return [self.leases[i] for i in sorted(self._by_object.get(key, ()))]

    def held(self, key) -> bool:
        """A live lease holds `key` (asked at every planning step of every candidate: most keys
        have no lease at all)."""
        ids = self._by_object.get(key)
        return bool(ids) and any(self.leases[i].state.live for i in ids)

    def covers_kv(self, program: str, model: str) -> bool:
        """A live lease asks for this program's KV of `model` (with_kv), whether or not the KV is
        one of the objects it moves (it is not when the KV was already in HBM at the quote)."""
        return any(self.leases[i].request.program == program and self.leases[i].request.model == model
                   and self.leases[i].request.kv_version is not None
                   for ids in self._by_token.values() for i in ids)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lease in self.leases.values():
            out[lease.state.name.lower()] = out.get(lease.state.name.lower(), 0) + 1
        return out
