"""Cluster schema: GPU kinds, nodes (hosts) and the GPUs they hold. GB = 1e9 bytes, GB/s = 1e9 B/s.

A cluster is flattened into GPU ids `"<node>/g<i>"` in file order; tensor-parallel groups are
aligned runs of `tp` GPUs of one node and one kind (a `tp: 2` model on a node with 4 L40s may use
`g0+g1` or `g2+g3`).
"""

from __future__ import annotations

from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, model_validator

GB = 1e9


class GpuKind(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    hbm_gb: float = Field(gt=0)
    hbm_gbps: float = Field(gt=0)
    h2d_gbps: float = Field(gt=0)
    d2h_gbps: float = Field(gt=0)
    tflops: float = Field(gt=0)
    wake_s: float = Field(ge=0, description="an asleep engine waking on its own group, after the H2D copy")
    cold_start_s: float = Field(ge=0, description="a new engine: process, CUDA context, graphs (plus the copy)")
    engine_overhead_gb: float = Field(0.0, ge=0, description="HBM every engine, awake or asleep, holds per GPU")


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str
    host_dram_gb: float = Field(gt=0)
    nvme_gb: float = Field(gt=0)
    nvme_read_gbps: float = Field(gt=0)
    nvme_write_gbps: float = Field(gt=0)
    root_gbps: float = Field(gt=0, description="PCIe root complex shared by this node's GPUs")
    gpus: dict[str, int] = Field(description="GPU kind -> count")

    @model_validator(mode="after")
    def _counts(self):
        for kind, n in self.gpus.items():
            if n <= 0:
                raise ValueError(f"node {self.name}: GPU count of {kind} must be positive, got {n}")
        return self


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    index: int
    node: str
    kind: str


class Cluster(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    name: str
    gpu_kinds: dict[str, GpuKind]
    nodes: list[Node] = Field(min_length=1)
    preload: list[str] = Field(default_factory=list, description="models whose weights start in host DRAM")
    hbm_reserve_frac: float = Field(0.1, ge=0, lt=1, description="HBM kept for activations / engine")

    @model_validator(mode="after")
    def _kinds(self):
        names = set()
        for node in self.nodes:
            if node.name in names:
                raise ValueError(f"duplicate node name {node.name!r}")
            names.add(node.name)
            for kind in node.gpus:
                if kind not in self.gpu_kinds:
                    raise ValueError(
                        f"node {node.name}: unknown GPU kind {kind!r} (known: {', '.join(sorted(self.gpu_kinds))})")
        return self

    @cached_property
    def gpus(self) -> list[Gpu]:
        out = []
        for node in self.nodes:
            i = 0
            for kind, n in node.gpus.items():
                for _ in range(n):
                    out.append(Gpu(id=f"{node.name}/g{i}", index=len(out), node=node.name, kind=kind))
                    i += 1
        return out

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def usable_hbm_bytes(self, gpu: Gpu) -> float:
        return self.gpu_kinds[gpu.kind].hbm_gb * GB * (1 - self.hbm_reserve_frac)

    def groups(self, tp: int) -> list[tuple[int, ...]]:
        """Aligned tensor-parallel groups of `tp` GPUs (indices), each on one node and one kind."""
        out = []
        by_node_kind: dict[tuple[str, str], list[int]] = {}
        for g in self.gpus:
            by_node_kind.setdefault((g.node, g.kind), []).append(g.index)
        for idx in by_node_kind.values():
            for s in range(0, len(idx) - tp + 1, tp):
                out.append(tuple(idx[s:s + tp]))
        return sorted(out)

    def model_groups(self, model) -> list[tuple[int, ...]]:
        """The groups a model may run on: those of its `tp`, within its `gpus` where it names them
        (the GPUs its engines are set up on)."""
        groups = self.groups(model.tp)
        if model.gpus is None:
            return groups
        allowed = {g.index for g in self.gpus if g.id in set(model.gpus)}
        return [g for g in groups if allowed.issuperset(g)]

    @property
    def total_hbm_bytes(self) -> float:
        return sum(self.gpu_kinds[g.kind].hbm_gb * GB for g in self.gpus)
