"""The live planner: the simulator's policy (`statebudget-lease`) and books (`Tiers`), fed by
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
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from pydantic import ValidationError

from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..models.errors import InputError, pydantic_where
from ..models.load import check_compatible
from ..models.plan import Op
from ..models.state import kv_key, weights_key
from ..models.trace import MAIN_THREAD
from ..core.books import GpuCopy, HostCopy, Tiers
from ..policies.baselines import place_model
from ..policies.ours import StateBudgetLease
from ..core.costs import CostModel
from ..planner.core import PlannerConfig
from ..planner.leases import Lease, LeaseRequest, LeaseState, Quote
from ..core.programs import AGING, QUEUES, ProgramSizes, arrival_priority, queue_key, tenant_excess
from ..core.toolwait import ToolWaitKV, host_link_bps
from .ledger import Store
from ..core.view import ResidencyView
from ..core.decisions import Cancel, Demote, Promote, PromoteHost, apply

log = logging.getLogger("statebudget.planner")
DROP_TRIES = 3       # a drop the engine failed is sent again this many times, ...
DROP_RETRY_S = 1.0   # ... 1 s, 2 s, then 4 s after the failure before it



class NotFound(LookupError):
    """404: no such program, lease or op."""


class Forbidden(PermissionError):
    """403: another tenant's program or lease, another node's op."""


class Conflict(RuntimeError):
    """409: a stale version or epoch, a cancelled lease or program, an op already closed."""


class Invalid(ValueError):
    """422: a well-formed request that names what does not exist (an unknown model)."""


class Telemetry:
    """What the planner reports as it works; the service plugs Prometheus in (no-ops here)."""
    def decision(self, seconds: float) -> None: ...
    def lease(self, outcome: str) -> None: ...
    def moved(self, link: str, nbytes: float) -> None: ...
    def stall(self, seconds: float, handoff: bool) -> None: ...
    def event(self, kind: str) -> None: ...
    def op(self, status: str) -> None: ...
    def kv_action(self, rule: str) -> None: ...
    def program_sizes(self, cv: float | None, ordering: str) -> None: ...


def gpu_tier(group) -> str:
    return "gpu:" + ",".join(str(i) for i in group)


@dataclass
class _Prog:
    """A program as the policy hooks see it."""
    program: str
    tenant: str


@dataclass
class _Call:
    """A call as the policy hooks see it (`node` is the call's id in its program)."""
    program: str
    node: str
    model: str
    context_tokens: int = 0
    output_tokens: int = 0
    arrive: float = 0.0  # the hooks' calls here have all arrived (the simulator's CallRec: -1 until then)


@dataclass
class ProgramRec:
    program: str
    tenant: str
    epoch: int = 0
    status: str = "running"  # running | finished | cancelled
    calls: dict = field(default_factory=dict)  # call id -> {model, status, attempt, arrived_s, group, handoff}
    last_model: str | None = None
    tools: dict = field(default_factory=dict)  # thread -> its running tool wait: [tool, since, tool call id or None]
    service_s: float = 0.0    # attained service: seconds its calls ran, failed attempts included
    tools_over: list = field(default_factory=list)  # tool call ids finished or superseded by a retry
    tools_done: list = field(default_factory=list)  # ... of those, the ones whose result was taken
    # A tool's side effect by its idempotency key (§16): {call, thread, state: running | done,
    # result}. A running entry counts only while its tool call still waits on its thread.
    effects: dict = field(default_factory=dict)
    ended_s: float | None = None  # when it finished or was cancelled


@dataclass
class OpRec:
    op: Op
    node: str
    status: str = "open"      # open | done | failed | cancelled
    offered: int = 0
    plan_version: int = 0
    result: dict | None = None
    reason: str = ""
    order: int = 0            # its place in the node's plan (`plan_for`): its number, or the
                              # place of the move out it replaces (`_demote_undone`)
    tries: int = 0            # a drop sent again: how many drops of that copy failed before it
    not_before: float = 0.0   # ... and not offered before this time (0: offered now)


class LivePlanner(ResidencyView):
    def __init__(self, cluster: Cluster, catalog: Catalog, store: Store | None = None, clock=time.time,
                 profile: dict | None = None, telemetry: Telemetry | None = None, queue: str = "fcfs",
                 config: PlannerConfig | None = None, kv_rule: str = "preserve",
                 tenant_weights: dict[str, float] | None = None):
        """`queue`: the discipline whose priority `call_arrived` answers (fcfs, plas, atlas, auto), for
        the runtime to pass to its engine (vLLM's `priority`, lower first; `arrival_priority`), with
        the fair share of `tenant_weights` (tenant -> weight, 1 if not named). `config`: the planner's
        knobs (e.g. `stage_host=False` for engines that cannot stage weights into host DRAM).
        `kv_rule`: what happens to a program's KV in HBM while it waits on a tool (preserve, swap,
        discard, adaptive: the simulator's `ToolWaitKV`, carried out as ops)."""
        self.config = config
        if queue not in QUEUES:
            raise ValueError(f"unknown queue discipline {queue!r} (known: {', '.join(QUEUES)})")
        self.queue = queue
        self.sizes = ProgramSizes()  # the finished programs' service, for `auto` (rebuilt from the ledger)
        self.tenant_weights = dict(tenant_weights or {})
        self.kvw = ToolWaitKV(kv_rule)  # what it learns outlives a PUT /v1/cluster, not a restart
        self.store = store or Store(":memory:")
        self.clock = clock
        self.telemetry = telemetry or Telemetry()
        self.profile = profile
        # Priorities count aging from this instant (`arrival_priority`); kept on disk, so the
        # priorities given before a restart and after it stay comparable.
        self.epoch_s = self.store.get_meta("priority_epoch_s")
        if self.epoch_s is None:
            self.epoch_s = float(clock())
            with self.store.tx():
                self.store.set_meta("priority_epoch_s", self.epoch_s)
        saved = self.store.get_meta("cluster")
        if saved is not None:  # a restart: the books on disk win over the arguments
            cluster, catalog = Cluster(**saved), Catalog(**self.store.get_meta("catalog"))
        self._setup(cluster, catalog)
        if saved is not None:
            self._restore()
        else:
            with self.store.tx():
                self.store.set_meta("cluster", cluster.model_dump(mode="json"))
                self.store.set_meta("catalog", catalog.model_dump(mode="json"))
                self._save_meta()

    def _setup(self, cluster: Cluster, catalog: Catalog) -> None:
        self.cluster, self.catalog = cluster, catalog
        self.cost = CostModel(cluster, catalog, profile=self.profile)
        self.gpus = cluster.gpus
        self._groups: dict = {}
        self.tiers = Tiers(cluster)
        self.kv_tokens: dict[tuple, int] = {}
        self.running_models: Counter = Counter()
        self.policy = StateBudgetLease(self.config)
        self.policy.plan_on_events = False
        self.programs: dict[str, ProgramRec] = {}  # every program seen (an ended one refuses late events)
        self.running: dict[str, ProgramRec] = {}   # ... those still running
        self.tenant_service: Counter = Counter()  # seconds the calls of each tenant ran (attained service)
        self.ops: dict[str, OpRec] = {}          # open ops
        self.backlog: dict[str, float] = {}      # link -> bytes the open ops still put on it
        self.writer: dict[tuple, str] = {}       # (key, tier) -> the open op writing that copy
        self.plan_version = 0
        self.catalog_epoch = 1
        self._op_seq = 0
        self.plan_due = False
        # Tool-wait KV timers (not kept on disk: a restart takes each tool wait up again, _resume_tool_wait):
        # A tool wait is named (thread, since): a timer acts only while that same wait goes on.
        self.kv_timers: list = []   # heap of (at, seq, "recheck" | "swap_in", program, wait, key, group)
        self.kv_waits: dict[tuple, float | None] = {}  # (program, thread) -> the predicted wait of its tool
        self.swap_in_after: dict[tuple, tuple] = {}  # KV key -> (program, wait, group): swap in once written
        self._timer_seq = itertools.count()
        self.stock_model_store(preload=False)

    @property
    def now(self) -> float:
        return self.clock()

    @property
    def core(self):
        return self.policy._core(self)

    @property
    def ledger(self):
        return self.core.ledger

    # ---- versions -------------------------------------------------------------------------------
    def version_of(self, key) -> int:
        return self.kv_tokens.get(key, 0) if key[0] == "kv" else self.catalog_epoch

    def epoch_of(self, key) -> int:
        if key[0] != "kv":
            return 0
        rec = self.programs.get(key[1])
        return rec.epoch if rec else 0

    # ---- runtime events ---------------------------------------------------------------------------
    def event(self, tenant: str, ev: dict) -> dict:
        """Apply one runtime event (DESIGN.md §7). Raises NotFound/Forbidden/Conflict/Invalid."""
        kind = ev["type"]
        with self.store.tx():
            if kind == "program_started":
                out = self._program_started(tenant, ev["program"])
            else:
                rec = self._program(tenant, ev["program"], ev.get("epoch"))
                out = getattr(self, "_" + kind)(rec, ev)
            self._flush()
        self.telemetry.event(kind)
        self.plan_due = True
        return out

    def _program(self, tenant: str, program: str, epoch: int | None) -> ProgramRec:
        rec = self.programs.get(program)
        if rec is None:
            raise NotFound(f"program {program!r} was never started (send program_started first)")
        if rec.tenant != tenant:
            raise Forbidden(f"program {program!r} belongs to another tenant")
        if epoch is not None and epoch != rec.epoch:
            raise Conflict(f"program {program!r} is at epoch {rec.epoch}; an event of epoch {epoch} is stale")
        return rec

    def _live(self, rec: ProgramRec, what: str) -> None:
        if rec.status != "running":
            raise Conflict(f"program {rec.program!r} is {rec.status}: no {what} after that")

    def _program_started(self, tenant: str, program: str) -> dict:
        rec = self.programs.get(program)
        if rec is not None:
            if rec.tenant != tenant:
                raise Forbidden(f"program {program!r} belongs to another tenant")
            return {"program": program, "epoch": rec.epoch, "status": rec.status}  # a retried start
        rec = self.programs[program] = self.running[program] = ProgramRec(program, tenant)
        self.policy.on_program_start(self, _Prog(program, tenant))
        self._save_program(rec)
        return {"program": program, "epoch": 0, "status": "running"}

    def _call_of(self, rec: ProgramRec, ev: dict) -> dict:
        """The call an event is about, at the attempt it names (default: the current one)."""
        call = rec.calls.get(ev["call"])
        if call is None:
            raise NotFound(f"call {ev['call']!r} of program {rec.program!r} never arrived (send call_arrived first)")
        attempt = ev.get("attempt", call["attempt"])
        if attempt != call["attempt"]:
            raise Conflict(f"call {ev['call']!r} is at attempt {call['attempt']}; an event of attempt {attempt} is stale")
        return call

    def _call_arrived(self, rec: ProgramRec, ev: dict) -> dict:
        self._live(rec, "new call")
        model = ev["model"]
        if model not in self.catalog.by_name:
            raise Invalid(f"unknown model {model!r}; the catalog has {sorted(self.catalog.by_name)}")
        attempt = ev.get("attempt", 0)
        call = rec.calls.get(ev["call"])
        if call is not None:
            if attempt == call["attempt"]:
                return {"call": ev["call"], "status": call["status"], "attempt": attempt}  # a repeated event
            if attempt < call["attempt"]:
                raise Conflict(f"call {ev['call']!r} is at attempt {call['attempt']}; attempt {attempt} is stale")
            if call["status"] == "finished":
                raise Conflict(f"call {ev['call']!r} already finished (attempt {call['attempt']}): a logical call "
                               f"commits once")
            if call["status"] == "cancelled":
                raise Conflict(f"call {ev['call']!r} was cancelled: its branch does not run again")
        for dep in ev.get("after") or ():  # every check before the first change: a refusal changes nothing
            d = rec.calls.get(dep)
            if d is not None and d["status"] == "cancelled":
                raise Conflict(f"call {ev['call']!r} cannot arrive: its dependency {dep!r} was cancelled (a cancel "
                               f"takes the calls after it too)")
            if d is None or d["status"] != "finished":
                raise Conflict(f"call {ev['call']!r} cannot arrive before its dependency {dep!r} has finished")
        if call is not None:
            self._unpin(rec, call)  # a retry: the old attempt's hold on its state goes
        deps = [rec.calls[d] for d in ev.get("after") or ()]
        path_in = max((d.get("path_s", 0.0) for d in deps), default=0.0)
        service = call.get("service_s", 0.0) if call is not None else 0.0  # a retry keeps what it attained
        rec.calls[ev["call"]] = {"model": model, "status": "arrived", "arrived_s": self.now, "group": None,
                                 "handoff": rec.last_model is not None and rec.last_model != model, "attempt": attempt,
                                 "path_in_s": path_in, "service_s": service, "ttft_s": ev.get("ttft_s"),
                                 "context_tokens": ev.get("context_tokens", 0)}
        self.kvw.outcome(kv_key(rec.program, model), True)
        self._keep_kv(kv_key(rec.program, model))
        self.policy.on_call_arrive(self, _Call(rec.program, ev["call"], model, ev.get("context_tokens", 0),
                                               ev.get("output_tokens", 0)))
        self._save_program(rec)
        return {"call": ev["call"], "status": "arrived", "attempt": attempt,
                "priority": self._priority(rec, rec.calls[ev["call"]])}

    def _priority(self, rec: ProgramRec, call: dict) -> int:
        """The queue discipline's key as the engine's fixed priority, in ms (lower first): the
        simulator's inputs, the program's (plas) or the critical path's (atlas) attained service,
        aging, the tenant's fair-share excess, and with `ttft_s` the TTFT slack left after the
        predicted prefill on a GPU group that holds the model (none held: no slack boost)."""
        queue, now = self.sizes.discipline(self.queue), self.now
        if queue == "fcfs":
            # auto: arrival order on atlas's scale (a score of 0), so that calls still waiting
            # from before a switch back to fcfs are not passed by every later arrival (0)
            return int(round(1000 * AGING * (now - self.epoch_s))) if self.queue == "auto" else 0
        return int(round(1000 * arrival_priority(queue, now, self.epoch_s, *self._key_inputs(rec, call, now))))

    def _key_inputs(self, rec: ProgramRec, call: dict, now: float) -> tuple:
        """(program service, path service, TTFT slack at `now`, tenant excess): what `queue_key`
        weighs for a waiting call. The slack is the time left to the call's TTFT bound after the
        predicted prefill of its whole context on the fastest GPU group that holds its model
        (None: the call named no `ttft_s`, or no group holds the model). The simulator's slack
        differs in what it knows: every call there has a bound (its SLO class), and the prefill
        is the one on the call's own group, less the KV it reuses."""
        slack = None
        if call.get("ttft_s") is not None:
            held = [c.group for c in self.copies_of(call["model"]) if c.ready]
            if held:
                m = self.catalog.by_name[call["model"]]
                slack = call["ttft_s"] - (now - call["arrived_s"]) - \
                    min(self.cost.prefill_s(m, call.get("context_tokens", 0), g) for g in held)
        excess = tenant_excess(self.tenant_service, self.tenant_weights, rec.tenant) if self.tenant_service else 0.0
        # .get: calls in ledgers written before attained service was kept per call
        return rec.service_s, call.get("path_in_s", 0.0) + call.get("service_s", 0.0), slack, excess

    def waiting_calls(self, model: str | None = None, tenant: str | None = None) -> dict:
        """The calls that arrived and have not started, in the order the queue discipline gives
        them now: the simulator's `queue_key` (with the inputs the service knows, `_key_inputs`;
        ties by program and call, as there), evaluated at this instant, so unlike the fixed
        `priority` of `call_arrived` it follows the starvation promotion, the slack that shrinks
        as a call waits, and service the program attained since (another thread finished). For
        a runtime or gateway that holds calls and picks the next one itself. `model`: only
        calls on that model; `tenant`: only that tenant's calls (their `rank` stays the one
        among every tenant's)."""
        if model is not None and model not in self.catalog.by_name:
            raise Invalid(f"unknown model {model!r}; the catalog has {sorted(self.catalog.by_name)}")
        now, rows, queue = self.now, [], self.sizes.discipline(self.queue)
        for rec in self.running.values():
            for cid, call in rec.calls.items():
                if call["status"] != "arrived" or model not in (None, call["model"]):
                    continue
                key = queue_key(queue, call["arrived_s"], now, *self._key_inputs(rec, call, now))
                rows.append((key + (rec.program, cid), rec, cid, call))
        rows.sort(key=lambda r: r[0])
        out = [{"rank": i, "program": rec.program, "call": cid, "model": call["model"], "attempt": call.get("attempt", 0),
                "waited_s": now - call["arrived_s"],
                "promoted": queue != "fcfs" and key[0] == 0}
               for i, (key, rec, cid, call) in enumerate(rows) if tenant in (None, rec.tenant)]
        head = {"queue": self.queue}
        if self.queue == "auto":
            head |= {"ordering_by": queue, "program_service_cv": self.sizes.cv}
        return head | {"calls": out}

    def _call_cancelled(self, rec: ProgramRec, ev: dict) -> dict:
        """The runtime abandons a call (a branch it no longer needs: seed 003 §25): its hold on its
        state goes, its leases stop, a result it still reports is late, and no call after it may
        arrive (the cancel takes its descendants). Its program's KV stays for the other branches."""
        self._live(rec, "call cancel")
        call = self._call_of(rec, ev)
        if call["status"] == "finished":
            raise Conflict(f"call {ev['call']!r} already finished: a committed call cannot be cancelled")
        if call["status"] == "cancelled":
            return {"call": ev["call"], "status": "cancelled"}  # a repeated event
        self._unpin(rec, call, accrue=False)  # an abandoned run is no service (as in the simulator)
        call["status"] = "cancelled"
        self._apply(self.policy.on_call_cancelled(self, _Call(rec.program, ev["call"], call["model"])))
        self._save_program(rec)
        return {"call": ev["call"], "status": "cancelled"}

    def _moves_out(self, kvk, group=None, background_only: bool = False) -> list[OpRec]:
        """Open moves (demotions and drops) of a KV out of HBM (of one GPU group, or of any; or only
        tool-wait swaps)."""
        return [r for r in self.ops.values() if r.op.kind in ("demote", "drop") and _key(r.op.object) == kvk
                and r.op.src.startswith("gpu:") and (group is None or r.op.src == gpu_tier(group))
                and (r.op.background or not background_only)]

    def _keep_kv(self, kvk) -> None:
        """A call came back to this KV: its tool-wait swap-outs still in flight stop where the
        room they freed is still free, and their sources, which never left HBM, are ready again:
        the call does not wait for a round trip (the simulator's `_keep_kv`). Where the room went
        to something else, the move goes on."""
        for rec in self._moves_out(kvk, background_only=True):
            g = _group(rec.op.src)
            if (kvk, g) not in self.tiers.gpu and self.tiers.fits_gpu(g, rec.op.bytes / len(g)):
                self._close(rec, "cancelled", "its call came back before the move ended")

    def _call_started(self, rec: ProgramRec, ev: dict) -> dict:
        self._live(rec, "call start")
        call = self._call_of(rec, ev)
        if call["status"] == "cancelled":
            raise Conflict(f"call {ev['call']!r} was cancelled: it does not start")
        if call["status"] != "arrived":
            return {"call": ev["call"], "status": call["status"]}
        model = call["model"]
        held = [c for c in self.copies_of(model) if c.ready]
        group = max(held, key=lambda c: c.last_use).group if held else place_model(self, model, rec.program)
        stall = self.now - call["arrived_s"]
        self.telemetry.stall(stall, call["handoff"])
        call.update(status="started", group=list(group) if group else None, stall_s=stall, started_s=self.now)
        rec.last_model = model
        if group is not None:
            self.running_models[(model, group)] += 1
            for key in [weights_key(model), kv_key(rec.program, model)]:
                c = self.tiers.gpu.get((key, group))
                if c is not None:
                    c.pins += 1
                    c.used = True
                    c.last_use = self.now
                    c.suspended_since = None
            self.policy.on_call_admitted(self, _Call(rec.program, ev["call"], model))
        self._save_program(rec)
        return {"call": ev["call"], "status": "started", "stall_s": stall,
                "group": gpu_tier(group) if group else None}

    def _unpin(self, rec: ProgramRec, call: dict, accrue: bool = True) -> tuple | None:
        """A started attempt stops (finished, retried, or its program ended): its running time is
        attained service (unless `accrue` is off: an abandoned branch), and its hold on its state goes."""
        if call["status"] != "started":
            return None
        ran = self.now - call.get("started_s", self.now) if accrue else 0.0
        rec.service_s += ran
        self.tenant_service[rec.tenant] += ran
        call["service_s"] = call.get("service_s", 0.0) + ran
        call["path_s"] = call.get("path_in_s", 0.0) + call["service_s"]
        if call["group"] is None:
            return None
        group = tuple(call["group"])
        self.running_models[(call["model"], group)] -= 1
        if self.running_models[(call["model"], group)] <= 0:
            del self.running_models[(call["model"], group)]
        for key in [weights_key(call["model"]), kv_key(rec.program, call["model"])]:
            c = self.tiers.gpu.get((key, group))
            if c is not None and c.pins > 0:
                c.pins -= 1
        return group

    def _call_finished(self, rec: ProgramRec, ev: dict) -> dict:
        call = self._call_of(rec, ev)
        if call["status"] == "cancelled":
            raise Conflict(f"the result of call {ev['call']!r} is late: it was cancelled"
                           + (f" with program {rec.program!r}" if rec.status == "cancelled" else ""))
        if call["status"] not in ("arrived", "started"):
            return {"call": ev["call"], "status": call["status"]}  # a repeated result commits nothing
        group = self._unpin(rec, call)
        call.setdefault("path_s", call.get("path_in_s", 0.0) + call.get("service_s", 0.0))
        call["status"] = "finished"
        model = call["model"]
        kvk = kv_key(rec.program, model)
        tokens = int(ev.get("tokens", 0))
        if tokens > 0 and tokens != self.kv_tokens.get(kvk):
            # The engine left the call's KV (a new version) on the group it ran on, growing the copy
            # it had there: only the books change for that one. Copies elsewhere are stale and go.
            same = self.tiers.gpu.get((kvk, group)) if group is not None else None
            in_place = same.nbytes if same is not None and same.ready else None  # the bytes it held
            place = None  # where a drop of it goes in the plan: in the place of a move it stops
            for mv in self._moves_out(kvk, group) if group is not None else ():
                # The call ran on the very copy that op was moving out (or dropping: the discard
                # rule), and the engine grew it in place: the move stops, and its source is the
                # copy the books take up below.
                self._close(mv, "cancelled", "the call grew this KV in place", undo_source=False)
                in_place, place = mv.op.bytes, mv.order
            if same is not None and same.ready:
                self.tiers.remove_gpu_copy(same)
                self.store.delete_copy(kvk, gpu_tier(group))
            self._apply(self._drop_all(kvk))
            self.kv_tokens[kvk] = tokens
            self.store.put_kv(rec.program, model, tokens)
            if group is not None:
                per_gpu = tokens * self.catalog.by_name[model].kv_bytes_per_token / len(group)
                if self.tiers.alloc_gpu(group, per_gpu):
                    c = GpuCopy(kvk, group, per_gpu, True, self.now, self.now, used=True)
                    self.tiers.add_gpu_copy(c)
                    self._save_gpu(c)
                elif in_place is not None:  # the books have no room for it: the engine must let it go
                    self._new_op("drop", kvk, gpu_tier(group), "none", in_place, self.gpus[group[0]].node,
                                 order=place)
        self._apply(self.policy.on_call_end(self, _Call(rec.program, ev["call"], model)))
        self._save_program(rec)
        return {"call": ev["call"], "status": "finished", "kv_version": self.kv_tokens.get(kvk, 0)}

    def _tool_started(self, rec: ProgramRec, ev: dict) -> dict:
        """A tool wait begins on a thread (default `main`). Threads of a fork/join program wait on
        tools side by side; a new tool call on a thread that still waits is a retry of it.

        `effect` is the idempotency key of the tool's side effect (a payment, a delete, a message
        sent: seed 003 §16). Once a result with that key has been taken (and not `ok: false`), a
        tool call that asks for it again, as a retried LLM call would, is answered `done` with
        the stored `result` and starts no wait: the runtime must not run it again. While it is in
        flight on one thread, another thread's call for it is refused (409)."""
        self._live(rec, "tool call")
        tid, thread, key = ev.get("call"), ev.get("thread") or MAIN_THREAD, ev.get("effect")
        if key is not None:
            if tid is None:
                raise Invalid("a tool_started event with an effect key needs its tool call id (call)")
            e = rec.effects.get(key)
            if e is not None and e["state"] == "done":  # applied once already: the runtime must not run it again
                return {"tool": ev["tool"], "status": "done", "effect": key, "of": e["call"], "result": e["result"]}
            if e is not None and e["call"] != tid and e["thread"] != thread and _waiting_thread(rec, e["call"]) is not None:
                raise Conflict(f"side effect {key!r} of program {rec.program!r} is in flight as tool call "
                               f"{e['call']!r} on thread {e['thread']!r}: running it again would repeat it; await "
                               f"that call's result")
        if tid is not None and tid in rec.tools_over:
            raise Conflict(f"tool call {tid!r} of program {rec.program!r} is over (finished, or retried under "
                           f"another id): a repeated start is stale")
        if (th := _waiting_thread(rec, tid)) is not None:
            return {"tool": rec.tools[th][0], "status": "started"}  # a repeated event: nothing changes
        old = rec.tools.get(thread)
        if old is not None and old[2] is not None:
            rec.tools_over.append(old[2])  # a retry supersedes the thread's running tool call
        rec.tools[thread] = [ev["tool"], self.now, tid]
        if key is not None:  # (a retry on the same thread takes the key over)
            rec.effects[key] = {"call": tid, "thread": thread, "state": "running", "result": None}
        self._apply(self.policy.on_tool_start(self, _Prog(rec.program, rec.tenant), None, ev["tool"]))
        self._tool_wait_kv(rec, thread)
        self._save_program(rec)
        return {"tool": ev["tool"], "status": "started"}

    def _tool_finished(self, rec: ProgramRec, ev: dict) -> dict:
        """A tool result: matched by its tool call id where it has one (a result nobody awaits is
        late), else by its thread. A result for a program that ended is late too, epoch or not."""
        tool, tid = ev["tool"], ev.get("call")
        if tid is not None and tid in rec.tools_done:  # a repeated delivery of a result already taken
            return {"tool": tool, "status": "finished", "repeated": True}
        if rec.status != "running":
            raise Conflict(f"tool result {tid or tool!r} of program {rec.program!r} is late: the program is "
                           f"{rec.status}")
        if tid is not None:
            thread = _waiting_thread(rec, tid)
            if thread is None:
                raise Conflict(f"tool result {tid!r} of program {rec.program!r} is late: that tool is no "
                               f"longer awaited")
        else:
            thread = ev.get("thread") or MAIN_THREAD
        w = rec.tools.pop(thread, None)
        since = w[1] if w is not None and w[0] == tool else self.now
        duration = ev.get("duration_s")
        duration = float(duration) if duration is not None else self.now - since
        effect = None
        if w is not None:
            if w[2] is not None:
                rec.tools_over.append(w[2])
                rec.tools_done.append(w[2])
                effect = next((k for k, e in rec.effects.items() if e["state"] == "running" and e["call"] == w[2]), None)
            if effect is not None and ev.get("ok") is not False:
                rec.effects[effect].update(state="done", result=ev.get("result"))
            elif effect is not None:  # the tool failed without its effect: a later try may run it
                del rec.effects[effect]
                effect = None
            self.kvw.ended(w[0], duration, self.kv_waits.pop((rec.program, thread), None))
        if not rec.tools:  # another thread still waiting keeps the program's KV suspended (as in the simulator)
            self._end_suspensions(rec.program)
        self.policy.on_tool_end(self, _Prog(rec.program, rec.tenant), None, tool, duration)
        self._save_program(rec)
        out = {"tool": tool, "status": "finished", "duration_s": duration}
        if effect is not None:
            out["effect"] = effect
        return out

    def _program_finished(self, rec: ProgramRec, ev: dict) -> dict:
        return self._end_program(rec, "finished")

    def _program_cancelled(self, rec: ProgramRec, ev: dict) -> dict:
        return self._end_program(rec, "cancelled")

    def _end_program(self, rec: ProgramRec, status: str) -> dict:
        """Finish or cancel: live leases stop, calls unpin, every KV of the program is released.
        A cancel bumps the epoch, so late reports and events of the old epoch are refused."""
        if rec.status != "running":
            return {"program": rec.program, "status": rec.status, "epoch": rec.epoch}
        if status == "cancelled":
            rec.epoch += 1
        rec.status, rec.ended_s = status, self.now
        self.running.pop(rec.program, None)
        stopped = []
        for lease in list(self.ledger.leases.values()):
            if lease.request.program == rec.program and lease.state.live:
                stopped.append((lease.lease_id, self.ledger.cancel(lease.lease_id, self.now, f"program {status}")))
        decisions = self.policy.stop_leases(self, stopped)
        for call in rec.calls.values():
            self._unpin(rec, call)
            if call["status"] in ("arrived", "started"):
                call["status"] = "cancelled"  # it never finished: the program's end abandons it
        for thread in rec.tools:
            self.kv_waits.pop((rec.program, thread), None)
        for kvk in self._kv_keys(rec.program):
            self.kvw.outcome(kvk, False)
            self.swap_in_after.pop(kvk, None)
            decisions += self._drop_all(kvk)
            if self.kv_tokens.pop(kvk, None) is not None:
                self.store.delete_kv(rec.program, kvk[2])
        if status == "finished" and self.queue == "auto":
            self._judge_size(rec)  # once the calls it ended have added their service
        self.policy.on_program_end(self, _Prog(rec.program, rec.tenant))
        self._apply(decisions)
        self._save_program(rec)
        return {"program": rec.program, "status": status, "epoch": rec.epoch}

    def _judge_size(self, rec: ProgramRec) -> None:
        """`auto`: a finished program's service joins what the queue judges the tail on."""
        self.sizes.observe(rec.service_s, rec.ended_s or 0.0)
        self.publish_sizes()

    def publish_sizes(self) -> None:
        """Tell the telemetry what `auto` judges now (its CV, the discipline it orders by)."""
        self.telemetry.program_sizes(self.sizes.cv, self.sizes.discipline(self.queue))

    def _drop_all(self, kvk) -> list:
        """Release every copy of a KV: open ops writing it are cancelled, ready copies dropped."""
        for tier, op_id in [(t, o) for (k, t), o in self.writer.items() if k == kvk]:
            self._close(self.ops[op_id], "cancelled", f"{kvk[0]} {kvk[1]}/{kvk[2]} released")
        out = []
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            c = self.tiers.gpu[(kvk, g)]
            if c.ready:
                c.pins = 0
                out.append(Demote(kvk, g, "none"))
        for (k, node), hc in list(self.tiers.host.items()):
            if k == kvk:
                self.tiers.remove_host_copy(hc)
                self.store.delete_copy(kvk, f"host:{node}")
                self._new_op("drop", kvk, f"host:{node}", "none", hc.nbytes, node)
        if kvk in {k for k, _ in self.tiers.nvme}:
            for (k, node) in [x for x in self.tiers.nvme if x[0] == kvk]:
                self.tiers.remove_nvme(kvk, node)
        return out

    # ---- tool waits: what happens to the program's KV (seed 003 §10-§12, §21; the simulator's rule) --
    def _busy(self, rec: ProgramRec) -> bool:
        return any(c["status"] in ("arrived", "started") for c in rec.calls.values())

    def _kv_keys(self, program: str) -> list[tuple]:
        """The keys a program's KV may have: one per model of the catalog."""
        return [kv_key(program, m.name) for m in self.catalog.models]

    def _kv_copies(self, program: str) -> list[GpuCopy]:
        """The program's KV copies in HBM that are ready and that no running call pins."""
        return [c for kvk in self._kv_keys(program) for g in sorted(self.tiers.groups_of.get(kvk, ()))
                if (c := self.tiers.gpu[(kvk, g)]).ready and not c.pins]

    def _tool_wait_kv(self, rec: ProgramRec, thread: str) -> None:
        """A tool started on `thread`: the rule for each KV copy of the program, unless another of
        its calls still runs (then its KV is not suspended)."""
        tool, since, _ = rec.tools[thread]
        predicted = self.kv_waits[(rec.program, thread)] = self.kvw.started(tool)
        if self._busy(rec):
            return
        copies = self._kv_copies(rec.program)
        for kvk in sorted({c.key for c in copies}):
            self.kvw.suspended(kvk, tool)
        for c in copies:
            self._suspend_kv(rec, c, predicted, thread)

    def _awaited(self, program: str, wait: tuple) -> list | None:
        """The tool wait `wait` = (thread, since) of a running program, if it still goes on."""
        rec = self.programs.get(program)
        w = rec.tools.get(wait[0]) if rec is not None and rec.status == "running" else None
        return w if w is not None and w[1] == wait[1] else None

    def _suspend_kv(self, rec: ProgramRec, c: GpuCopy, predicted: float | None, thread: str) -> None:
        tool, since, _ = rec.tools[thread]
        act = self.kvw.decide_copy(self, tool, c, predicted, since)
        if act.new:  # /metrics counts what the books' `actions` count
            self.telemetry.kv_action(act.rule)
        if act.rule == "preserve":
            if c.suspended_since is None:
                c.suspended_since = self.now
            if act.recheck_at is not None:
                self._kv_timer(act.recheck_at, "recheck", rec, thread, c.key, c.group)
        elif act.rule == "swap":
            self._demote(c.key, c.group, "host", background=True)
            if act.swap_in_at is not None:
                self._kv_timer(act.swap_in_at, "swap_in", rec, thread, c.key, c.group)
        else:
            self._demote(c.key, c.group, "none")

    def _kv_timer(self, at: float, kind: str, rec: ProgramRec, thread: str, kvk, group) -> None:
        wait = (thread, rec.tools[thread][1])
        heapq.heappush(self.kv_timers, (at, next(self._timer_seq), kind, rec.program, wait, kvk, group))

    def due_in(self) -> float | None:
        """Seconds until the next timer (a tool-wait KV's, or a held op's `not_before`; the
        service's loop wakes for it), or None."""
        at = [r.not_before for r in self._held()]
        if self.kv_timers:
            at.append(self.kv_timers[0][0])
        return min(at) - self.now if at else None

    def _held(self):
        """The open ops held back until their `not_before`."""
        return (r for r in self.ops.values() if r.not_before)

    def _release_held(self) -> None:
        """Held drops whose time has come are offered (the plan version moves for the long polls),
        unless the books took that copy up again meanwhile (a promote onto that tier, which
        replaced it): that one is cancelled."""
        due = [r for r in self._held() if r.not_before <= self.now]
        for r in due:
            r.not_before = 0.0
            if (_key(r.op.object), _group(r.op.src)) in self.tiers.gpu:
                self._finish_as(r, "cancelled", "the copy is in the books again")
            else:
                self._save_op(r)
        if due:
            self._bump()

    def _kv_due(self) -> None:
        """Timers that are due: a preserved KV whose TTL ran out is judged again on the wait still
        expected; a swapped-out KV comes back before the predicted return. Both only while the
        same tool wait goes on."""
        while self.kv_timers and self.kv_timers[0][0] <= self.now:
            _, _, kind, program, wait, kvk, group = heapq.heappop(self.kv_timers)
            w = self._awaited(program, wait)
            if w is None:
                continue
            if kind == "swap_in":
                self._kv_back(program, wait, kvk, group)
                continue
            rec = self.programs[program]
            c = self.tiers.gpu.get((kvk, group))
            if c is None or c.suspended_since is None or c.pins or not c.ready:
                continue
            left = self.kvw.remaining(w[0], self.now - wait[1])
            if self._busy(rec):  # another thread's call runs: judge it again later, as the simulator does
                self._kv_timer(self.kvw.next_check(self.now, wait[1], left), "recheck", rec, wait[0], kvk, group)
                continue
            self._suspend_kv(rec, c, left, wait[0])

    def _kv_back(self, program: str, wait: tuple, kvk, group) -> None:
        """Swap a KV back in from host DRAM as a background op that evicts nothing; once the
        swap-out is written if it is still on its way."""
        if self._awaited(program, wait) is None or kvk not in self.kv_tokens or (kvk, group) in self.tiers.gpu:
            return
        hc = self.tiers.host.get((kvk, self.gpus[group[0]].node))
        if hc is None:
            return
        if not hc.ready:
            self.swap_in_after[kvk] = (program, wait, group)
            return
        if self.best_source(kvk, group).startswith("host:"):  # a swap-in, not a recompute
            self._promote(kvk, group, background=True)

    def _end_suspensions(self, program: str) -> None:
        for kvk in self._kv_keys(program):
            for g in self.tiers.groups_of.get(kvk, ()):
                self.tiers.gpu[(kvk, g)].suspended_since = None

    # ---- leases -----------------------------------------------------------------------------------
    def submit_lease(self, tenant: str, body: dict) -> dict:
        """Quote, rank and admit one HandoffLease (seed 000 §3); accepted ones get their ops now."""
        with self.store.tx():
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
                               cancel_token=body.get("cancel_token") or f"{rec.program}/{body.get('for_call') or model}",
                               earliest_s=now + float(body.get("earliest_s", 0.0)),
                               kv_version=(self.kv_tokens.get(kvk) or None) if body.get("with_kv", True) else None,
                               for_call=body.get("for_call"))
            leases, decisions = self.policy.request_leases(self, [(req, group)])
            self._apply(decisions)
            lease = leases[0]
            missing = [k for k in lease.objects if (k, group) not in self.tiers.gpu] if lease.state.live else []
            if missing:  # no room to prepare it now: say so instead of letting it expire
                self._apply(self.policy.stop_leases(self, [(lease.lease_id, self.ledger.refuse(
                    lease.lease_id, self.now, f"no room on {gpu_tier(group)} for {'/'.join(map(str, missing[0]))}"))]))
            self._flush()
        self.telemetry.lease(lease.decision)
        self.plan_due = True
        return self.lease_view(lease)

    def lease_view(self, lease: Lease) -> dict:
        q = lease.quote
        return {"lease_id": lease.lease_id, "decision": lease.decision, "state": lease.state.name.lower(),
                "quote": {"p50_s": q.p50_s, "p95_s": q.p95_s}, "version": lease.request.version,
                "kv_version": lease.request.kv_version, "ready": lease.state in (LeaseState.READY, LeaseState.CONSUMED),
                "deadline_in_s": lease.request.deadline_s - self.now, "reason": lease.reason,
                "objects": {"/".join(map(str, k)): v for k, v in lease.objects.items()}}

    def get_lease(self, tenant: str, lease_id: str) -> Lease:
        lease = self.ledger.leases.get(lease_id)
        if lease is None:
            raise NotFound(f"no lease {lease_id!r}")
        if lease.request.tenant != tenant:
            raise Forbidden(f"lease {lease_id!r} belongs to another tenant")
        return lease

    def cancel_lease(self, tenant: str, lease_id: str) -> dict:
        """Cancel a lease: its transfers stop and what they reserved is freed. A second cancel
        changes nothing."""
        with self.store.tx():
            lease = self.get_lease(tenant, lease_id)
            stop = self.ledger.cancel(lease_id, self.now, "cancelled by the runtime")
            self._apply(self.policy.stop_leases(self, [(lease_id, stop)]))
            self._flush()
        self.telemetry.lease("cancelled")
        return self.lease_view(lease)

    # ---- operators --------------------------------------------------------------------------------
    def set_cluster(self, cluster: dict, catalog: dict) -> dict:
        """Replace cluster and catalog. Only while the planner holds nothing (no running program,
        no copy in HBM or DRAM, no open op): a live change of hardware would strand state."""
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
            for node in cl.nodes:
                need = sum(b for m in cat.models for _, b in self.object_sizes(m))
                if need > node.nvme_gb * 1e9:
                    raise ValueError(f"node {node.name}: NVMe ({node.nvme_gb} GB) too small for the model store "
                                     f"({need / 1e9:.1f} GB)")
        except ValueError as e:
            raise Invalid(str(e)) from None
        with self.store.tx():
            epoch, version, seq = self.catalog_epoch + 1, self.plan_version + 1, self._op_seq
            self._setup(cl, cat)
            self.catalog_epoch, self.plan_version, self._op_seq = epoch, version, seq
            self.store.set_meta("cluster", cl.model_dump(mode="json"))
            self.store.set_meta("catalog", cat.model_dump(mode="json"))
            # a new cluster starts a new ledger of programs and leases (none is live: checked above)
            for table in ("programs", "leases", "kv", "residency"):
                self.store.db.execute(f"DELETE FROM {table}")
            self._save_meta()
        return {"cluster": cl.name, "gpus": len(cl.gpus), "models": [m.name for m in cat.models],
                "catalog_epoch": self.catalog_epoch}

    # ---- planning ---------------------------------------------------------------------------------
    def tick(self) -> int:
        """One planning step: leases past their deadline expire, the policy plans. Returns the
        number of ops it created."""
        t0 = time.perf_counter()
        with self.store.tx():
            n = self._op_seq
            self._kv_due()  # first: a failure later in the step must not leave a due timer in place
            self._release_held()
            self.ledger.expire(self.now)
            self._apply(self.policy.on_tick(self))
            self._flush()
        self.plan_due = False
        self.telemetry.decision(time.perf_counter() - t0)
        return self._op_seq - n

    def _apply(self, decisions) -> None:
        """The mechanism: decisions become books changes and ops."""
        apply(decisions, self)

    # ---- the Mechanism (core/decisions.py) --------------------------------------------------------
    def promote(self, d: Promote) -> None:
        self._promote(d.key, d.group, d.lease_id)

    def promote_host(self, d: PromoteHost) -> None:
        self._promote_host(d.key, d.node)

    def demote(self, d: Demote) -> None:
        self._demote(d.key, d.group, d.to)

    def cancel(self, d: Cancel) -> None:
        """Stop a load nobody waits for."""
        op_id = self.writer.get((d.key, gpu_tier(d.group)))
        if op_id is not None:
            self._close(self.ops[op_id], "cancelled", "nobody waits for it any more")

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
        if key[0] == "kv" and self.kv_tokens.get(key, 0) == 0:
            return
        per_gpu = self.size_of(key) / len(group)
        victims = self.plan_eviction(group, per_gpu, protect={(key, group)},
                                     allow=lambda v: self.policy.may_evict_for_prefetch(self, v, key))
        if victims is None or (background and victims):
            return
        for v in victims:
            self._demote(v.key, v.group, self.policy.demote_tier(self, v))
        src = self.best_source(key, group)
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
        if (key, node) in self.tiers.host or key[0] == "kv":
            return
        nbytes = self.size_of(key)
        if not self.tiers.alloc_host(node, nbytes):
            return
        hc = self.tiers.host[(key, node)] = HostCopy(key, node, nbytes, False, self.now)
        self._new_op("promote", key, f"nvme:{node}", f"host:{node}", nbytes, node)
        self._save_host(hc)

    def _demote(self, key, group, to: str, background: bool = False) -> None:
        c = self.tiers.gpu.get((key, group))
        if c is None or c.pins > 0 or not c.ready:
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
        self.tiers.remove_gpu_copy(c)
        self.store.delete_copy(key, gpu_tier(group))
        op = self._new_op("demote" if dst != "none" else "drop", key, gpu_tier(group), dst, c.nbytes, node,
                          background=background and dst != "none")
        if dst != "none":
            hc = self.tiers.host[(key, node)]
            if not hc.ready:
                self.writer[(key, dst)] = op.op_id
                self._save_host(hc, op.op_id)

    def _new_op(self, kind: str, key, src: str, dst: str, nbytes: float, node: str, lease: Lease | None = None,
                background: bool = False, order: int | None = None, version: int | None = None,
                epoch: int | None = None, not_before: float = 0.0, tries: int = 0) -> Op:
        """A new open op; `order`, `version`, `epoch` default to the next number and the state's now
        (`not_before`, `tries`: a held drop, `_drop_instead`)."""
        self._op_seq += 1
        op = Op(op_id=f"op{self._op_seq}", kind=kind, object=[str(x) for x in key], src=src, dst=dst, bytes=nbytes,
                epoch=self.epoch_of(key) if epoch is None else epoch,
                version=self.version_of(key) if version is None else version,
                deadline=lease.request.deadline_s if lease else None, lease_id=lease.lease_id if lease else None,
                background=background)
        self._bump()  # an adapter long-polling the plan must see it
        rec = self.ops[op.op_id] = OpRec(op, node, plan_version=self.plan_version,
                                         order=self._op_seq if order is None else order, tries=tries,
                                         not_before=not_before)
        self._on_link(op, +1)
        if kind == "promote":
            self.writer[(key, dst)] = op.op_id
        self._save_op(rec)
        return op

    def _bump(self) -> None:
        self.plan_version += 1
        self._save_meta()

    # ---- adapters ---------------------------------------------------------------------------------
    def plan_for(self, node: str, after: int) -> dict:
        """The open ops of one node, in the order to run them: the order they were made, except
        that a drop in place of a move out of HBM that did not land takes that move's place, ahead
        of the promotes planned into the room the move was to free."""
        if node not in self.cluster.node_by_name:
            raise NotFound(f"no node {node!r} in cluster {self.cluster.name!r}")
        ops = sorted((r for r in self.ops.values() if r.node == node and not r.not_before),  # held: `_release_held`
                     key=lambda r: r.order)
        if ops:
            with self.store.tx():
                for r in ops:
                    r.offered += 1
                    self._save_op(r)
        return {"version": self.plan_version, "ops": [r.op.model_dump() for r in ops]}

    def report(self, node: str, op_id: str, result: dict) -> dict:
        """An adapter's report. `done` with the op's version and epoch, while the books still hold
        them, commits; anything stale or cancelled is refused (Conflict) and undone. A refusal is
        committed before it is raised: the op is closed on disk as in memory."""
        refused = None
        with self.store.tx():
            rec = self.ops.get(op_id)
            if rec is None:
                return self._closed_report(node, op_id, result)
            if rec.node != node:
                raise Forbidden(f"op {op_id} belongs to node {rec.node}, not {node}")
            op, key = rec.op, _key(rec.op.object)
            if result["status"] == "done":
                if (result.get("version"), result.get("epoch")) != (op.version, op.epoch):
                    refused = (f"reported version/epoch {result.get('version')}/{result.get('epoch')} "
                               f"!= op's {op.version}/{op.epoch}")
                elif self._stale(op) and op.kind != "drop":
                    refused = (f"state moved on to version/epoch {self.version_of(key)}/{self.epoch_of(key)} "
                               f"while the op ran")
                if refused:
                    self._close(rec, "cancelled", refused, result)
                else:
                    self._commit(rec, result)
            else:
                self._close(rec, result["status"], result.get("error") or "reported " + result["status"], result)
            self._flush()
        self.plan_due = True
        if refused:
            raise Conflict(f"op {op_id}: {refused}")
        return {"op_id": op_id, "status": rec.status}

    def _stale(self, op: Op) -> bool:
        """The state `op` is about has moved on (another version, or epoch) since it was made."""
        key = _key(op.object)
        return (self.version_of(key), self.epoch_of(key)) != (op.version, op.epoch)

    def _closed_report(self, node: str, op_id: str, result: dict) -> dict:
        row = self.store.get_op(op_id)
        if row is None:
            raise NotFound(f"no op {op_id!r}")
        if row["node"] != node:
            raise Forbidden(f"op {op_id} belongs to node {row['node']}, not {node}")
        if row["status"] == result["status"] == "done" and (row["result"] or {}).get("checksum") == result.get("checksum"):
            return {"op_id": op_id, "status": "done", "duplicate": True}
        raise Conflict(f"op {op_id} is already {row['status']}" + (f": {row['reason']}" if row["reason"] else ""))

    def _commit(self, rec: OpRec, result: dict) -> None:
        op, key = rec.op, _key(rec.op.object)
        if op.kind == "promote" and op.dst.startswith("gpu:"):
            c = self.tiers.gpu[(key, _group(op.dst))]
            c.ready = True
            self._save_gpu(c)
            self.policy.on_copy_ready(self, c)
        elif op.dst.startswith("host:"):
            hc = self.tiers.host[(key, op.dst.split(":", 1)[1])]
            hc.ready = True
            self._save_host(hc)
            if key in self.swap_in_after:  # a tool-wait swap-in waited for this swap-out
                program, wait, group = self.swap_in_after.pop(key)
                self._kv_back(program, wait, key, group)
        links = self._op_links(op)
        moved = float(result.get("bytes", op.bytes))
        for link, b in links.items():  # the bytes really copied (0 if the target already held them)
            self.telemetry.moved(link, moved * b / op.bytes if op.bytes else 0.0)
        rec.status, rec.result = "done", result
        self._finish(rec)

    def _close(self, rec: OpRec, status: str, reason: str, result: dict | None = None,
               undo_source: bool = True) -> None:
        """An op ends without a commit: undo its target in the books (the copy it was writing);
        a demotion's source goes back into the books unless `undo_source` is off (the caller
        accounts for it)."""
        op, key = rec.op, _key(rec.op.object)
        mine = self.writer.get((key, op.dst)) == op.op_id  # undo only a target this op was writing
        if op.dst.startswith("gpu:") and mine:
            c = self.tiers.gpu.get((key, _group(op.dst)))
            if c is not None and not c.ready:
                self.tiers.remove_gpu_copy(c)
                self.store.delete_copy(key, op.dst)
        elif op.dst.startswith("host:") and mine:
            self.swap_in_after.pop(key, None)  # the swap-out it waited for will not land
            hc = self.tiers.host.get((key, op.dst.split(":", 1)[1]))
            if hc is not None and not hc.ready:
                self.tiers.remove_host_copy(hc)
                self.store.delete_copy(key, op.dst)
        if undo_source and op.src.startswith("gpu:") and (op.kind == "demote" or (op.kind == "drop" and status == "failed")):
            self._demote_undone(rec)  # the source is still in HBM: a move releases it only on commit
        rec.status, rec.reason, rec.result = status, reason, result
        self._finish(rec)
        self._bump()

    def _demote_undone(self, rec: OpRec) -> None:
        """A demotion failed or was cancelled (or a drop failed), so its source is still in HBM (a
        move releases it only on commit): back into the books if it still fits and is still
        wanted and current, else dropped (`_drop_instead`). A copy of an older version (a call
        grew the KV elsewhere, the catalog was reloaded) is never taken back as the current one."""
        op, key, group = rec.op, _key(rec.op.object), _group(rec.op.src)
        per_gpu = op.bytes / len(group)
        if key[0] == "kv" and key not in self.kv_tokens or self._stale(op):
            self._drop_instead(rec)  # its program ended, or the state moved on while it ran: it must go
            return
        back = self.tiers.gpu.get((key, group))
        if back is not None and not back.ready:
            # it is being promoted back onto that very group: the source never left, adopt it
            back.ready = True
            self._save_gpu(back)
            writer = self.writer.get((key, op.src))
            if writer is not None:
                self._finish_as(self.ops[writer], "cancelled", "its source never left HBM")
            self.policy.on_copy_ready(self, back)
            return
        if (key, group) not in self.tiers.gpu and self.tiers.alloc_gpu(group, per_gpu):
            c = GpuCopy(key, group, per_gpu, True, self.now, self.now)
            self.tiers.add_gpu_copy(c)
            self._save_gpu(c)
        else:
            self._drop_instead(rec)

    def _drop_instead(self, rec: OpRec) -> None:
        """Drop the source of `rec`, a move out of HBM that did not land or a drop that failed, in
        its place in the plan: ahead of the promotes planned into the room it was to free. A
        failed drop is sent again after 1 s, 2 s and 4 s (held, `not_before`: an engine busy with
        requests may refuse a release for a while, and one without per-program KV control refuses
        it at every poll); then the books let the copy go, with a warning, and the engine keeps it."""
        op, key = rec.op, _key(rec.op.object)
        if op.kind != "drop":
            self._new_op("drop", key, op.src, "none", op.bytes, rec.node, order=rec.order)
            return
        if rec.tries >= DROP_TRIES:
            log.warning("%s in %s: the engine failed %d drops (%s); the books let it go", list(key), op.src,
                        rec.tries + 1, rec.reason)
            return
        # sent again as the same drop (of the version it was, so that a copy out of date stays so),
        # held until its time: an open op, in the ledger, so a restart keeps it
        self._new_op("drop", key, op.src, "none", op.bytes, rec.node, order=rec.order, version=op.version,
                     epoch=op.epoch, not_before=self.now + DROP_RETRY_S * 2 ** rec.tries, tries=rec.tries + 1)

    def _finish_as(self, rec: OpRec, status: str, reason: str) -> None:
        """Close an op whose target is already settled in the books (nothing to undo)."""
        rec.status, rec.reason = status, reason
        self._finish(rec)
        self._bump()

    def _finish(self, rec: OpRec) -> None:
        del self.ops[rec.op.op_id]
        self._on_link(rec.op, -1)
        self.writer.pop((_key(rec.op.object), rec.op.dst), None)
        self._save_op(rec)
        self.telemetry.op(rec.status)

    # ---- views ------------------------------------------------------------------------------------
    def link_backlog(self) -> dict[str, float]:
        """Bytes the open ops still have to put on each link (all of an op's bytes until done),
        kept as ops open and close."""
        return {l: b for l, b in self.backlog.items() if b > 1.0}

    def _op_links(self, op: Op) -> dict[str, float]:
        if op.src == "none" or op.dst == "none":
            return {}
        out: dict[str, float] = {}
        srcs, dsts = _tiers(op.src), _tiers(op.dst)
        share = op.bytes / (len(srcs) * len(dsts))
        for s in srcs:
            for d in dsts:
                for link in self.cost.path(s, d):
                    out[link] = out.get(link, 0.0) + share
        return out

    def _on_link(self, op: Op, sign: float) -> None:
        for link, b in self._op_links(op).items():
            self.backlog[link] = self.backlog.get(link, 0.0) + sign * b

    def residency(self) -> dict:
        copies = []
        for (key, group), c in sorted(self.tiers.gpu.items(), key=lambda x: (x[0][1], x[0][0])):
            copies.append({"object": list(map(str, key)), "tier": gpu_tier(group), "bytes": c.nbytes, "ready": c.ready,
                           "version": self.version_of(key), "pins": c.pins})
        for (key, node), hc in sorted(self.tiers.host.items(), key=lambda x: (x[0][1], x[0][0])):
            copies.append({"object": list(map(str, key)), "tier": f"host:{node}", "bytes": hc.nbytes, "ready": hc.ready,
                           "version": self.version_of(key), "pins": 0})
        return {"plan_version": self.plan_version, "copies": copies, "open_ops": len(self.ops),
                "programs": Counter(r.status for r in self.programs.values()), "leases": self.ledger.counts(),
                "kv_tokens": {f"{k[1]}/{k[2]}": t for k, t in self.kv_tokens.items()},
                "tool_wait_kv": {"rule": self.kvw.rule, "actions": dict(self.kvw.actions),
                                 "suspended": [list(k) for k in sorted({tuple(map(str, k)) for (k, _), c in self.tiers.gpu.items()
                                                                      if c.suspended_since is not None})]}}

    # ---- durability ---------------------------------------------------------------------------------
    def _save_meta(self) -> None:
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
                          rec.result, rec.reason, rec.order, rec.not_before, rec.tries)

    def _save_program(self, rec: ProgramRec) -> None:
        self.store.put_program(rec.program, rec.tenant, dict(rec.__dict__))  # json copies it; no deepcopy

    def _flush(self) -> None:
        """Leases the ledger changed since the last flush go to disk."""
        for lid in sorted(self.ledger.changed):
            lease = self.ledger.leases[lid]
            self.store.put_lease(lid, lease.request.tenant, lease.request.program, lease.state.name.lower(),
                                 _lease_body(lease, self.policy.group_of.get(lid)))
        self.ledger.changed.clear()

    def _restore(self) -> None:
        """Rebuild the books from disk after a restart. Open ops are offered again (an adapter that
        already ran one reports its result again; it never runs it twice); ops of leases that are
        no longer live are cancelled. The predictor starts afresh (soft state: it relearns)."""
        s = self.store
        self.plan_version = s.get_meta("plan_version", 0)
        self._op_seq = s.get_meta("op_seq", 0)
        self.catalog_epoch = s.get_meta("catalog_epoch", 1)
        self.kv_tokens = s.kv()
        for body in s.programs():
            body = dict(body)
            if "tool" in body:  # books written before threads: one tool wait, on the main thread
                old = body.pop("tool")
                body["tools"] = {MAIN_THREAD: old} if old else {}
            rec = self.programs[body["program"]] = ProgramRec(**body)
            self.tenant_service[rec.tenant] += rec.service_s
            if rec.status == "running":
                self.running[rec.program] = rec
                self.policy.on_program_start(self, _Prog(rec.program, rec.tenant))
        finished = [r for r in self.programs.values() if r.status == "finished"] if self.queue == "auto" else []
        for rec in sorted(finished, key=lambda r: r.ended_s or 0.0):
            self.sizes.observe(rec.service_s, rec.ended_s or 0.0)  # in the order they finished
        if finished:
            self.publish_sizes()
        for row in s.copies():
            key, tier = row["key"], row["tier"]
            if key[0] == "e":
                key = (key[0], key[1], int(key[2]))
            if tier.startswith("gpu:"):
                group = _group(tier)
                per_gpu = row["bytes"] / len(group)
                self.tiers.alloc_gpu(group, per_gpu)
                self.tiers.add_gpu_copy(GpuCopy(key, group, per_gpu, row["ready"], row["last_use"], row["last_use"]))
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
            for call in rec.calls.values():
                if call["status"] == "started" and call["group"] is not None:
                    group = tuple(call["group"])
                    self.running_models[(call["model"], group)] += 1
                    for key in [weights_key(call["model"]), kv_key(rec.program, call["model"])]:
                        c = self.tiers.gpu.get((key, group))
                        if c is not None:
                            c.pins += 1
        with s.tx():
            for row in s.ops("open"):
                op = Op(**row["op"])
                rec = self.ops[op.op_id] = OpRec(op, row["node"], "open", row["offered"], row["plan_version"],
                                                 order=row["order"], not_before=row["not_before"],
                                                 tries=row["tries"])
                self._on_link(op, +1)
                key = _key(op.object)
                if op.kind == "promote":
                    self.writer[(key, op.dst)] = op.op_id
                elif op.dst.startswith("host:"):
                    self.writer[(key, op.dst)] = op.op_id
            for rec in list(self.ops.values()):
                lease = self.ledger.leases.get(rec.op.lease_id) if rec.op.lease_id else None
                if lease is not None and not lease.state.live:
                    self._close(rec, "cancelled", f"lease {lease.lease_id} is {lease.state.name.lower()}")
            self.ledger.changed.clear()
            for rec in self.programs.values():
                if rec.status == "running" and rec.tools and not self._busy(rec):
                    self._resume_tool_wait(rec)
            self._bump()  # adapters polling with the old version see the open ops again

    def _resume_tool_wait(self, rec: ProgramRec) -> None:
        """After a restart, a tool wait that goes on is taken up where it is (its timers were not on
        disk): a KV still in HBM is judged on the wait still expected, one swapped out to host DRAM
        gets its swap-in again, on the thread whose wait began last (the one that left the program
        idle). The rule's counts and predictions start afresh, as at any restart."""
        for th, (tool, since, _) in rec.tools.items():
            self.kv_waits[(rec.program, th)] = self.kvw.started(tool)
        thread = max(rec.tools, key=lambda th: rec.tools[th][1])
        tool, since, _ = rec.tools[thread]
        left = self.kvw.remaining(tool, self.now - since) if self.kv_waits[(rec.program, thread)] is not None else None
        for c in self._kv_copies(rec.program):  # (a KV whose swap-out is open has left the books' HBM)
            self.kvw.suspended(c.key, tool)
            c.suspended_since = since  # held since the wait began: a preserve is not counted again
            self._suspend_kv(rec, c, left, thread)
        for kvk in self._kv_keys(rec.program):
            group = next((tuple(call["group"]) for call in reversed(list(rec.calls.values()))
                          if call["model"] == kvk[2] and call["group"] is not None), None)
            if kvk not in self.kv_tokens or kvk in self.tiers.groups_of or group is None or \
                    (kvk, self.gpus[group[0]].node) not in self.tiers.host:
                continue
            at = self.kvw.swap_in_at(tool, kvk[2], self.tiers.host[(kvk, self.gpus[group[0]].node)].nbytes, left,
                                     host_link_bps(self, group), self.now)
            if at is not None:
                self.kvw.suspended(kvk, tool)
                self._kv_timer(at, "swap_in", rec, thread, kvk, group)


def _waiting_thread(rec: ProgramRec, tid: str | None) -> str | None:
    """The thread whose running tool wait is the tool call `tid`, if any."""
    return next((th for th, w in rec.tools.items() if tid is not None and w[2] == tid), None)


def _key(obj) -> tuple:
    return (obj[0], obj[1], int(obj[2])) if obj[0] == "e" else tuple(obj)


def _group(tier: str) -> tuple[int, ...]:
    return tuple(int(x) for x in tier.split(":", 1)[1].split(","))


def _tiers(tier: str) -> list[str]:
    """A group tier `gpu:0,1` as the per-GPU tiers the cost model's paths know."""
    if tier.startswith("gpu:"):
        return [f"gpu:{i}" for i in _group(tier)]
    return [tier]


def _lease_body(lease: Lease, group) -> dict:
    return {"lease_id": lease.lease_id, "request": asdict(lease.request),
            "quote": {**asdict(lease.quote), "objects": [list(k) for k in lease.quote.objects]},
            "state": lease.state.name, "objects": [[list(k), v] for k, v in lease.objects.items()],
            "created_s": lease.created_s, "ready_s": lease.ready_s, "ended_s": lease.ended_s, "reason": lease.reason,
            "group": list(group) if group else None}


def _lease_from(body: dict) -> Lease:
    q = body["quote"]
    quote = Quote(**{**q, "objects": tuple(_key(k) for k in q["objects"])})
    lease = Lease(body["lease_id"], LeaseRequest(**body["request"]), LeaseState[body["state"]], quote, body["created_s"],
                  {_key(k): v for k, v in body["objects"]}, body["ready_s"], body["ended_s"], body["reason"])
    return lease
