"""HandoffLeases as the runtime sees them: submit (quote, rank, admit), view, get and cancel, as a
part of `LivePlanner`. The lease ledger itself is the planning core's (`planner/leases.py`); the
policy decides, this part checks the caller and turns the lease into its answer."""

from __future__ import annotations

from ..models.lease import LeasePublic, QuotePublic
from ..models.state import kv_key
from ..planner.leases import Lease, LeaseRequest, LeaseState
from ..policies.baselines import place_model
from .errors import Invalid, NotFound
from .journal import gpu_tier
from .programs import scoped, unscoped


class LeaseDesk:
    """Submit, view, get and cancel leases."""

    def submit_lease(self, tenant: str, body: dict) -> LeasePublic:
        """Quote, rank and admit one HandoffLease for the program's next call; an accepted one gets
        its ops now, and one with no room to prepare is refused at once rather than left to expire.

        Called by POST /v1/leases with the token's tenant and a `LeaseCreate` as a dict. Returns
        the lease as the runtime sees it. Raises NotFound, Forbidden, Conflict (the program
        ended, a stale epoch) or Invalid (an unknown model, or one that fits no GPU group)."""
        with self._tx():
            rec = self._program(tenant, body["program"], body.get("epoch"))
            self._live(rec, "lease")
            model = body["model"]
            m = self.catalog.by_name.get(model)
            if m is None:
                raise Invalid(f"unknown model {model!r}; the catalog has {sorted(self.catalog.by_name)}")
            now = self.now
            kvk = kv_key(rec.program, model)
            group = place_model(self, model, program=rec.program)
            if group is None:
                raise Invalid(f"model {model!r} fits no GPU group of cluster {self.cluster.name!r}")
            req = LeaseRequest(program=rec.program, tenant=tenant, model=model, version=m.version,
                               deadline_s=now + float(body["deadline_s"]), confidence=float(body.get("confidence", 1.0)),
                               # a runtime's cancel token, like its program ids, is its tenant's alone
                               cancel_token=scoped(tenant, body["cancel_token"]) if body.get("cancel_token")
                               else f"{rec.program}/{body.get('for_call') or model}",
                               earliest_s=now + float(body.get("earliest_s", 0.0)),
                               kv_version=(self.kv_tokens.get(kvk) or None) if body.get("with_kv", True) else None,
                               for_call=body.get("for_call"))
            leases, decisions = self.policy.request_leases(self, [(req, group)])
            self._apply(decisions)
            lease = leases[0]
            missing = [k for k in lease.objects if (k, group) not in self.tiers.gpu] if lease.state.live else []
            if missing:  # no room to prepare it now (or a failed load backs off): say so, not let it expire
                what = f"{gpu_tier(group)} for {'/'.join(map(str, missing[0]))}"
                why = (f"a load onto {what} failed; it is retried after its back-off"
                       if self.held_back(missing[0], gpu_tier(group)) else f"no room on {what}")
                self._apply(self.policy.stop_leases(self, [(lease.lease_id, self.ledger.refuse(
                    lease.lease_id, self.now, why))]))
            self._flush()
        self.telemetry.lease(lease.decision)
        self.plan_due = True
        return self.lease_view(lease)

    def lease_view(self, lease: Lease) -> LeasePublic:
        """A lease as the runtime sees it now (its deadline counted from now). Used by the lease
        routes' answers."""
        q = lease.quote
        return LeasePublic(
            lease_id=lease.lease_id, decision=lease.decision, state=lease.state.name.lower(),
            quote=QuotePublic(p50_s=q.p50_s, p95_s=q.p95_s), version=lease.request.version,
            kv_version=lease.request.kv_version, ready=lease.state in (LeaseState.READY, LeaseState.CONSUMED),
            deadline_in_s=lease.request.deadline_s - self.now,
            reason=lease.reason.replace(lease.request.program, unscoped(lease.request.program)),
            objects={"/".join(map(str, _runtime_key(k))): v for k, v in lease.objects.items()},
            retry_after_s=lease.retry_after_s)

    def get_lease(self, tenant: str, lease_id: str) -> Lease:
        """The lease `lease_id` of `tenant`. Called by GET and DELETE /v1/leases/{id}. Raises
        NotFound, for another tenant's lease too (its ids are not to be probed)."""
        lease = self.ledger.leases.get(lease_id)
        if lease is None or lease.request.tenant != tenant:
            raise NotFound(f"no lease {lease_id!r}")
        return lease

    def cancel_lease(self, tenant: str, lease_id: str) -> LeasePublic:
        """Cancel a lease: its transfers stop and what they reserved is freed. A second cancel
        changes nothing, and the lease's end is counted once, by the ledger (`on_end`).

        Called by DELETE /v1/leases/{id}. Returns the lease as it is after the cancel. Raises
        NotFound, or Forbidden for another tenant's lease."""
        with self._tx():
            lease = self.get_lease(tenant, lease_id)
            stop = self.ledger.cancel(lease_id, self.now, "cancelled by the runtime")
            self._apply(self.policy.stop_leases(self, [(lease_id, stop)]))
            self._flush()
        return self.lease_view(lease)



def _runtime_key(key) -> tuple:
    """A state key as the runtime names it: a KV under its own program id, not the planner's."""
    return ("kv", unscoped(key[1]), key[2]) if key[0] == "kv" else key
