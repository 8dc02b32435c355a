"""Tier capacities and the residency of every state object (the mechanism's books).

Every state object has a set of copies; a copy lives in one tier and is `ready` or still
being written. Allocation answers yes or no; policies decide what to do with "no".

    gpu:<i>   HBM of one GPU     copies keyed (state key, GPU group); each GPU of the group holds 1/tp
    host:<n>  DRAM of one node   copies keyed (state key, node)
    nvme:<n>  disk of one node   the model store (all weights and experts) plus demoted KV

Engines (DESIGN.md §3): a model's weights in HBM on a group are served by an engine bound to that
group. The books keep one `Engine` per (weights key, group) while it is awake (its weights copy in
HBM, ready or loading) or asleep (its weights in that node's DRAM, the `HostCopy` it tags, vLLM
sleep level 1). Either way it holds `engine_overhead_gb` of HBM on each GPU of its group. A host
copy that no engine tags is a cache: using it on any group is a cold start.
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
    wake: bool = False        # weights of an asleep engine waking on this group: `wake_s`, not a cold start

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
    engine: tuple | None = None  # the group of the asleep engine whose pinned DRAM this is


@dataclass(slots=True, eq=False)
class Engine:
    """An engine process for one model on one group. Asleep, it can be evicted like a copy (its
    HBM overhead is freed, its host copy becomes a cache): `plan_eviction` offers it first."""
    key: tuple
    group: tuple[int, ...]
    per_gpu: float          # HBM overhead on each GPU of the group
    last_use: float
    host: HostCopy | None = None  # set while asleep
    pins: int = 0
    ready: bool = True

    @property
    def asleep(self) -> bool:
        return self.host is not None


class Tiers:
    def __init__(self, cluster: Cluster):
        self.hbm_cap = [cluster.usable_hbm_bytes(g) for g in cluster.gpus]
        self.engine_overhead = [cluster.gpu_kinds[g.kind].engine_overhead_gb * GB for g in cluster.gpus]
        self.engines: dict[tuple, Engine] = {}       # (weights key, group) -> engine, awake or asleep
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
        e = self.engines.get((c.key, c.group))
        if e is not None and e.host is None:  # not put to sleep first: the engine stops
            self.stop_engine(c.key, c.group)

    # ---- engines ------------------------------------------------------------------------------
    def engine_need(self, key, group) -> float:
        """HBM per GPU an engine would add if `key`'s copy came to `group`: its overhead when no
        engine of that model is there yet (weights only)."""
        if key[0] != "w" or (key, group) in self.engines:
            return 0.0
        return max(self.engine_overhead[i] for i in group)

    def start_engine(self, key, group, now: float) -> Engine:
        """The engine that will serve a weights copy on `group`: an asleep one wakes (its host copy
        becomes a cache), else a new one takes its overhead (the caller made room)."""
        e = self.engines.get((key, group))
        if e is None:
            e = Engine(key, group, max(self.engine_overhead[i] for i in group), now)
            if e.per_gpu and not self.alloc_gpu(group, e.per_gpu):
                raise CapacityError(f"no HBM for the engine of {key} on {group}")
            self.engines[(key, group)] = e
        elif e.host is not None:
            e.host.engine = None
            e.host = None
        e.last_use = now
        return e

    def sleep_engine(self, key, group, hc: HostCopy) -> bool:
        """The engine on `group` goes to sleep into `hc` (that node's DRAM). Another asleep engine
        of the model on that node stops: one pinned copy per model per node."""
        e = self.engines.get((key, group))
        if e is None:
            return False
        if hc.engine is not None and hc.engine != group:
            self.stop_engine(key, hc.engine)
        hc.engine, e.host = group, hc
        return True

    def stop_engine(self, key, group) -> None:
        e = self.engines.pop((key, group), None)
        if e is None:
            return
        if e.host is not None:
            e.host.engine = None
            e.host = None
        if e.per_gpu:
            self.free_gpu(group, e.per_gpu)

    def asleep_on(self, key, group) -> bool:
        e = self.engines.get((key, group))
        return e is not None and e.host is not None and e.host.ready

    # ---- host and NVMe ------------------------------------------------------------------------
    def alloc_host(self, node: str, nbytes: float) -> bool:
        if self.host_used[node] + nbytes > self.host_cap[node] + _SLACK:
            return False
        self.host_used[node] += nbytes
        return True

    def remove_host_copy(self, c: HostCopy) -> None:
        if c.engine is not None:
            self.stop_engine(c.key, c.engine)
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
        for (key, group), e in self.engines.items():
            for i in group:
                per_gpu[i] += e.per_gpu
            if e.host is None and (key, group) not in self.gpu:
                raise CapacityError(f"engine {key} on {group}: neither awake nor asleep")
            if e.host is not None and e.host.engine != group:
                raise CapacityError(f"engine {key} on {group}: its host copy names another group")
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
