"""Saving the live planner's books to the ledger `Store` and rebuilding them after a restart, as a
part of `LivePlanner`. Every change a request makes is written inside its transaction (`Store.tx`)
before the answer leaves; what is not on disk (the predictor, tool-wait timers) is soft state that
the planner relearns or takes up again."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import asdict

from ..core.books import GpuCopy, HostCopy
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.plan import Op
from ..models.state import kv_key, weights_key
from ..models.trace import MAIN_THREAD
from ..planner.leases import Lease, LeaseRequest, LeaseState, Quote
from .errors import Conflict, Forbidden, Invalid, NotFound, Unavailable
from .journal import OpRec, OpStatus, gpu_tier, object_key, tier_group
from .ledger import LedgerError
from .programs import CallStatus, HookProgram, ProgramRec, ProgramStatus, asked_tokens
from .telemetry import HeldTelemetry

log = logging.getLogger("statebudget.planner")


class Persist:
    """Write-through of copies, ops, programs and leases; `_restore` at start."""

    def _take_up_learnt(self) -> None:
        """What the planner had learnt (`save_learnt`); one that does not read is left out."""
        learnt = self.store.get_meta("learnt")
        if learnt is not None:
            try:
                self.policy.take_up(learnt, self.now)
            except Exception as e:  # a ledger edited by hand, or written by another version: relearn
                log.warning("the planner's saved learning is left out, it starts afresh: %s", e,
                            exc_info=not isinstance(e, ValueError))

    def _save_meta(self) -> None:
        """Plan version, op counter and catalog epoch: what numbers the next op and version."""
        self.store.set_meta("plan_version", self.plan_version)
        self.store.set_meta("op_seq", self._op_seq)
        self.store.set_meta("catalog_epoch", self.catalog_epoch)

    def _save_gpu(self, c: GpuCopy) -> None:
        tier = gpu_tier(c.group)
        self.store.put_copy(c.key, tier, c.nbytes, c.ready, self.version_of(c.key), self.epoch_of(c.key),
                            self.writer.get((c.key, tier)), c.last_use)

    def _save_host(self, hc: HostCopy, op_id: str | None = None) -> None:
        tier = f"host:{hc.node}"
        self.store.put_copy(hc.key, tier, hc.nbytes, hc.ready, self.version_of(hc.key), self.epoch_of(hc.key),
                            op_id or self.writer.get((hc.key, tier)), hc.last_use)

    def _save_op(self, rec: OpRec) -> None:
        self.store.put_op(rec.op.op_id, rec.node, rec.status, rec.plan_version, rec.offered, rec.op.model_dump(),
                          rec.result, rec.reason, rec.order, rec.not_before, rec.tries, rec.closed_s)

    def _save_program(self, rec: ProgramRec) -> None:
        self.store.put_program(rec.program, rec.tenant, dict(rec.__dict__))  # json copies it; no deepcopy

    def _flush(self) -> None:
        """Leases the ledger changed since the last flush go to disk."""
        for lid in sorted(self.ledger.changed):
            lease = self.ledger.leases[lid]
            self.store.put_lease(lid, lease.request.tenant, lease.request.program, lease.state.name.lower(),
                                 _lease_body(lease, self.policy.group_of.get(lid)))
        self.ledger.changed.clear()

    def _restore(self, resume: bool = True) -> None:
        """Rebuild the books from disk after a restart (into books just `_setup`). Open ops are
        offered again (an adapter that already ran one reports its result again; it never runs it
        twice); with `resume`, the writes of a restart follow (`_resume`). The predictor starts
        from what it had learnt when last saved (`save_learnt`); one saved in another format
        is left out, with a warning (it relearns)."""
        s = self.store
        self.plan_version = s.get_meta("plan_version", 0)
        self._op_seq = s.get_meta("op_seq", 0)
        self.catalog_epoch = s.get_meta("catalog_epoch", 1)
        self.kv_tokens = s.kv()
        for body in s.programs():
            body = dict(body)
            if "tool" in body:  # a ledger without threads holds one tool wait: the main thread's
                old = body.pop("tool")
                body["tools"] = {MAIN_THREAD: old} if old else {}
            rec = self.programs[body["program"]] = ProgramRec(**body)
            self.tenant_service[rec.tenant] += rec.service_s
            if rec.status == ProgramStatus.RUNNING:
                self.running[rec.program] = rec
                self.policy.on_program_start(self, _resumed(rec))
        self._take_up_learnt()
        # The room calls ask for is learnt again from the ledger's finished calls, in the order they
        # finished (what they wrote is not kept: the output estimate starts afresh). Forgotten first:
        # a rebuild after a failed write restores into the same estimate.
        self.output_estimate.forget_asked()
        done = sorted((call.get("ended_s", call.get("arrived_s", 0.0)), call["model"], asked_tokens(call))
                      for rec in self.programs.values() for call in rec.calls.values()
                      if call["status"] == CallStatus.FINISHED)
        for _, model, tokens in done:
            self.output_estimate.observe_asked(model, tokens)
        finished = [r for r in self.programs.values() if r.status == ProgramStatus.FINISHED] if self.queue == "auto" else []
        for rec in sorted(finished, key=lambda r: r.ended_s or 0.0):
            self.sizes.observe(rec.service_s, rec.ended_s or 0.0)  # in the order they finished
        if finished:
            self.publish_sizes()
        for row in s.copies():
            key, tier = row["key"], row["tier"]
            if key[0] == "e":
                key = (key[0], key[1], int(key[2]))
            if tier.startswith("gpu:"):
                group = tier_group(tier)
                per_gpu = row["bytes"] / len(group)
                self.tiers.alloc_gpu(group, per_gpu)
                self.tiers.add_gpu_copy(GpuCopy(key, group, per_gpu, row["ready"], row["last_use"], row["last_use"]))
                if key[0] == "w" and self.tiers.fits_gpu(group, self.tiers.engine_need(key, group)):
                    self.tiers.start_engine(key, group, row["last_use"])  # awake weights have an engine (asleep ones are not kept)
            else:
                node = tier.split(":", 1)[1]
                self.tiers.alloc_host(node, row["bytes"])
                self.tiers.host[(key, node)] = HostCopy(key, node, row["bytes"], row["ready"], row["last_use"])
        for body in s.leases():
            lease = _lease_from(body)
            self.ledger.restore(lease)
            if body.get("group") is not None:
                self.policy.group_of[lease.lease_id] = tuple(body["group"])
            if lease.state.live and lease.request.for_call:
                self.core.lease_of_call[(lease.request.program, lease.request.for_call)] = lease.lease_id
        for lid, group in self.policy.group_of.items():  # leases wait on in-flight copies again
            lease = self.ledger.leases.get(lid)
            for key, st in (lease.objects.items() if lease is not None and lease.state.live else ()):
                c = self.tiers.gpu.get((key, group))
                if st == "moving" and c is not None and not c.ready and lid not in (c.lease or ()):
                    c.lease = (c.lease or ()) + (lid,)
        for rec in self.programs.values():  # calls running at the crash pin their state again
            for cid, call in rec.calls.items():
                if call["status"] == CallStatus.ARRIVED and rec.status == ProgramStatus.RUNNING:
                    self._arrived(rec, cid)  # still waiting: the admission queue's again
                if call["status"] == CallStatus.STARTED and call["group"] is not None:
                    group = tuple(call["group"])
                    self.running_models[(call["model"], group)] += 1
                    for key in [weights_key(call["model"]), kv_key(rec.program, call["model"])]:
                        c = self.tiers.gpu.get((key, group))
                        if c is not None:
                            c.pins += 1
        for row in s.ops(OpStatus.OPEN):
            op = Op(**row["op"])
            self.ops[op.op_id] = OpRec(op, row["node"], OpStatus.OPEN, row["offered"], row["plan_version"],
                                       order=row["order"], not_before=row["not_before"], tries=row["tries"],
                                       issued_s=self.now)
            self._on_link(op, +1)
            self.ops_of.setdefault(object_key(op.object), set()).add(op.op_id)
            if op.kind == "promote" or op.dst.startswith("host:"):
                self.writer[(object_key(op.object), op.dst)] = op.op_id
        self.resume_due = True
        if resume:
            with s.tx():
                self._resume()

    def _resume(self) -> None:
        """The writes of a restart, inside the caller's transaction: ops of leases no longer live
        are cancelled, tool waits take up their timers again, and the plan version moves so that
        adapters polling with the old one see the open ops again."""
        for rec in list(self.ops.values()):
            lease = self.ledger.leases.get(rec.op.lease_id) if rec.op.lease_id else None
            if lease is not None and not lease.state.live:
                self._close(rec, OpStatus.CANCELLED, f"lease {lease.lease_id} is {lease.state.name.lower()}")
        self.ledger.changed.clear()
        for rec in self.programs.values():
            if rec.status == ProgramStatus.RUNNING and rec.tools and not self._busy(rec):
                self._resume_tool_wait(rec)
        self._bump()
        self.resume_due = False

    @contextmanager
    def _tx(self):
        """One request's transaction, with memory following the ledger: if the ledger refuses the
        write (or the request fails in a way nobody planned for, after changing memory), the
        transaction is rolled back and the books are rebuilt from what is on disk, as after a
        restart; the caller gets `Unavailable` (503) for a refused write. The refusals the planner
        raises on purpose (NotFound, Conflict ...) come before any change, and pass through.

        The store's lock is held throughout, so a background job writing through the same store
        (an oracle run) never makes a request's transaction look nested. While the ledger is known
        to refuse writes, a request is refused before it touches memory unless a probe write now
        succeeds. Telemetry is held back until the commit: a request rolled back counts nothing."""
        with self.store.lock:
            if self.store._depth:  # nested in this thread's transaction: the outer one decides
                yield
                return
            if self.ledger_error is not None:
                try:
                    self.store.probe_write()
                except LedgerError as e:
                    self.ledger_error = str(e)
                    raise Unavailable(f"{e}; nothing of this request was kept, send it again later") from None
            real, self.telemetry = self.telemetry, HeldTelemetry()
            try:
                with self.store.tx():
                    yield
            except (NotFound, Forbidden, Conflict, Invalid):
                self.telemetry.replay(real)  # a refusal commits what it closed (its op, on disk)
                raise
            except LedgerError as e:
                self._rebuild(str(e))
                raise Unavailable(f"{e}; nothing of this request was kept, send it again later") from None
            except Exception:
                self._rebuild(None)
                raise
            finally:
                held, self.telemetry = self.telemetry, real
            held.replay(real)
            if self.ledger_error is not None:
                log.warning("ledger writable again after: %s", self.ledger_error)
                self.ledger_error = None

    def _rebuild(self, error: str | None) -> None:
        """Memory from the ledger after a rolled-back transaction, the cluster and catalog too (a
        PUT /v1/cluster may have been the request). Its own writes (`_resume`) are tried once; if
        the ledger refuses them too, the next planning step does them."""
        if error is not None:
            self.ledger_error = error
            log.error("%s: the books are rebuilt from the ledger", error)
        cluster, catalog = Cluster(**self.store.get_meta("cluster")), Catalog(**self.store.get_meta("catalog"))
        self._layout_from_ledger()  # a PUT /v1/layout may have been the request
        self._setup(cluster, catalog)
        self._restore(resume=False)
        try:
            with self.store.tx():
                self._resume()
        except LedgerError as e:
            self.ledger_error = str(e)
            self._setup(cluster, catalog)
            self._restore(resume=False)


def _lease_body(lease: Lease, group) -> dict:
    """A lease as its ledger row's JSON body, with the GPU group it prepares."""
    return {"lease_id": lease.lease_id, "request": asdict(lease.request),
            "quote": {**asdict(lease.quote), "objects": [list(k) for k in lease.quote.objects]},
            "state": lease.state.name, "objects": [[list(k), v] for k, v in lease.objects.items()],
            "created_s": lease.created_s, "ready_s": lease.ready_s, "ended_s": lease.ended_s, "reason": lease.reason,
            "retry_after_s": lease.retry_after_s, "group": list(group) if group else None}


def _lease_from(body: dict) -> Lease:
    """The lease a ledger row's body holds (`_lease_body` read back)."""
    q = body["quote"]
    quote = Quote(**{**q, "objects": tuple(object_key(k) for k in q["objects"])})
    lease = Lease(body["lease_id"], LeaseRequest(**body["request"]), LeaseState[body["state"]], quote, body["created_s"],
                  {object_key(k): v for k, v in body["objects"]}, body["ready_s"], body["ended_s"], body["reason"])
    lease.retry_after_s = body.get("retry_after_s")  # absent from rows written before it existed
    return lease


def _resumed(rec: ProgramRec) -> HookProgram:
    """A running program as it comes back after a restart: the model its latest call asked for
    (of calls that arrived at once, the later) and its threads' running tool waits."""
    calls = list(rec.calls.values())
    last = max(range(len(calls)), key=lambda i: (calls[i].get("arrived_s", 0.0), i), default=None)
    return HookProgram(rec.program, rec.tenant, resumed=True,
                       last_model=calls[last]["model"] if last is not None else None,
                       waits=tuple((tool, since) for tool, since, *_ in rec.tools.values()))
