"""The waiting calls as a part of `LivePlanner`: their order (the queue discipline's key,
`core/programs.py`, the simulator's, with the inputs the live planner knows), and the admission
queue and running calls per GPU that tell the planner it is past capacity (`planner/overload.py`)."""

from __future__ import annotations

from ..core.programs import AGING, arrival_priority, queue_key, tenant_excess
from ..models.state import kv_key
from ..models.trace import DEFAULT_MAX_TOKENS
from .errors import Invalid
from .programs import CallRow, CallStatus, ProgramRec, ProgramStatus, unscoped
from .results import QueueView, WaitingCall


class QueueOrder:
    """Priorities given at arrival, the live queue order, and what `auto` judges."""

    def _priority(self, rec: ProgramRec, call: CallRow) -> int:
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

    def _key_inputs(self, rec: ProgramRec, call: CallRow, now: float) -> tuple:
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

    def waiting_calls(self, model: str | None = None, tenant: str | None = None) -> QueueView:
        """The calls that arrived and have not started, in the order the queue discipline gives
        them now: the simulator's `queue_key` (with the inputs the service knows, `_key_inputs`;
        ties by program and call, as there), evaluated at this instant, so unlike the fixed
        `priority` of `call_arrived` it follows the starvation promotion, the slack that shrinks
        as a call waits, and service the program attained since (another thread finished). For
        a runtime or gateway that holds calls and picks the next one itself. `model`: only
        calls on that model; `tenant`: only that tenant's calls (their `rank` stays the one
        among every tenant's).

        Called by GET /v1/queue. Returns the discipline and the calls, first to start first.
        Raises Invalid for a model the catalog does not have."""
        if model is not None and model not in self.catalog.by_name:
            raise Invalid(f"unknown model {model!r}; the catalog has {sorted(self.catalog.by_name)}")
        now, rows, queue = self.now, [], self.sizes.discipline(self.queue)
        for rec in self.running.values():
            for cid, call in rec.calls.items():
                if call["status"] != CallStatus.ARRIVED or model not in (None, call["model"]):
                    continue
                key = queue_key(queue, call["arrived_s"], now, *self._key_inputs(rec, call, now))
                rows.append((key + (rec.program, cid), rec, cid, call))
        rows.sort(key=lambda r: r[0])
        calls = [WaitingCall(i, unscoped(rec.program), cid, call["model"], call.get("attempt", 0), now - call["arrived_s"],
                             queue != "fcfs" and key[0] == 0)
                 for i, (key, rec, cid, call) in enumerate(rows) if tenant in (None, rec.tenant)]
        if self.queue == "auto":
            return QueueView(self.queue, calls, queue, self.sizes.cv)
        return QueueView(self.queue, calls)

    def _arrived(self, rec: ProgramRec, cid: str) -> None:
        """Index a call that arrived (`_call_arrived`, and `_restore` for a ledger's waiting
        calls): the admission queue is read at every planning step and lease, so it reads this
        index, not every call of every running program. An entry whose call has moved on leaves at
        once (`_left`); the read drops any that did not."""
        self.arrivals[(rec.program, cid)] = (rec, rec.calls[cid])

    def _left(self, rec: ProgramRec, cid: str) -> None:
        """A call started, finished or was cancelled, or its program ended: out of the index (read
        or not: with the overload mode off nothing reads it)."""
        self.arrivals.pop((rec.program, cid), None)

    def admission_queue(self) -> list[tuple[str, tuple[int, ...], float, float]]:
        """(model, group, expected run seconds, seconds waited) of each call that arrived and has
        not started: the service's admission queue (`ResidencyView`, `planner/overload.py`).

        A call waits here until its runtime reports it started, which a gateway does once its
        weights are ready (`call_ready`); a call its engine queues after that counts as running.
        The service places a call only when it starts, so a waiting call is counted on the group
        it would start on now (`start_group`): its model's ready weights, else where a lease for
        it would prepare them. The run is the cost model's prefill of its whole context and decode
        of the output estimate (what finished calls wrote, never this call's output: it is not
        known before it ends), as the simulator's; a call that fits no group is left out."""
        now, out, gone = self.now, [], []
        # `start_group` depends on the program only where its KV is in HBM: asked once per model else
        where: dict[tuple, tuple | None] = {}
        memo = self._run_memo
        if len(memo) > 10_000:  # the output estimate drifts, so keys accumulate: bound the memory
            memo.clear()
        for k, (rec, call) in self.arrivals.items():
            if call["status"] != CallStatus.ARRIVED or rec.status != ProgramStatus.RUNNING or rec.calls.get(k[1]) is not call:
                gone.append(k)
                continue
            model = call["model"]
            at = (model, rec.program if kv_key(rec.program, model) in self.tiers.groups_of else None)
            if at not in where:
                where[at] = self.start_group(model, rec.program)
            group = where[at]
            if group is None:
                continue
            key = (model, group, call.get("context_tokens", 0),
                   self.output_estimate.expected(model, call.get("max_tokens", DEFAULT_MAX_TOKENS)))
            run = memo.get(key)
            if run is None:
                run = memo[key] = self.cost.call_s(self.catalog.by_name[model], key[2], key[3], group)
            out.append((model, group, run, now - call["arrived_s"]))
        for k in gone:
            del self.arrivals[k]
        return out

    @property
    def running_on(self) -> list[int]:
        """Per GPU: the calls started and not yet finished on a group that holds it (the books'
        `running_models`); what the admission queue's work is divided by."""
        n = [0] * len(self.gpus)
        for (_, group), k in self.running_models.items():
            for i in group:
                n[i] += k
        return n

    def _judge_size(self, rec: ProgramRec) -> None:
        """`auto`: a finished program's service joins what the queue judges the tail on."""
        self.sizes.observe(rec.service_s, rec.ended_s or 0.0)
        self.publish_sizes()

    def publish_sizes(self) -> None:
        """Tell the telemetry what `auto` judges now (its CV, the discipline it orders by). Called
        after each finished program under `auto`, and by the app factory at start."""
        self.telemetry.program_sizes(self.sizes.cv, self.sizes.discipline(self.queue))

