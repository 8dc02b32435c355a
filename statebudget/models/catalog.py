"""Model catalog: dense and MoE models. `weights_gb` of a MoE model is its dense part; its experts
are `experts x layers x expert_gb`, grouped into `pages` pages ranked by popularity (Zipf)."""

from __future__ import annotations

from functools import cached_property

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .cluster import GB


class MoESpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    experts: int = Field(gt=0)
    active: int = Field(gt=0)
    layers: int = Field(gt=0)
    expert_gb: float = Field(gt=0)
    pages: int = Field(gt=0)
    zipf_s: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _active(self):
        if self.active > self.experts:
            raise ValueError(f"active experts ({self.active}) exceed experts ({self.experts})")
        if self.pages > self.experts:
            raise ValueError(f"pages ({self.pages}) exceed experts ({self.experts})")
        return self

    @property
    def total_bytes(self) -> float:
        return self.experts * self.layers * self.expert_gb * GB

    @property
    def page_bytes(self) -> float:
        return self.total_bytes / self.pages

    @cached_property
    def page_popularity(self) -> np.ndarray:
        """Share of expert activations that land in each page, hottest first (sums to 1)."""
        ranks = np.arange(1, self.experts + 1, dtype=float)
        w = ranks ** -self.zipf_s
        per_page = np.array([c.sum() for c in np.array_split(w, self.pages)])
        return per_page / per_page.sum()


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    name: str
    version: str
    weights_gb: float = Field(gt=0)
    kv_bytes_per_token: int = Field(gt=0)
    active_params_b: float = Field(gt=0)
    tp: int = Field(1, ge=1)
    moe: MoESpec | None = None
    gpus: list[str] | None = Field(None, min_length=1, description="GPU ids (`n0/g1`) its engines may run on, as "
                                   "a serving setup pins them; a group must lie within them. None: any GPU")

    @property
    def dense_bytes(self) -> float:
        return self.weights_gb * GB

    @property
    def total_bytes(self) -> float:
        return self.dense_bytes + (self.moe.total_bytes if self.moe else 0.0)


class Catalog(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    name: str = "catalog"
    models: list[ModelSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self):
        seen = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"duplicate model name {m.name!r}")
            seen.add(m.name)
        return self

    @cached_property
    def by_name(self) -> dict[str, ModelSpec]:
        return {m.name: m for m in self.models}
