"""Tier capacities and the residency of every state object (the mechanism's books).

Every state object has a set of copies; a copy lives in one tier and is `ready` or still
being written. Allocation answers yes or no; policies decide what to do with "no".

    gpu:<i>   HBM of one GPU     copies keyed (state key, GPU group); each GPU of the group holds 1/tp
    host:<n>  DRAM of one node   copies keyed (state key, node)
    nvme:<n>  disk of one node   the model store (all weights and experts) plus demoted KV
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..models.cluster import GB, Cluster

_SLACK = 1.0  # bytes; float sums of GB-sized objects must not trip the capacity check


class CapacityError(AssertionError):
    """A tier above its capacity, or books that do not add up: a bug in the mechanism."""


@dataclass(slots=True, eq=False)
class GpuCopy:
    key: tuple
    group: tuple[int, ...]
    per_gpu: float
    ready: bool
    created: float
    last_use: float
    pins: int = 0
    used: bool = False
    waiters: list = field(default_factory=list)
    from_prefetch: bool = False
    transfer: object = None   # the Transfer writing it, while not ready
    src_copy: object = None   # for a KV move between GPU groups: the copy it moves from
    lease: object = None      # the lease that asked for it, if any
    suspended_since: float | None = None  # KV held in HBM while its program waits on a tool
    background: bool = False  # a tool-wait swap-in (or speculation) no call waits for yet: loads at BACKGROUND_SHARE

    @property
    def nbytes(self) -> float:
        return self.per_gpu * len(self.group)


@dataclass(slots=True, eq=False)
class HostCopy:
    key: tuple
    node: str
    nbytes: float
    ready: bool
    last_use: float
    waiters: list = field(default_factory=list)
    source: object = None  # while a tool-wait swap-out writes it: (its Transfer, the GPU copy it leaves)


class Tiers:
    def __init__(self, cluster: Cluster):
        self.hbm_cap = [cluster.usable_hbm_bytes(g) for g in cluster.gpus]
        self.hbm_used = [0.0] * len(self.hbm_cap)
        self.host_cap = {n.name: n.host_dram_gb * GB for n in cluster.nodes}
        self.host_used = {n.name: 0.0 for n in cluster.nodes}
        self.nvme_cap = {n.name: n.nvme_gb * GB for n in cluster.nodes}
        self.nvme_used = {n.name: 0.0 for n in cluster.nodes}
        self.gpu: dict[tuple, GpuCopy] = {}          # (key, group) -> copy
        self.groups_of: dict[tuple, set] = {}        # key -> groups holding a copy (an index of `gpu`)
        self.on_gpu: list[dict[tuple, GpuCopy]] = [dict() for _ in self.hbm_cap]
        self.host: dict[tuple, HostCopy] = {}        # (key, node) -> copy
        self.nvme: dict[tuple, float] = {}           # (key, node) -> bytes
        self.private: dict[object, tuple] = {}       # owner -> (group, per_gpu): a running call's new KV

    # ---- HBM ------------------------------------------------------------------------------
    def gpu_free(self, i: int) -> float:
        return self.hbm_cap[i] - self.hbm_used[i]

    def fits_gpu(self, group, per_gpu: float) -> bool:
        return all(self.hbm_used[i] + per_gpu <= self.hbm_cap[i] + _SLACK for i in group)

    def alloc_gpu(self, group, per_gpu: float) -> bool:
        if not self.fits_gpu(group, per_gpu):
            return False
        for i in group:
            self.hbm_used[i] += per_gpu
        return True

    def free_gpu(self, group, per_gpu: float) -> None:
        for i in group:
            self.hbm_used[i] -= per_gpu
            if self.hbm_used[i] < -_SLACK:
                raise CapacityError(f"HBM of GPU {i} freed below zero")

    def add_gpu_copy(self, c: GpuCopy) -> None:
        self.gpu[(c.key, c.group)] = c
        self.groups_of.setdefault(c.key, set()).add(c.group)
        for i in c.group:
            self.on_gpu[i][(c.key, c.group)] = c

    def remove_gpu_copy(self, c: GpuCopy) -> None:
        del self.gpu[(c.key, c.group)]
        gs = self.groups_of[c.key]
        gs.discard(c.group)
        if not gs:
            del self.groups_of[c.key]
        for i in c.group:
            del self.on_gpu[i][(c.key, c.group)]
        self.free_gpu(c.group, c.per_gpu)

    # ---- host and NVMe ------------------------------------------------------------------------
    def alloc_host(self, node: str, nbytes: float) -> bool:
        if self.host_used[node] + nbytes > self.host_cap[node] + _SLACK:
            return False
        self.host_used[node] += nbytes
        return True

    def remove_host_copy(self, c: HostCopy) -> None:
        del self.host[(c.key, c.node)]
        self.host_used[c.node] -= c.nbytes

    def alloc_nvme(self, key, node: str, nbytes: float) -> bool:
        if self.nvme_used[node] + nbytes > self.nvme_cap[node] + _SLACK:
            return False
        self.nvme_used[node] += nbytes
        self.nvme[(key, node)] = nbytes
        return True

    def remove_nvme(self, key, node: str) -> None:
        self.nvme_used[node] -= self.nvme.pop((key, node))

    # ---- the invariant -------------------------------------------------------------------------
    def check(self) -> None:
        """No tier above capacity, and the books add up to the copies they hold."""
        per_gpu = [0.0] * len(self.hbm_cap)
        for c in self.gpu.values():
            for i in c.group:
                per_gpu[i] += c.per_gpu
        for group, b in self.private.values():
            for i in group:
                per_gpu[i] += b
        for i, cap in enumerate(self.hbm_cap):
            if self.hbm_used[i] > cap + _SLACK:
                raise CapacityError(f"GPU {i}: {self.hbm_used[i]:.0f} B used > {cap:.0f} B capacity")
            if abs(per_gpu[i] - self.hbm_used[i]) > _SLACK * 16:
                raise CapacityError(f"GPU {i}: copies hold {per_gpu[i]:.0f} B, books say {self.hbm_used[i]:.0f} B")
        host = {n: 0.0 for n in self.host_cap}
        for c in self.host.values():
            host[c.node] += c.nbytes
        for n, cap in self.host_cap.items():
            if self.host_used[n] > cap + _SLACK or abs(host[n] - self.host_used[n]) > _SLACK * 16:
                raise CapacityError(f"host {n}: used {self.host_used[n]:.0f} B, copies {host[n]:.0f} B, cap {cap:.0f} B")
        for n, cap in self.nvme_cap.items():
            if self.nvme_used[n] > cap + _SLACK:
                raise CapacityError(f"nvme {n}: {self.nvme_used[n]:.0f} B used > {cap:.0f} B capacity")
