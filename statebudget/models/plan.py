"""Plans and ops: what a policy asks for; the mechanism (simulator or adapter) carries them out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

OpKind = Literal["promote", "demote", "drop"]


class Op(BaseModel):
    """One transfer of one state object between two tiers."""
    model_config = ConfigDict(frozen=True)
    op_id: str
    kind: OpKind
    object: list[str] = Field(description="state key, e.g. ['w', 'coder'] or ['kv', 'p17', 'coder']")
    src: str = Field(description="gpu:<id> | host:<node> | nvme:<node> | none")
    dst: str
    bytes: float = Field(ge=0)
    epoch: int = 0
    version: int = 0
    deadline: float | None = None
    lease_id: str | None = None
    background: bool = Field(False, description="a tool-wait KV swap (seed 003 §11) or a promote no lease "
                                                "asked for (speculation, §21): run it after the node's "
                                                "foreground ops, which it must not delay")
    checksum: bool = Field(False, description="the planner refuses a done report of this op without a checksum "
                                              "(`serve --require-checksums`: adapters whose data plane verifies)")


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)
    version: int
    ops: list[Op] = Field(default_factory=list)


class OpAck(BaseModel):
    """The planner's answer to an adapter's report of one op: the op's status; `duplicate` for a
    done report of a closed op sent again."""
    model_config = ConfigDict(frozen=True)
    op_id: str
    status: str
    duplicate: bool = False
