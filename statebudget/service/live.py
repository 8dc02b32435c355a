"""The live planner: the simulator's policy (`statebudget-lease`, or `statebudget-track` with a
`TrackConfig`, as `serve` runs it by default) and books (`Tiers`), fed by
runtime events and adapter reports instead of a trace, written through to SQLite.

Every state object has copies; a copy in HBM or DRAM is *ready* once an adapter reported its op
done with the op's version and epoch (the commit boundary), *in flight* while an open op writes
it. Only ready copies are published (`residency`, lease readiness).

    runtime ─events─▶ policy hooks (predictor) ─┐
    runtime ─leases─▶ quote · rank · admit ─────┼─▶ decisions ─▶ ops (per node, plan version)
    tick (coalesced events, expiries) ──────────┘                  │
    adapter ◀── GET plan: open ops of its node ◀──────────────────┘
    adapter ──▶ POST op: done ─▶ commit (copy ready, lease commit)  | stale or cancelled ─▶ 409

Versions and epochs: an op carries the version of the state it moves (KV: its token count;
weights and expert pages: the catalog epoch) and the epoch of its owner (KV: the program's epoch,
bumped by a cancel; others 0). A report is accepted only if both still match the op and the
books; otherwise the op is refused and its target undone, so nothing stale is ever ready.

The simulator plans at every event; here `plan_on_events` is off and the service's loop calls
`tick` a few milliseconds after events arrive, one planning step for all of them.

`LivePlanner` is the facade: it owns the books and is the Mechanism of `core/decisions.py` and
the residency view the policies read (`core/view.py`). Its parts live beside it:

    programs.py   program and call records, the runtime event handlers
    queue.py      call priorities, the live queue order, the admission queue (`running_on` too)
    kvwait.py     a waiting program's KV (tool-wait rule), a program's KV released at its end
    leases.py     submit, view, get, cancel of leases
    journal.py    ops: open, offered (`plan_for`), reported (`report`), committed or closed
    persist.py    the ledger: write-through and restore
    results.py    what the public methods return; errors.py, telemetry.py
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import Counter
from dataclasses import replace

from pydantic import ValidationError

from ..core.books import Engine, GpuCopy, HostCopy, Tiers
from ..core.costs import CostModel
from ..core.decisions import Cancel, Demote, Promote, PromoteHost, apply
from ..core.programs import QUEUES, ProgramSizes
from ..core.toolwait import ToolWaitKV
from ..core.view import ResidencyView
from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.errors import InputError, pydantic_where
from ..models.load import check_compatible
from ..planner.config import PlannerConfig, lease_config
from ..planner.homes import layout
from ..policies.ours import StateBudgetLease, StateBudgetTrack
from .errors import REFUSAL_STATUS, Conflict, Forbidden, Invalid, NotFound, Unavailable
from .journal import Journal, OpRec, OpStatus, gpu_tier
from .kvwait import ToolWaitKVPart
from .leases import LeaseDesk
from .ledger import Store
from .persist import Persist
from .programs import ProgramEvents, ProgramRec
from .queue import QueueOrder
from .reconcile import Reconcile
from .results import ClusterView, EventAck, ResidencyReport
from .telemetry import Telemetry

LEARNT_EVERY_S = 60.0  # how often the planning step saves what the planner has learnt (`save_learnt`)

__all__ = ["Conflict", "Forbidden", "Invalid", "LivePlanner", "NotFound", "Unavailable"]


class LivePlanner(ProgramEvents, QueueOrder, ToolWaitKVPart, LeaseDesk, Journal, Reconcile, Persist, ResidencyView):
    """The live planner behind the API (one instance per service; not thread-safe: the service
    calls it from one event loop, one request at a time). Policies read it as their residency
    view: `tiers`, `kv_tokens`, `now`, `cost`, `gpus`, `catalog`, `cluster`, `policy`,
    `running_models`, `running_on`, `admission_queue()`, `link_backlog()`; they change it only
    through the Mechanism methods `promote`, `promote_host`, `demote`, `cancel`."""

    def __init__(self, cluster: Cluster, catalog: Catalog, store: Store | None = None, clock=time.time,
                 profile: dict | None = None, telemetry: Telemetry | None = None, queue: str = "fcfs",
                 config: PlannerConfig | None = None, kv_rule: str = "preserve",
                 tenant_weights: dict[str, float] | None = None, retain_ops_s: float = 3600.0,
                 retain_programs_s: float = 86_400.0, require_checksums: bool = False, track=None):
        """`queue`: the discipline whose priority `call_arrived` answers (fcfs, plas, atlas, auto), for
        the runtime to pass to its engine (vLLM's `priority`, lower first; `arrival_priority`), with
        the fair share of `tenant_weights` (tenant -> weight, 1 if not named). `config`: the planner's
        knobs (e.g. `stage_host=False` for engines that cannot stage weights into host DRAM).
        `kv_rule`: what happens to a program's KV in HBM while it waits on a tool (preserve, swap,
        discard, adaptive: the simulator's `ToolWaitKV`, carried out as ops). A `store` that
        already holds a ledger is a restart: its cluster, catalog and books win over the arguments.
        `retain_ops_s`, `retain_programs_s`: how long closed ops and ended programs stay in the
        ledger (compaction, `reconcile.py`). `require_checksums`: ops ask for a checksum, and a
        done report without one is refused (for data planes that verify, like the local one).
        `track`: a `TrackConfig`; the planner then tracks the forecast MILP (`statebudget-track`),
        which the service solves every `track.replan_s` off its event loop (`api/app.py`). Built by
        `statebudget serve` (the CLI) and by tests."""
        self.track = track
        self.retain_ops_s, self.retain_programs_s = retain_ops_s, retain_programs_s
        self.require_checksums = require_checksums
        self.config = config
        if queue not in QUEUES:
            raise ValueError(f"unknown queue discipline {queue!r} (known: {', '.join(QUEUES)})")
        self.queue = queue
        self.tenant_weights = dict(tenant_weights or {})
        self.kvw = ToolWaitKV(kv_rule)  # what it learns outlives a PUT /v1/cluster, not a restart
        self.store = store or Store(":memory:")
        self.clock = clock
        self.ledger_error: str | None = None  # the last write the ledger refused, until one succeeds
        self.resume_due = False  # a restart's writes (`_resume`) still to do
        self.telemetry = telemetry or Telemetry()
        self.last_seen: dict[str, float] = {}  # node -> when its adapter last polled or reported (`now`)
        self.profile = profile
        saved = self.store.get_meta("cluster")
        if saved is not None:  # a restart: the books on disk win over the arguments
            cluster, catalog = Cluster(**saved), Catalog(**self.store.get_meta("catalog"))
        if config is not None and config.homes:  # the operator's layout fits the cluster the planner runs on
            layout(catalog, cluster, config.homes)
            self.config = _with_homes(config, _homes_tuple(config.homes), config.layout_holds)
        elif saved is not None:  # a restart keeps the layout the ledger holds (checked when it was set)
            self._layout_from_ledger()
        # Priorities count aging from this instant (`arrival_priority`); kept on disk, so the
        # priorities given before a restart and after it stay comparable.
        self.epoch_s = self.store.get_meta("priority_epoch_s")
        if self.epoch_s is None:
            self.epoch_s = float(clock())
            with self.store.tx():
                self.store.set_meta("priority_epoch_s", self.epoch_s)
        self._setup(cluster, catalog)
        if saved is not None:
            self._restore()
        else:
            with self.store.tx():
                self.store.set_meta("cluster", cluster.model_dump(mode="json"))
                self.store.set_meta("catalog", catalog.model_dump(mode="json"))
                self._save_meta()
        if config is not None and config.homes and self._ledger_layout() != (self.layout, self.layout_holds):
            with self.store.tx():
                self._save_layout()

    def _setup(self, cluster: Cluster, catalog: Catalog) -> None:
        self.cluster, self.catalog = cluster, catalog
        self.sizes = ProgramSizes()  # the finished programs' service, for `auto` (rebuilt from the ledger)
        self.cost = CostModel(cluster, catalog, profile=self.profile)
        self.gpus = cluster.gpus
        self._groups: dict = {}
        self.tiers = Tiers(cluster)
        self.kv_tokens: dict[tuple, int] = {}
        self.running_models: Counter = Counter()
        self.policy = StateBudgetTrack(self.config, self.track) if self.track else StateBudgetLease(self.config)
        self.policy.plan_on_events = False
        self.ledger.on_end = lambda lease: self.telemetry.lease_ended(lease.state.name.lower())
        self.programs: dict[str, ProgramRec] = {}  # every program seen (an ended one refuses late events)
        self.running: dict[str, ProgramRec] = {}   # ... those still running
        self.arrivals: dict[tuple, tuple] = {}     # (program, call) -> (record, row): calls that arrived (`_arrived`)
        self._run_memo: dict[tuple, float] = {}    # (model, group, context, output estimate) -> a waiting call's run
        self.tenant_service: Counter = Counter()  # seconds the calls of each tenant ran (attained service)
        self.ops: dict[str, OpRec] = {}          # open ops
        self.ops_of: dict[tuple, set[str]] = {}  # state key -> its open ops' ids (`_moves_out` without a scan)
        self.backlog: dict[str, float] = {}      # link -> bytes the open ops still put on it
        self.writer: dict[tuple, str] = {}       # (key, tier) -> the open op writing that copy
        self.plan_version = 0
        self.catalog_epoch = 1
        self._op_seq = 0
        self.plan_due = False
        # Tool-wait KV timers (`kvwait.py`), named by their wait (thread, since); not on disk.
        self.kv_timers: list = []   # heap of (at, seq, "recheck" | "swap_in", program, wait, key, group)
        self.kv_waits: dict[tuple, float | None] = {}  # (program, thread) -> the predicted wait of its tool
        self.swap_in_after: dict[tuple, tuple] = {}  # KV key -> (program, wait, group): swap in once written
        self._timer_seq = itertools.count()
        self.fail_backoff: dict[tuple, tuple[int, float]] = {}  # (key, target tier) -> (failures, held until)
        self._compacted_s = float("-inf")
        self._learnt_saved_s = float("-inf")  # `save_learnt`
        self.stock_model_store(preload=False)

    @property
    def now(self) -> float:
        """The clock's time, seconds (what policies and the books read as "now")."""
        return self.clock()

    @property
    def core(self):
        """The policy's planning core for this view (its lease ledger, its call -> lease map)."""
        return self.policy._core(self)

    @property
    def ledger(self):
        """The lease ledger (`planner/leases.py`), whose lease ids are random here: a tenant cannot
        guess another's."""
        ledger = self.core.ledger
        if ledger.new_id is None:
            ledger.new_id = lambda: f"lease-{secrets.token_hex(8)}"
        return ledger

    # ---- versions ---------------------------------------------------------------------------------
    def version_of(self, key) -> int:
        """The version an op on `key` carries: a KV's token count, else the catalog epoch."""
        return self.kv_tokens.get(key, 0) if key[0] == "kv" else self.catalog_epoch

    def epoch_of(self, key) -> int:
        """The owner's epoch an op on `key` carries: a KV's program's (bumped by a cancel), else 0."""
        if key[0] != "kv":
            return 0
        rec = self.programs.get(key[1])
        return rec.epoch if rec else 0

    # ---- runtime events ---------------------------------------------------------------------------
    def event(self, tenant: str, ev: dict) -> EventAck:
        """Apply one runtime event (DESIGN.md §7) in one transaction; the next `tick` plans for it.

        Called by POST /v1/events with the token's tenant and an `EventCreate` as a dict (and by
        the gateway through that route). Returns the event's answer: `ProgramAck`, `CallAck`,
        `CallStartedAck`, `ToolAck` or `EffectDone` by event type. Raises NotFound, Forbidden,
        Conflict (stale epoch or attempt, an ended program) or Invalid (an unknown model)."""
        kind = ev["type"]
        with self._tx():
            if kind == "program_started":
                out = self._program_started(tenant, ev["program"])
            else:
                handler = _HANDLERS.get(kind)
                if handler is None:
                    raise Invalid(f"unknown event type {kind!r}")
                rec = self._program(tenant, ev["program"], ev.get("epoch"))
                out = handler(self, rec, ev)
            self._flush()
        self.telemetry.event(kind)
        self.plan_due = True
        return out

    def events(self, tenant: str, evs: list[dict], stop_at_refusal: bool = False) -> list[tuple[int, dict]]:
        """Apply runtime events in order, in one transaction (one commit for all: a gateway's
        batch). Each gets its own answer, `(200, body)` or `(status, {"detail"})` for a refusal,
        which changes nothing; the events after it still apply, unless `stop_at_refusal` (then
        the answers end with the refusal)."""
        out = []
        with self._tx():
            for ev in evs:
                try:
                    out.append((200, {"type": ev["type"], "program": ev["program"], **self.event(tenant, ev).body()}))
                except (NotFound, Forbidden, Conflict, Invalid) as e:
                    out.append((REFUSAL_STATUS[type(e)], {"detail": str(e)}))
                    if stop_at_refusal:
                        break
        return out

    def arrive_and_start(self, tenant: str, program: str, call: str, before: list[dict]):
        """A gateway's request (POST .../calls/{call}/start): `before` applied as `events`, then the
        call started if its model is ready now, in one transaction: one commit on the request's
        path, where two (the events, then the start) would each sync the ledger. Returns
        (refusal, ready, started): `refusal` is (status, body) for the first refused event of
        `before`, or 409 for a program id used before, and then nothing more is done; else the
        call's `CallReady` and, if it is ready, `call_started`'s answer (None: not ready). A
        refusal after `before` (a call it did not bring, the start itself) is raised once
        `before` is committed, as when the two were separate requests. A poll (no `before`) for a
        call not ready is a read: no transaction, so a ledger that refuses writes does not refuse it."""
        if not before and not (ready := self.call_ready(tenant, program, call)).ready:
            return None, ready, None
        with self._tx():
            for status, body in self.events(tenant, before, stop_at_refusal=True):
                if status != 200:
                    return (status, body), None, None
                if body["type"] == "program_started" and body.get("status") != "running":
                    return (409, {"detail": f"program {program!r} is {body.get('status')}: a program id is "
                                            "used once"}), None, None
            try:  # a refusal here changes nothing, and must not roll `before` back: it is raised after
                ready = self.call_ready(tenant, program, call)
                if not ready.ready:
                    return None, ready, None
                return None, ready, self.event(tenant, {"type": "call_started", "program": program, "call": call}).body()
            except (NotFound, Forbidden, Conflict, Invalid) as e:
                refused = e
        raise refused

    def set_cluster(self, cluster: dict, catalog: dict) -> ClusterView:
        """Replace cluster and catalog. Only while the planner holds nothing (no running program,
        no copy in HBM or DRAM, no open op): a live change of hardware would strand state.

        Called by PUT /v1/cluster. Returns what the planner runs on now, with the new catalog
        epoch. Raises Invalid (a bad cluster or catalog) or Conflict (state is held)."""
        try:
            cl, cat = Cluster(**cluster), Catalog(**catalog)
            check_compatible(cl, cat)
        except ValidationError as e:
            where, what = pydantic_where(e)
            raise Invalid(f"{where}: {what}") from None
        except InputError as e:
            raise Invalid(str(e)) from None
        running = sorted(self.running)
        held = len(self.tiers.gpu) + len(self.tiers.host)
        if running or held or self.ops:
            raise Conflict(f"the planner holds state ({len(running)} running programs, {held} copies, "
                           f"{len(self.ops)} open ops): finish or cancel the programs and let the ops drain first")
        try:  # what can fail is tried before anything changes: the model store must fit the NVMe
            CostModel(cl, cat, profile=self.profile)
            try:
                layout(cat, cl, self.layout)
            except ValueError as e:
                raise ValueError(f"the layout: {e}; drop it first (PUT /v1/layout {{\"homes\": {{}}}}), then "
                                 "PUT the cluster and a layout for it") from None
            for node in cl.nodes:
                need = sum(b for m in cat.models for _, b in self.object_sizes(m))
                if need > node.nvme_gb * 1e9:
                    raise ValueError(f"node {node.name}: NVMe ({node.nvme_gb} GB) too small for the model store "
                                     f"({need / 1e9:.1f} GB)")
        except ValueError as e:
            raise Invalid(str(e)) from None
        learnt = self.policy.learnt(self.now)  # the workload's, not the hardware's: it carries over
        with self._tx():
            epoch, version, seq = self.catalog_epoch + 1, self.plan_version + 1, self._op_seq
            self._setup(cl, cat)
            if learnt is not None:
                self.policy.take_up(learnt, self.now)
                self.save_learnt()
            self.catalog_epoch, self.plan_version, self._op_seq = epoch, version, seq
            self.store.set_meta("cluster", cl.model_dump(mode="json"))
            self.store.set_meta("catalog", cat.model_dump(mode="json"))
            # a new cluster starts a new ledger of programs and leases (none is live: checked above)
            for table in ("programs", "leases", "kv", "residency"):
                self.store.db.execute(f"DELETE FROM {table}")
            self._save_meta()
        return ClusterView(cl.name, len(cl.gpus), [m.name for m in cat.models], self.catalog_epoch)

    # ---- the operator's layout ---------------------------------------------------------------------
    @property
    def layout(self) -> tuple | None:
        """The operator's layout the planner homes models by (`PlannerConfig.homes`), None: none."""
        return (self.config.homes or None) if self.config is not None else None

    @property
    def layout_holds(self) -> bool:
        """Whether a model in the layout is homed on its group even while it has a copy elsewhere."""
        return bool(self.layout) and self.config.layout_holds

    def set_layout(self, homes, holds: bool = False) -> tuple | None:
        """Replace the operator's layout: ((model, (GPU index, ...)), ...), or None (or empty) for
        none, and whether it holds (`PlannerConfig.layout_holds`). From the next planning step a
        model with no copy is homed by it (with `holds`, a model with a copy elsewhere too); copies
        stay where they are until evicted. Kept in the ledger: a restart keeps it. Called by PUT
        /v1/layout. Returns the layout now. Raises Invalid (an entry the cluster or catalog cannot
        take; nothing changes)."""
        homes = _homes_tuple(homes)
        try:
            layout(self.catalog, self.cluster, homes)
        except ValueError as e:
            raise Invalid(str(e)) from None
        with self._tx():
            self.config = _with_homes(self.config, homes, holds)
            # the policy's core (made at `_setup`) reads its own config
            self.core.set_homes(self.layout, self.layout_holds)
            self._save_layout()
        self.plan_due = True
        return self.layout

    def _save_layout(self) -> None:
        self.store.set_meta("layout", {"homes": [[m, list(g)] for m, g in self.layout], "holds": self.layout_holds}
                            if self.layout else None)

    def _layout_from_ledger(self) -> None:
        self.config = _with_homes(self.config, *self._ledger_layout())

    def _ledger_layout(self) -> tuple[tuple | None, bool]:
        """(homes, holds) the ledger keeps; (None, False): none."""
        return ledger_layout(self.store.get_meta("layout"))

    # ---- planning ---------------------------------------------------------------------------------
    def tick(self) -> int:
        """One planning step: due tool-wait KV timers and held drops act, leases past their
        deadline expire, the policy plans. Called by the service's planning loop (`api/app.py`)
        a few ms after events arrive, every `tick_s` regardless, and by tests. Returns the number
        of ops it created."""
        t0 = time.perf_counter()
        try:
            return self._tick(t0)
        except Unavailable:  # the ledger still refuses writes (its probe says so): no step
            return 0

    def _tick(self, t0: float) -> int:
        with self._tx():
            if self.resume_due:
                self._resume()
            n = self._op_seq
            self._kv_due()  # first: a failure later in the step must not leave a due timer in place
            self._release_held()
            self._compact()
            self.ledger.expire(self.now)
            self._apply(self.policy.on_tick(self))
            if self.now - self._learnt_saved_s >= LEARNT_EVERY_S:
                self.save_learnt()
            self._flush()
        self.plan_due = False
        self.telemetry.decision(time.perf_counter() - t0)
        return self._op_seq - n

    def save_learnt(self) -> None:
        """What the planner has learnt (the predictor's switch counts, start rate and tool waits,
        `Predictor.state_dict`; with tracking, the tracker's rates) to the ledger, which a restart
        takes up (`_restore`): a restarted planner predicts from the hours before it stopped (the
        counts halve every 30 minutes of running) instead of from the uniform prior. Written every
        `LEARNT_EVERY_S` by the planning step and when the service stops."""
        state = self.policy.learnt(self.now)
        if state is not None:
            self.store.set_meta("learnt", state)
        self._learnt_saved_s = self.now

    def target_problem(self):
        """(policy, the next tracking solve's problem), built from the books; None without tracking."""
        if not isinstance(self.policy, StateBudgetTrack):
            return None
        return self.policy, self.policy.target_problem(self)

    def adopt_target(self, policy, prob, sol) -> bool:
        """A solve's target is tracked from now on, unless the catalog changed while it ran."""
        if policy is not self.policy:
            return False
        policy._tracker(self).adopt(prob, sol, self.now, self.now)
        self.plan_due = True
        return True

    def _apply(self, decisions) -> None:
        """The mechanism: decisions become books changes and ops."""
        apply(decisions, self)

    # ---- the Mechanism (core/decisions.py) --------------------------------------------------------
    def promote(self, d: Promote) -> None:
        """Bring a copy into a GPU group's HBM (for a lease, or speculation): an op."""
        self._promote(d.key, d.group, d.lease_id)

    def promote_host(self, d: PromoteHost) -> None:
        """Stage weights from NVMe into a node's host DRAM: an op."""
        self._promote_host(d.key, d.node)

    def demote(self, d: Demote) -> None:
        """Move a ready, unpinned copy out of HBM to host DRAM or drop it: an op."""
        self._demote(d.key, d.group, d.to)

    def cancel(self, d: Cancel) -> None:
        """Stop a load nobody waits for."""
        op_id = self.writer.get((d.key, gpu_tier(d.group)))
        if op_id is not None:
            self._close(self.ops[op_id], OpStatus.CANCELLED, "nobody waits for it any more")

    def _promote(self, key, group, lease_id=None, background: bool = False) -> None:
        """A copy into HBM; `background` (a tool-wait swap-in) takes only free HBM. A promote no
        lease asked for is speculation, which yields to demand (`Policy.speculation_yields`): its
        op is a background one too, which adapters run after the poll's foreground ops."""
        existing = self.tiers.gpu.get((key, group))
        if existing is not None:
            if lease_id is not None:
                existing.lease = (existing.lease or ()) + (lease_id,)
                if existing.ready:
                    self.policy.on_copy_ready(self, existing)
            return
        if key[0] == "kv" and self.kv_tokens.get(key, 0) == 0 or self.held_back(key, gpu_tier(group)):
            return
        per_gpu = self.size_of(key) / len(group)
        victims = self.plan_eviction(group, per_gpu + self.tiers.engine_need(key, group), protect={(key, group)},
                                     allow=lambda v: self.policy.may_evict_for_prefetch(self, v, key, group)
                                     and not self.held_back(v.key, gpu_tier(v.group)))
        if victims is None or (background and victims):
            return
        for v in victims:
            if isinstance(v, Engine):  # an asleep engine stops; its host copy stays, as a cache
                self.tiers.stop_engine(v.key, v.group)
            else:
                self._demote(v.key, v.group, self.policy.demote_tier(self, v))
        src = self.best_source(key, group)
        if key[0] == "w":  # the engine that serves it: an asleep one wakes, else one starts
            self.tiers.start_engine(key, group, self.now)
        ok = self.tiers.alloc_gpu(group, per_gpu)
        assert ok, "allocation planned by plan_eviction must succeed"
        c = GpuCopy(key, group, per_gpu, False, self.now, self.now, from_prefetch=True)
        c.lease = (lease_id,) if lease_id else None
        self.tiers.add_gpu_copy(c)
        lease = self.ledger.leases.get(lease_id) if lease_id else None
        node = self.gpus[group[0]].node
        self._new_op("promote", key, src, gpu_tier(group), per_gpu * len(group), node, lease,
                     background or (lease_id is None and self.policy.speculation_yields))
        self._save_gpu(c)

    def _promote_host(self, key, node) -> None:
        """Weights into host DRAM where there is room (KV is never staged this way)."""
        if (key, node) in self.tiers.host or key[0] == "kv" or self.held_back(key, f"host:{node}"):
            return
        nbytes = self.size_of(key)
        if not self.tiers.alloc_host(node, nbytes):
            return
        hc = self.tiers.host[(key, node)] = HostCopy(key, node, nbytes, False, self.now)
        self._new_op("promote", key, f"nvme:{node}", f"host:{node}", nbytes, node)
        self._save_host(hc)

    def _demote(self, key, group, to: str, background: bool = False) -> None:
        """A ready, unpinned copy leaves the books' HBM now; its room is free for the plan, and the
        op moves it to `to` (host, where there is room and no other writer) or drops it."""
        c = self.tiers.gpu.get((key, group))
        if c is None or c.pins > 0 or not c.ready or self.held_back(key, gpu_tier(group)):
            return
        node = self.gpus[group[0]].node
        dst = "none"
        if to == "host":
            hc = self.tiers.host.get((key, node))
            if hc is None and self.tiers.alloc_host(node, c.nbytes):
                hc = self.tiers.host[(key, node)] = HostCopy(key, node, c.nbytes, False, self.now)
            elif hc is not None and not hc.ready:
                hc = None  # another op is writing that host copy: two writers would race; drop this one
            if hc is not None:
                dst = f"host:{node}"
                if key[0] == "w":  # the engine sleeps on its group (vLLM sleep level 1)
                    self.tiers.sleep_engine(key, group, hc)
        self.tiers.remove_gpu_copy(c)
        self.store.delete_copy(key, gpu_tier(group))
        op = self._new_op("demote" if dst != "none" else "drop", key, gpu_tier(group), dst, c.nbytes, node,
                          background=background and dst != "none")
        if dst != "none":
            hc = self.tiers.host[(key, node)]
            if not hc.ready:
                self.writer[(key, dst)] = op.op_id
                self._save_host(hc, op.op_id)

    # ---- operators ----------------------------------------------------------------------------------
    def residency(self) -> ResidencyReport:
        """Every copy in HBM and host DRAM, ready or in flight, with its version; open ops; the
        programs and leases by status; KV lengths; the tool-wait KV rule and what it did.
        Called by GET /v1/residency (and by the operators' CLI through it)."""
        copies = []
        for (key, group), c in sorted(self.tiers.gpu.items(), key=lambda x: (x[0][1], x[0][0])):
            copies.append({"object": list(map(str, key)), "tier": gpu_tier(group), "bytes": c.nbytes, "ready": c.ready,
                           "version": self.version_of(key), "pins": c.pins})
        for (key, node), hc in sorted(self.tiers.host.items(), key=lambda x: (x[0][1], x[0][0])):
            copies.append({"object": list(map(str, key)), "tier": f"host:{node}", "bytes": hc.nbytes, "ready": hc.ready,
                           "version": self.version_of(key), "pins": 0})
        suspended = sorted({tuple(map(str, k)) for (k, _), c in self.tiers.gpu.items() if c.suspended_since is not None})
        return ResidencyReport(self.plan_version, copies, len(self.ops),
                               dict(Counter(str(r.status) for r in self.programs.values())), self.ledger.counts(),
                               {f"{k[1]}/{k[2]}": t for k, t in self.kv_tokens.items()},
                               {"rule": self.kvw.rule, "actions": dict(self.kvw.actions),
                                "suspended": [list(k) for k in suspended]},
                               [{"model": k[1], "tier": gpu_tier(g), "state": "asleep" if e.asleep else "awake"}
                                for (k, g), e in sorted(self.tiers.engines.items(), key=lambda x: (x[0][1], x[0][0]))])

    def due_in(self) -> float | None:
        """Seconds until the next timer (a tool-wait KV's, or a held op's `not_before`), or None.
        Read by the service's planning loop, which wakes for it."""
        at = [r.not_before for r in self._held()]
        if self.kv_timers:
            at.append(self.kv_timers[0][0])
        return min(at) - self.now if at else None



# The runtime events after program_started, each with its handler (`event` looks it up here).
_HANDLERS = {
    "call_arrived": LivePlanner._call_arrived,
    "call_started": LivePlanner._call_started,
    "call_finished": LivePlanner._call_finished,
    "call_cancelled": LivePlanner._call_cancelled,
    "tool_started": LivePlanner._tool_started,
    "tool_finished": LivePlanner._tool_finished,
    "program_finished": LivePlanner._program_finished,
    "program_cancelled": LivePlanner._program_cancelled,
}


def ledger_layout(saved) -> tuple[tuple | None, bool]:
    """(homes, holds) from the ledger's `layout` meta: {"homes": [[model, [GPU, ...]], ...],
    "holds": bool}, or a bare list of entries (ledgers written before `holds`), or None."""
    if isinstance(saved, list):
        saved = {"homes": saved}
    saved = saved or {}
    return _homes_tuple(saved.get("homes")), bool(saved.get("holds"))


def _homes_tuple(homes) -> tuple | None:
    """A layout as `PlannerConfig.homes` takes it, whatever sequences it came in (the ledger's JSON
    has lists); None for none."""
    return tuple((m, tuple(g)) for m, g in homes) if homes else None


def _with_homes(config: PlannerConfig | None, homes: tuple | None, holds: bool = False) -> PlannerConfig | None:
    """`config` (None: the lease planner's defaults) with the layout `homes` and `layout_holds`
    (no layout holds nothing); `config` itself when it has them already."""
    holds = bool(homes) and holds
    now = (config.homes, config.layout_holds) if config is not None else (None, False)
    if now == (homes, holds):
        return config
    return replace(config or lease_config(), homes=homes, layout_holds=holds)
