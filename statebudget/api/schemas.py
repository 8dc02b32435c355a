"""Request and answer bodies of the service (Create / Public families per resource).

Every number in a body must be finite (`allow_inf_nan=False`; the JSON itself is checked first, see
`inputs.py`). Every id must be printable text of at most 200 characters: a control, format
(bidi overrides, zero-width marks) or separator character in an id could make two ids look alike in
a log, a terminal or a report. Free text (`OpReport.error`) is cleaned and cut instead of refused:
an adapter's failure report must get through whatever its engine said.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StringConstraints,
                      model_validator)

ID_CHARS = 200        # the longest id
ERROR_CHARS = 2_000   # what is kept of an op's error text
MAX_INT = 2**63 - 1   # the largest integer the SQLite ledger stores


def printable(s: str) -> str:
    """`s` if every character is printable (Unicode categories L, M, N, P, S and the ASCII space)."""
    if not s.isprintable():
        i, c = next((i, c) for i, c in enumerate(s) if not c.isprintable())
        raise ValueError(f"must be printable text: U+{ord(c):04X} at position {i} is a control, format or "
                         f"separator character")
    return s


def clean_text(s):
    """Free text with its control, format and separator characters taken out (newlines and tabs
    stay), cut to `ERROR_CHARS`. Not a string: left to the type check."""
    if not isinstance(s, str):
        return s
    if not s.isprintable():
        s = "".join(c for c in s if c.isprintable() or c in "\n\t")
    return s if len(s) <= ERROR_CHARS else s[:ERROR_CHARS - 1] + "\u2026"


Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_CHARS), AfterValidator(printable)]
Name = Field(min_length=1, max_length=ID_CHARS, pattern=r"^[A-Za-z0-9._:/@+-]+$")
EventType = Literal["program_started", "call_arrived", "call_started", "call_finished", "call_cancelled",
                    "tool_started", "tool_finished", "program_finished", "program_cancelled"]
_NEEDS = {"call_arrived": ("call", "model"), "call_started": ("call",), "call_finished": ("call",),
          "call_cancelled": ("call",),
          "tool_started": ("tool",), "tool_finished": ("tool",)}


class EventCreate(BaseModel):
    """One runtime event. `call` names a call inside its program (for tool events: the tool call's
    id, so a late result is recognised); `tokens` (call_finished) is the program's KV length for
    that model after the call, which is the KV's version; `attempt` numbers a call's retries;
    `max_tokens` (call_arrived) is what the runtime asks the engine for; `output_tokens`
    (call_finished only) what the engine wrote, known once the call has ended (DESIGN.md §5);
    `epoch` (optional) must be the program's current one; `thread` (tool events, optional,
    default `main`) names the program's thread that waits, so the threads of a fork/join program
    wait on tools side by side (a new tool call on a thread that still waits is a retry)."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)
    type: EventType
    program: str = Name
    call: Id | None = None
    model: Id | None = None
    tool: Id | None = None
    thread: Id | None = None
    context_tokens: int = Field(0, ge=0, le=10_000_000)
    max_tokens: int | None = Field(None, ge=1, le=10_000_000, description="call_arrived: the output tokens the "
                                   "runtime asks the engine for (default 4096)")
    output_tokens: int | None = Field(None, ge=0, le=10_000_000, description="call_finished: the output tokens the "
                                      "engine wrote")
    tokens: int = Field(0, ge=0, le=10_000_000)
    duration_s: float | None = Field(None, ge=0, le=86_400)
    ttft_s: float | None = Field(None, ge=0, le=86_400, description="call_arrived: the call's TTFT bound, seconds "
                                 "from now (its slack raises its priority under plas and atlas)")
    epoch: int | None = Field(None, ge=0, le=1_000_000)
    attempt: int | None = Field(None, ge=0, le=1_000, description="call events: which try of the call (retries count up)")
    after: list[Id] | None = Field(None, max_length=1_000, description="call_arrived: calls that must have finished")
    effect: Id | None = Field(None, description="tool_started: the idempotency key "
                               "of the tool's side effect; once its result is taken, a tool call with the same key "
                               "is answered `done` (do not run it again) with the stored result")
    ok: bool | None = Field(None, description="tool_finished: false if the tool failed without its side effect "
                            "(its key may then run again); default true")
    result: str | None = Field(None, max_length=4_096, description="tool_finished: what to answer a later tool "
                               "call with the same effect key (a result or a reference to it)")

    @model_validator(mode="after")
    def _fields_of_type(self):
        missing = [f for f in _NEEDS.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} event needs {', '.join(missing)}")
        if self.output_tokens is not None and self.type != "call_finished":
            raise ValueError("output_tokens is known once a call has ended: send it with call_finished "
                             "(call_arrived takes max_tokens)")
        if self.max_tokens is not None and self.type != "call_arrived":
            raise ValueError("max_tokens belongs to call_arrived")
        if self.effect is not None and self.call is None:
            raise ValueError("an event with an effect key needs its tool call id (call)")
        return self


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[EventCreate] = Field(min_length=1, max_length=1_000)


class EventPublic(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: EventType
    program: str


class LeaseCreate(BaseModel):
    """A HandoffLease: prepare `model` (and the program's KV for it) before
    `deadline_s` seconds from now, not before `earliest_s`."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)
    program: str = Name
    model: Id
    deadline_s: float = Field(gt=0, le=86_400, description="seconds from now by which the state must be ready")
    confidence: float = Field(1.0, ge=0, le=1)
    cancel_token: Id | None = None
    earliest_s: float = Field(0.0, ge=0, le=86_400, description="seconds from now before which the state is not "
                              "needed (at most deadline_s)")
    with_kv: bool = True
    for_call: Id | None = None
    epoch: int | None = Field(None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _window(self):
        if self.earliest_s > self.deadline_s:
            raise ValueError(f"earliest_s ({self.earliest_s:g}) is after deadline_s ({self.deadline_s:g}): "
                             "the window to be ready in is empty")
        return self


class OpReport(BaseModel):
    """An adapter's report of one op. `error` is free text: characters that are not printable
    (but newlines and tabs) are taken out and it is cut to 2,000 characters, never refused."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    status: Literal["done", "failed", "cancelled"]
    bytes: float = Field(0.0, ge=0, le=1e15)
    seconds: float = Field(0.0, ge=0, le=1e6)
    checksum: Annotated[str, StringConstraints(max_length=ID_CHARS), AfterValidator(printable)] | None = None
    version: int = Field(0, ge=0, le=MAX_INT)
    epoch: int = Field(0, ge=0, le=MAX_INT)
    error: Annotated[str, BeforeValidator(clean_text)] = ""


class OracleRunCreate(BaseModel):
    """An oracle run on a preset trace (`preset`, `seed`, `hours`) or an uploaded JSONL trace."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    preset: Id | None = Field(None, description="swe-team | swe-team-shuffled | mapreduce | mixed-tenants | long-tail")
    seed: int = Field(1, ge=0, le=2**31)
    hours: float = Field(0.25, gt=0, le=24)
    trace_jsonl: str | None = Field(None, max_length=50_000_000, description="a v1 trace, one program per line")
    time_limit_s: float = Field(10.0, ge=0.1, le=3600, description="per rolling-horizon window")
    backend: Literal["scip", "cp-sat", "highs", "cbc"] = "scip"
    window: int = Field(24, ge=2, le=500)
    overlap: int = Field(8, ge=0, le=499)
    replicas: int = Field(2, ge=1, le=4, description="candidate GPU groups per model a call may run on")
    lead: Literal["planner", "none"] = Field("none", description="planner: each window's greedy warm start "
                                             "follows the online planner, replayed first (slower to start)")

    @model_validator(mode="after")
    def _one_trace(self):
        if (self.preset is None) == (self.trace_jsonl is None):
            raise ValueError("give exactly one of preset and trace_jsonl")
        from ..traces.generators import PRESETS
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown trace preset {self.preset!r} (known: {', '.join(PRESETS)})")
        if self.overlap >= self.window:
            raise ValueError("overlap must be smaller than window")
        return self


class OracleRunPublic(BaseModel):
    model_config = ConfigDict(extra="allow")
    run_id: str
    status: Literal["queued", "running", "done", "failed"]


class ClusterPut(BaseModel):
    """Validated as `Cluster` and `Catalog` by the planner (`set_cluster`), which names the field."""
    model_config = ConfigDict(extra="forbid")
    cluster: dict
    catalog: dict


class LayoutPut(BaseModel):
    """PUT /v1/layout: what a `--layout` file holds, `homes` (model: [GPU index, ...]; {} for
    none) or the output of `statebudget layout --json` (its `kept`; its other keys but `cluster`
    and `catalog` are not read), and `holds` (true: `PlannerConfig.layout_holds`).
    The shape is checked by `models.load.layout_entries`, the fit by the planner (`set_layout`),
    each naming the entry."""
    model_config = ConfigDict(extra="allow")
    homes: dict | None = None
    kept: list | None = None
    holds: StrictBool = False


class InventoryCopy(BaseModel):
    """One ready copy an adapter holds: `["w", model]`, `["e", model, page]` or `["kv", program,
    model]` on `gpu:<i>[,<j>]` or `host:<node>`, with the version it was written at if known."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    object: list[Id] = Field(min_length=2, max_length=3)
    tier: str = Field(min_length=5, max_length=200, pattern=r"^(gpu:[0-9]+(,[0-9]+)*|host:[A-Za-z0-9._:/@+-]+)$")
    bytes: float | None = Field(None, ge=0, le=1e13)
    version: int | None = Field(None, ge=0, le=MAX_INT)


class InventoryPut(BaseModel):
    """An adapter's inventory (PUT /v1/inventory)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    node: str = Name
    reason: Literal["adapter started", "engine restarted"] = "adapter started"
    copies: list[InventoryCopy] = Field(default_factory=list, max_length=100_000)
