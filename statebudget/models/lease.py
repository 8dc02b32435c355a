"""A HandoffLease as the runtime sees it: the planner's answer to a lease request, a look-up or a
cancel (deadline counted from the moment of the answer)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class QuotePublic(BaseModel):
    model_config = ConfigDict(frozen=True)
    p50_s: float
    p95_s: float


class LeasePublic(BaseModel):
    model_config = ConfigDict(frozen=True)
    lease_id: str
    decision: Literal["accepted", "partial", "rejected"]
    state: str
    quote: QuotePublic
    version: str
    kv_version: int | None
    ready: bool
    deadline_in_s: float
    reason: str
    objects: dict[str, str]
    retry_after_s: float | None = None  # rejected past capacity: seconds after which asking again may pass
