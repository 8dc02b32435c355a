"""Programs and their calls as the live planner keeps them, and the runtime events that move them.

A program runs until it finishes or is cancelled (a cancel bumps its epoch, so events and
reports of the old epoch are refused). Each call moves forward only:

    arrived ──▶ started ──▶ finished          (a retry: a higher attempt arrives again)
       └──────────┴──────▶ cancelled         (by the runtime, or by its program's end)

Threads of a fork/join program wait on tools side by side; `tools` holds each thread's running
tool wait, `effects` the side effects by idempotency key, so a retried tool call never repeats one.
The records are saved to the ledger as JSON (`persist.py`): the enums below serialise as their
plain string values, so a ledger holds plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from ..models.state import kv_key, weights_key
from ..models.trace import DEFAULT_MAX_TOKENS, MAIN_THREAD
from ..core import kvwait
from ..core.books import GpuCopy
from ..core.estimates import OutputEstimate
from ..policies.baselines import place_model
from .errors import Conflict, Invalid, NotFound
from .journal import OpStatus, gpu_tier
from .results import CallAck, CallReady, CallStartedAck, EffectDone, ProgramAck, ToolAck



def scoped(tenant: str, program: str) -> str:
    """The planner's id of a tenant's program whose id another tenant took first: the tenant's
    namespace, then the runtime's id. Neither holds `#` (the API's id pattern), so it never
    meets a bare id, and tenants never share a program; ops and the residency report name
    programs by the planner's id."""
    return f"{tenant}#{program}"


def unscoped(program: str) -> str:
    """The runtime's id of a planner program id (`scoped` undone)."""
    return program.split("#", 1)[1] if "#" in program else program

class ProgramStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


def asked_tokens(call: dict) -> int:
    """The KV room a call asked for: its context and `max_tokens` (the simulator's too)."""
    return call.get("context_tokens", 0) + call.get("max_tokens", DEFAULT_MAX_TOKENS)


class CallStatus(StrEnum):
    ARRIVED = "arrived"
    STARTED = "started"
    FINISHED = "finished"
    CANCELLED = "cancelled"


class CallRow(TypedDict, total=False):
    """One call of a program (a dict: it is saved to the ledger as it is). Optional keys are
    read with `.get` and a default."""
    model: str
    status: CallStatus
    attempt: int
    arrived_s: float
    group: list[int] | None     # the GPU group it runs on, once started
    handoff: bool               # its program's previous call ran another model
    path_in_s: float            # attained service of the critical path into it
    service_s: float            # seconds its attempts ran
    path_s: float               # path_in_s + service_s, once it stopped
    ttft_s: float | None        # its TTFT bound, seconds after arrival
    context_tokens: int
    max_tokens: int             # what the runtime asked the engine for (its output is known at its end only)
    stall_s: float
    started_s: float


@dataclass
class ProgramRec:
    """A program: its tenant, epoch and status, its calls by id, and its threads' tool waits."""
    program: str
    tenant: str
    epoch: int = 0
    status: ProgramStatus = ProgramStatus.RUNNING
    calls: dict[str, CallRow] = field(default_factory=dict)
    last_model: str | None = None
    tools: dict = field(default_factory=dict)  # thread -> its running tool wait: [tool, since, tool call id or None]
    service_s: float = 0.0    # attained service: seconds its calls ran, failed attempts included
    tools_over: list = field(default_factory=list)  # tool call ids finished or superseded by a retry
    tools_done: list = field(default_factory=list)  # ... of those, the ones whose result was taken
    # A tool's side effect by its idempotency key: {call, thread, state: running | done, result}.
    # A running entry counts only while its tool call still waits on its thread.
    effects: dict = field(default_factory=dict)
    ended_s: float | None = None  # when it finished or was cancelled

    def __post_init__(self):
        self.status = ProgramStatus(self.status)
        for call in self.calls.values():
            call["status"] = CallStatus(call["status"])


@dataclass
class HookProgram:
    """A program as the policy hooks see it. `resumed`: it ran before a restart (no new start),
    with the model its latest call asked for and its running tool waits, (tool, since) each."""
    program: str
    tenant: str
    resumed: bool = False
    last_model: str | None = None
    waits: tuple = ()


@dataclass
class HookCall:
    """A call as the policy hooks see it (`node` is the call's id in its program). `max_tokens` is
    what the runtime asked for: what the call will write is not known before it ends (DESIGN.md §5;
    the planner's `output_estimate` learns it from the calls that finished)."""
    program: str
    node: str
    model: str
    context_tokens: int = 0
    max_tokens: int = DEFAULT_MAX_TOKENS
    arrive: float = 0.0  # the hooks' calls here have all arrived (the simulator's CallRec: -1 until then)


def waiting_thread(rec: ProgramRec, tid: str | None) -> str | None:
    """The thread whose running tool wait is the tool call `tid`, if any."""
    return next((th for th, w in rec.tools.items() if tid is not None and w[2] == tid), None)


class ProgramEvents:
    """The runtime events of DESIGN.md §7, as a part of `LivePlanner` (`event` dispatches to the
    handlers here, inside its transaction). Each handler checks everything before it changes
    anything, so a refusal (NotFound, Forbidden, Conflict, Invalid) leaves the books as they were."""

    @property
    def output_estimate(self) -> OutputEstimate:
        """The per-model estimate of a call's output, fed by `call_finished` events that carry
        `output_tokens` (not persisted: after a restart it learns again from its prior), and of
        the room calls ask for, fed by every `call_finished` (learnt again from the ledger)."""
        est = getattr(self, "_output_estimate", None)
        if est is None:
            est = self._output_estimate = OutputEstimate()
        return est

    def _program(self, tenant: str, program: str, epoch: int | None) -> ProgramRec:
        """The program an event or lease names, in the tenant's namespace, if the epoch is current.
        Another tenant's program of the same name is another program: not found, as one that
        does not exist (no answer tells a tenant which ids others use)."""
        rec = self._find_program(tenant, program)
        if rec is None:
            raise NotFound(f"program {program!r} was never started (send program_started first)")
        if epoch is not None and epoch != rec.epoch:
            raise Conflict(f"program {program!r} is at epoch {rec.epoch}; an event of epoch {epoch} is stale")
        return rec

    def _find_program(self, tenant: str, program: str) -> ProgramRec | None:
        rec = self.programs.get(program)
        if rec is not None and rec.tenant == tenant:
            return rec
        return self.programs.get(scoped(tenant, program))

    def _live(self, rec: ProgramRec, what: str) -> None:
        if rec.status != ProgramStatus.RUNNING:
            raise Conflict(f"program {unscoped(rec.program)!r} is {rec.status}: no {what} after that")

    def _program_started(self, tenant: str, program: str) -> ProgramAck:
        rec = self._find_program(tenant, program)
        if rec is not None:
            return ProgramAck(program, rec.epoch, rec.status)  # a retried start
        # the first tenant to use an id keeps it bare; another one's is namespaced (`scoped`)
        pid = program if program not in self.programs else scoped(tenant, program)
        rec = self.programs[pid] = self.running[pid] = ProgramRec(pid, tenant)
        self.policy.on_program_start(self, HookProgram(pid, tenant))
        self._save_program(rec)
        return ProgramAck(program, 0, ProgramStatus.RUNNING)

    def _call_of(self, rec: ProgramRec, ev: dict) -> CallRow:
        """The call an event is about, at the attempt it names (default: the current one)."""
        call = rec.calls.get(ev["call"])
        if call is None:
            raise NotFound(f"call {ev['call']!r} of program {unscoped(rec.program)!r} never arrived (send call_arrived first)")
        attempt = ev.get("attempt", call["attempt"])
        if attempt != call["attempt"]:
            raise Conflict(f"call {ev['call']!r} is at attempt {call['attempt']}; an event of attempt {attempt} is stale")
        return call

    def _call_arrived(self, rec: ProgramRec, ev: dict) -> CallAck:
        self._live(rec, "new call")
        model = ev["model"]
        if model not in self.catalog.by_name:
            raise Invalid(f"unknown model {model!r}; the catalog has {sorted(self.catalog.by_name)}")
        attempt = ev.get("attempt", 0)
        call = rec.calls.get(ev["call"])
        if call is not None:
            if model != call["model"]:
                raise Conflict(f"call {ev['call']!r} arrived on model {call['model']!r}; a call id is one call "
                               f"(a retry, or a repeat, names the same model): give this one its own id")
            if attempt == call["attempt"]:
                return CallAck(ev["call"], call["status"], attempt)  # a repeated event
            if attempt < call["attempt"]:
                raise Conflict(f"call {ev['call']!r} is at attempt {call['attempt']}; attempt {attempt} is stale")
            if call["status"] == CallStatus.FINISHED:
                raise Conflict(f"call {ev['call']!r} already finished (attempt {call['attempt']}): a logical call "
                               f"commits once")
            if call["status"] == CallStatus.CANCELLED:
                raise Conflict(f"call {ev['call']!r} was cancelled: its branch does not run again")
        for dep in ev.get("after") or ():  # every check before the first change: a refusal changes nothing
            d = rec.calls.get(dep)
            if d is not None and d["status"] == CallStatus.CANCELLED:
                raise Conflict(f"call {ev['call']!r} cannot arrive: its dependency {dep!r} was cancelled (a cancel "
                               f"takes the calls after it too)")
            if d is None or d["status"] != CallStatus.FINISHED:
                raise Conflict(f"call {ev['call']!r} cannot arrive before its dependency {dep!r} has finished")
        if call is not None:
            self._unpin(rec, call)  # a retry: the old attempt's hold on its state goes
        deps = [rec.calls[d] for d in ev.get("after") or ()]
        path_in = max((d.get("path_s", 0.0) for d in deps), default=0.0)
        service = call.get("service_s", 0.0) if call is not None else 0.0  # a retry keeps what it attained
        rec.calls[ev["call"]] = {"model": model, "status": CallStatus.ARRIVED, "arrived_s": self.now, "group": None,
                                 "handoff": rec.last_model is not None and rec.last_model != model, "attempt": attempt,
                                 "path_in_s": path_in, "service_s": service, "ttft_s": ev.get("ttft_s"),
                                 "context_tokens": ev.get("context_tokens", 0),
                                 "max_tokens": ev.get("max_tokens", DEFAULT_MAX_TOKENS)}
        self._arrived(rec, ev["call"])
        self.kvw.outcome(kv_key(rec.program, model), True)
        self._keep_kv(kv_key(rec.program, model))
        self.policy.on_call_arrive(self, HookCall(rec.program, ev["call"], model, ev.get("context_tokens", 0),
                                                  ev.get("max_tokens", DEFAULT_MAX_TOKENS)))
        self._save_program(rec)
        return CallAck(ev["call"], CallStatus.ARRIVED, attempt, priority=self._priority(rec, rec.calls[ev["call"]]))

    def _call_cancelled(self, rec: ProgramRec, ev: dict) -> CallAck:
        """The runtime abandons a call (a branch it no longer needs): its hold on its
        state goes, its leases stop, a result it still reports is late, and no call after it may
        arrive (the cancel takes its descendants). Its program's KV stays for the other branches."""
        self._live(rec, "call cancel")
        call = self._call_of(rec, ev)
        if call["status"] == CallStatus.FINISHED:
            raise Conflict(f"call {ev['call']!r} already finished: a committed call cannot be cancelled")
        if call["status"] == CallStatus.CANCELLED:
            return CallAck(ev["call"], CallStatus.CANCELLED)  # a repeated event
        self._unpin(rec, call, accrue=False)  # an abandoned run is no service (as in the simulator)
        call["status"] = CallStatus.CANCELLED
        self._left(rec, ev["call"])
        self._apply(self.policy.on_call_cancelled(self, HookCall(rec.program, ev["call"], call["model"])))
        self._save_program(rec)
        return CallAck(ev["call"], CallStatus.CANCELLED)

    def call_ready(self, tenant: str, program: str, call: str) -> CallReady:
        """Whether an arrived call's model has a ready weights copy (an awake engine with its
        weights in HBM), and where: the group `call_started` would run it on. A gateway holds
        the request until this says ready. Raises NotFound for a program or call never seen."""
        rec = self._program(tenant, program, None)
        row = self._call_of(rec, {"call": call})
        if row["status"] == CallStatus.STARTED and row["group"]:
            group = tuple(row["group"])
        else:
            group = self.ready_group(row["model"], rec.program)
        node = self.cluster.gpus[group[0]].node if group else None
        return CallReady(call, row["status"], group is not None and row["status"] in (CallStatus.ARRIVED, CallStatus.STARTED),
                         gpu_tier(group) if group else None, node)

    def ready_group(self, model: str, program: str) -> tuple[int, ...] | None:
        """Of the ready copies of `model`'s weights, the group a call of `program` starts on: the
        one holding the program's KV (ready or being restored there, as `place_model` places a
        lease and the simulator's `restore_estimate_s` counts it), then the one running the fewest
        calls of the model (its engine has the most free slots), then the most recently used;
        None if none is ready."""
        held = [c for c in self.copies_of(model) if c.ready]
        if not held:
            return None
        kvk, gpu = kv_key(program, model), self.tiers.gpu
        return max(held, key=lambda c: ((kvk, c.group) in gpu, -self.running_models.get((model, c.group), 0),
                                        c.last_use)).group

    def start_group(self, model: str, program: str) -> tuple[int, ...] | None:
        """The GPU group a call of `model` starts on now: `ready_group` (the copy `call_ready`
        names), else where a prefetch for `program` would go (`place_model`); None if it fits no
        group."""
        return self.ready_group(model, program) or place_model(self, model, program)

    def _call_started(self, rec: ProgramRec, ev: dict) -> CallAck | CallStartedAck:
        self._live(rec, "call start")
        call = self._call_of(rec, ev)
        if call["status"] == CallStatus.CANCELLED:
            raise Conflict(f"call {ev['call']!r} was cancelled: it does not start")
        if call["status"] != CallStatus.ARRIVED:
            return CallAck(ev["call"], call["status"])
        model = call["model"]
        group = self.start_group(model, rec.program)
        stall = self.now - call["arrived_s"]
        self.telemetry.stall(stall, call["handoff"])
        call.update(status=CallStatus.STARTED, group=list(group) if group else None, stall_s=stall, started_s=self.now)
        self._left(rec, ev["call"])
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
            self.policy.on_call_admitted(self, HookCall(rec.program, ev["call"], model))
        self._save_program(rec)
        return CallStartedAck(ev["call"], CallStatus.STARTED, stall, gpu_tier(group) if group else None)

    def _unpin(self, rec: ProgramRec, call: dict, accrue: bool = True) -> tuple | None:
        """A started attempt stops (finished, retried, or its program ended): its running time is
        attained service (unless `accrue` is off: an abandoned branch), and its hold on its state goes."""
        if call["status"] != CallStatus.STARTED:
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

    def _call_finished(self, rec: ProgramRec, ev: dict) -> CallAck:
        call = self._call_of(rec, ev)
        if call["status"] == CallStatus.CANCELLED:
            raise Conflict(f"the result of call {ev['call']!r} is late: it was cancelled"
                           + (f" with program {unscoped(rec.program)!r}" if rec.status == ProgramStatus.CANCELLED else ""))
        if call["status"] not in (CallStatus.ARRIVED, CallStatus.STARTED):
            return CallAck(ev["call"], call["status"])  # a repeated result commits nothing
        group = self._unpin(rec, call)
        call.setdefault("path_s", call.get("path_in_s", 0.0) + call.get("service_s", 0.0))
        call["status"] = CallStatus.FINISHED
        call["ended_s"] = self.now
        self._left(rec, ev["call"])
        model = call["model"]
        if ev.get("output_tokens") is not None:  # what it wrote: known now that it has ended
            self.output_estimate.observe(model, ev["output_tokens"])
        self.output_estimate.observe_asked(model, asked_tokens(call))
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
                self._close(mv, OpStatus.CANCELLED, "the call grew this KV in place", undo_source=False)
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
        self._apply(self.policy.on_call_end(self, HookCall(rec.program, ev["call"], model)))
        self._save_program(rec)
        return CallAck(ev["call"], CallStatus.FINISHED, kv_version=self.kv_tokens.get(kvk, 0))

    def _tool_started(self, rec: ProgramRec, ev: dict) -> ToolAck | EffectDone:
        """A tool wait begins on a thread (default `main`). Threads of a fork/join program wait on
        tools side by side; a new tool call on a thread that still waits is a retry of it.

        `effect` is the idempotency key of the tool's side effect (a payment, a delete, a message
        sent). Once a result with that key has been taken (and not `ok: false`), a
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
                return EffectDone(ev["tool"], "done", key, e["call"], e["result"])
            if e is not None and e["call"] != tid and e["thread"] != thread and waiting_thread(rec, e["call"]) is not None:
                raise Conflict(f"side effect {key!r} of program {unscoped(rec.program)!r} is in flight as tool call "
                               f"{e['call']!r} on thread {e['thread']!r}: running it again would repeat it; await "
                               f"that call's result")
        if tid is not None and tid in rec.tools_over:
            raise Conflict(f"tool call {tid!r} of program {unscoped(rec.program)!r} is over (finished, or retried under "
                           f"another id): a repeated start is stale")
        if (th := waiting_thread(rec, tid)) is not None:
            return ToolAck(rec.tools[th][0], "started")  # a repeated event: nothing changes
        old = rec.tools.get(thread)
        if old is not None and old[2] is not None:
            rec.tools_over.append(old[2])  # a retry supersedes the thread's running tool call
        rec.tools[thread] = [ev["tool"], self.now, tid]
        if key is not None:  # (a retry on the same thread takes the key over)
            rec.effects[key] = {"call": tid, "thread": thread, "state": "running", "result": None}
        self._apply(self.policy.on_tool_start(self, HookProgram(rec.program, rec.tenant), None, ev["tool"]))
        self._tool_wait_kv(rec, thread)
        self._save_program(rec)
        return ToolAck(ev["tool"], "started")

    def _tool_finished(self, rec: ProgramRec, ev: dict) -> ToolAck:
        """A tool result: matched by its tool call id where it has one (a result nobody awaits is
        late), else by its thread. A result for a program that ended is late too, epoch or not."""
        tool, tid = ev["tool"], ev.get("call")
        if tid is not None and tid in rec.tools_done:  # a repeated delivery of a result already taken
            return ToolAck(tool, "finished", repeated=True)
        if rec.status != ProgramStatus.RUNNING:
            raise Conflict(f"tool result {tid or tool!r} of program {unscoped(rec.program)!r} is late: the program is "
                           f"{rec.status}")
        if tid is not None:
            thread = waiting_thread(rec, tid)
            if thread is None:
                raise Conflict(f"tool result {tid!r} of program {unscoped(rec.program)!r} is late: that tool is no "
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
        # another thread still waiting keeps the program's KV suspended (as in the simulator)
        kvwait.tool_ended(self, rec, w[0] if w is not None else None, duration,
                          self.kv_waits.pop((rec.program, thread), None) if w is not None else None, bool(rec.tools))
        self.policy.on_tool_end(self, HookProgram(rec.program, rec.tenant), None, tool, duration)
        self._save_program(rec)
        return ToolAck(tool, "finished", duration, effect)

    def _program_finished(self, rec: ProgramRec, ev: dict) -> ProgramAck:
        return self._end_program(rec, ProgramStatus.FINISHED)

    def _program_cancelled(self, rec: ProgramRec, ev: dict) -> ProgramAck:
        return self._end_program(rec, ProgramStatus.CANCELLED)

    def _end_program(self, rec: ProgramRec, status: ProgramStatus) -> ProgramAck:
        """Finish or cancel: live leases stop, calls unpin, every KV of the program is released.
        A cancel bumps the epoch, so late reports and events of the old epoch are refused."""
        if rec.status != ProgramStatus.RUNNING:
            return ProgramAck(unscoped(rec.program), rec.epoch, rec.status)
        self.telemetry.program_ended(status)
        if status == ProgramStatus.CANCELLED:
            rec.epoch += 1
        rec.status, rec.ended_s = status, self.now
        self.running.pop(rec.program, None)
        stopped = []
        for lease in list(self.ledger.leases.values()):
            if lease.request.program == rec.program and lease.state.live:
                stopped.append((lease.lease_id, self.ledger.cancel(lease.lease_id, self.now, f"program {status}")))
        decisions = self.policy.stop_leases(self, stopped)
        for cid, call in rec.calls.items():
            self._unpin(rec, call)
            self._left(rec, cid)
            if call["status"] in (CallStatus.ARRIVED, CallStatus.STARTED):
                call["status"] = CallStatus.CANCELLED  # it never finished: the program's end abandons it
        for thread in rec.tools:
            self.kv_waits.pop((rec.program, thread), None)
        for kvk in self._kv_keys(rec.program):
            self.kvw.outcome(kvk, False)
            self.swap_in_after.pop(kvk, None)
            decisions += self._drop_all(kvk)
            if self.kv_tokens.pop(kvk, None) is not None:
                self.store.delete_kv(rec.program, kvk[2])
        if status == ProgramStatus.FINISHED and self.queue == "auto":
            self._judge_size(rec)  # once the calls it ended have added their service
        self.policy.on_program_end(self, HookProgram(rec.program, rec.tenant))
        self._apply(decisions)
        self._save_program(rec)
        return ProgramAck(unscoped(rec.program), rec.epoch, status)

