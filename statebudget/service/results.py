"""What the live planner's public methods return: small frozen types, one per answer shape.

`body()` is the JSON the API sends (field names are the wire names). A field declared with
`OPTIONAL` is left out of the body while it is None: an answer that has nothing to say about it
(a repeated event, for instance) does not send it. The plan, op and lease answers are the
pydantic models of `models/` (`Plan`, `OpAck`, `LeasePublic`), which the API sends as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from functools import cache
from typing import Any

OPTIONAL = {"optional": True}


def optional(default=None):
    """A field left out of `body()` while it is None."""
    return field(default=default, metadata=OPTIONAL)


@cache
def _wire_fields(cls) -> tuple[tuple[str, bool], ...]:
    return tuple((f.name, bool(f.metadata.get("optional"))) for f in fields(cls))


def _plain(v):
    if isinstance(v, Result):
        return v.body()
    if isinstance(v, Enum):  # a status enum goes on the wire as its plain string
        return v.value
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class Result:
    """Base of the answers: `body()` for the wire."""

    def body(self) -> dict[str, Any]:
        out = {}
        for name, opt in _wire_fields(type(self)):
            v = getattr(self, name)
            if v is None and opt:
                continue
            out[name] = _plain(v)
        return out


# ---- POST /v1/events ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ProgramAck(Result):
    """program_started, program_finished, program_cancelled: the program's status and epoch."""
    program: str
    epoch: int
    status: str


@dataclass(frozen=True)
class CallAck(Result):
    """call_arrived, call_cancelled, call_finished, and a call_started that started nothing:
    the call's status; `attempt` and `priority` (arrived: the engine's priority, ms, lower
    first), `kv_version` (finished: the KV's token count) where the event set them."""
    call: str
    status: str
    attempt: int | None = optional()
    priority: int | None = optional()
    kv_version: int | None = optional()


@dataclass(frozen=True)
class CallStartedAck(Result):
    """call_started: how long it waited and the GPU group it runs on (None: none holds it)."""
    call: str
    status: str
    stall_s: float
    group: str | None


@dataclass(frozen=True)
class CallReady(Result):
    """GET /v1/programs/{program}/calls/{call}: whether the call can start now, and on which GPU
    group (`gpu:0,1`) and node its model's weights are ready (None: nowhere yet)."""
    call: str
    status: str
    ready: bool
    group: str | None
    node: str | None


@dataclass(frozen=True)
class ToolAck(Result):
    """tool_started, tool_finished: `duration_s` of a finished wait, the `effect` key whose
    result it recorded, `repeated` for a result delivered again."""
    tool: str
    status: str
    duration_s: float | None = optional()
    effect: str | None = optional()
    repeated: bool | None = optional()


@dataclass(frozen=True)
class EffectDone(Result):
    """tool_started for a side effect already applied: do not run it; `of` is the tool call
    that applied it, `result` what it recorded."""
    tool: str
    status: str
    effect: str
    of: str
    result: str | None


EventAck = ProgramAck | CallAck | CallStartedAck | ToolAck | EffectDone


# ---- queue, operators ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WaitingCall(Result):
    rank: int
    program: str
    call: str
    model: str
    attempt: int
    waited_s: float
    promoted: bool


@dataclass(frozen=True)
class QueueView(Result):
    """GET /v1/queue: the discipline and the waiting calls, first to start first; under `auto`
    also the discipline it orders by now and the CV it judged that on (None until it knows)."""
    queue: str
    calls: list[WaitingCall]
    ordering_by: str | None = None
    program_service_cv: float | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"queue": self.queue}
        if self.queue == "auto":
            out |= {"ordering_by": self.ordering_by, "program_service_cv": self.program_service_cv}
        return out | {"calls": [c.body() for c in self.calls]}


@dataclass(frozen=True)
class ResidencyReport(Result):
    """GET /v1/residency: every copy in HBM and host DRAM, open ops, counts, tool-wait KV."""
    plan_version: int
    copies: list[dict]
    open_ops: int
    programs: dict[str, int]
    leases: dict[str, int]
    kv_tokens: dict[str, int]
    tool_wait_kv: dict
    engines: list[dict] | None = None  # {model, tier, state: awake|asleep}: who serves weights where


@dataclass(frozen=True)
class ClusterView(Result):
    """PUT /v1/cluster: what the planner runs on now."""
    cluster: str
    gpus: int
    models: list[str]
    catalog_epoch: int


@dataclass(frozen=True)
class InventoryAck(Result):
    """PUT /v1/inventory: what the node's inventory changed in the books; `drop` lists the copies
    the adapter holds that the books do not take (stale, or no room): the adapter frees them."""
    node: str
    plan_version: int
    ops_closed: int
    lost: list
    adopted: list
    drop: list
    leases_stale: int
