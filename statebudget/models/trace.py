"""Trace format v1 (DESIGN.md §5): JSONL, one program per line, times in seconds.

A program is a DAG of `call` nodes (an LLM call on a model) and `tool` nodes (a wait); `after`
lists a node's dependencies. `hints` are what the agent runtime announces; `cancel` abandons a
branch when another node ends. Unknown fields are kept.

A call's `max_tokens` is what the runtime asks the engine for, known when the call arrives;
`output_tokens` is what the engine wrote, known only when it ends (the simulator's truth). A trace
without `max_tokens` stays loadable: its calls are taken to have asked for `DEFAULT_MAX_TOKENS`, or
for their own output where that is longer (an engine writes no more than it is asked for), see
`TraceNode.requested_tokens`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# What a call of a trace without `max_tokens` asked for: a common engine default for agent turns.
DEFAULT_MAX_TOKENS = 4096


class TraceNode(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    id: str
    kind: Literal["call", "tool"]
    after: list[str] = Field(default_factory=list)
    model: str | None = None
    context_tokens: int = Field(0, ge=0)
    output_tokens: int = Field(0, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    tool: str | None = None
    duration: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _kind_fields(self):
        if self.kind == "call" and not self.model:
            raise ValueError(f"call node {self.id!r} has no model")
        if self.max_tokens is not None and self.output_tokens > self.max_tokens:
            raise ValueError(f"call node {self.id!r}: output_tokens {self.output_tokens} > max_tokens "
                             f"{self.max_tokens} (an engine writes no more than it is asked for)")
        return self

    @property
    def requested_tokens(self) -> int:
        """What the call asked the engine for: `max_tokens`, or for a trace without it
        `DEFAULT_MAX_TOKENS` (its own output where longer: such a trace's longest calls are only
        leak-free if it carries `max_tokens`)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return max(DEFAULT_MAX_TOKENS, self.output_tokens)


class Hint(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, allow_inf_nan=False)
    issued_at: str
    for_: str = Field(alias="for")
    model: str
    confidence: float = Field(ge=0, le=1)


class Cancel(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    node: str
    at_after: str


class Program(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    program: str
    tenant: str = "default"
    start: float = Field(ge=0)
    slo: str = "interactive"
    nodes: list[TraceNode] = Field(min_length=1)
    hints: list[Hint] = Field(default_factory=list)
    cancel: list[Cancel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _graph(self):
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"program {self.program}: duplicate node ids {dup}")
        known = set(ids)
        for n in self.nodes:
            for a in n.after:
                if a not in known:
                    raise ValueError(f"program {self.program}: node {n.id!r} is after unknown node {a!r}")
        for h in self.hints:
            for ref in (h.issued_at, h.for_):
                if ref not in known:
                    raise ValueError(f"program {self.program}: hint refers to unknown node {ref!r}")
        for c in self.cancel:
            for ref in (c.node, c.at_after):
                if ref not in known:
                    raise ValueError(f"program {self.program}: cancel refers to unknown node {ref!r}")
        cycle = _find_cycle(self.nodes)
        if cycle:
            raise ValueError(f"program {self.program}: dependency cycle {' -> '.join(cycle)}")
        return self

    def dump(self) -> dict:
        return self.model_dump(by_alias=True, exclude_defaults=False)


def _find_cycle(nodes: list[TraceNode]) -> list[str] | None:
    after = {n.id: n.after for n in nodes}
    state: dict[str, int] = {}
    for root in after:
        if root in state:
            continue
        stack = [(root, iter(after[root]))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(after[nxt])))
                path.append(nxt)
    return None


MAIN_THREAD = "main"  # a program's first thread, and the thread of a runtime event that names none (§2)


def ttft_bound(slo_classes: dict[str, float], slo: str) -> float:
    """A call's TTFT bound: its SLO class's, else the interactive class's (2 s by default)."""
    return slo_classes.get(slo, slo_classes.get("interactive", 2.0))


class TraceHeader(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    trace_format: int = 1
    preset: str | None = None
    seed: int | None = None
    hours: float | None = None
    slo_classes: dict[str, float] = Field(default_factory=lambda: {"interactive": 2.0, "batch": 60.0})
    # The weighted fair share of plas and atlas (seed 003 §20): tenant -> weight, 1 for a tenant not named.
    tenant_weights: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _weights_positive(self):
        bad = {t: w for t, w in self.tenant_weights.items() if not w > 0}
        if bad:
            raise ValueError(f"tenant_weights must be > 0, got {bad}")
        return self


class Trace(BaseModel):
    model_config = ConfigDict(frozen=True)
    header: TraceHeader = Field(default_factory=TraceHeader)
    programs: list[Program]

    @property
    def n_calls(self) -> int:
        return sum(1 for p in self.programs for n in p.nodes if n.kind == "call")
