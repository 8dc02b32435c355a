"""`LocalDataPlane`: the tiers' books and the transaction (execute, then commit or abort) that
moves an object's bytes between them (see the package docstring)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ...models.plan import Op
from ..base import OpResult, tier_kind
from .checksums import checksum, split_sizes
from .files import copy_ranges, file_name, make_bytes, read_safetensors, write_safetensors

log = logging.getLogger("statebudget.adapter.local")

TIER_RANK = {"gpu": 0, "host": 1, "nvme": 2, "none": 3}  # faster tiers first
FORMAT = "statebudget-local-1"


class DataPlaneError(RuntimeError):
    """An op this data plane cannot carry out; the op is reported failed with this message."""


class CapacityError(DataPlaneError):
    """A tier has no room for the target."""


# ---- books ----------------------------------------------------------------------------------------

@dataclass
class Pool:
    """Byte accounting of one tier (one GPU's arena or HBM budget, host DRAM, the NVMe dir)."""
    name: str
    capacity: int
    used: int = 0

    def reserve(self, n: int) -> None:
        if self.used + n > self.capacity:
            raise CapacityError(f"{self.name} full: need {n} B, {self.capacity - self.used} B free of {self.capacity} B")
        self.used += n

    def free(self, n: int) -> None:
        self.used -= n


@dataclass(eq=False)
class Copy:
    """One copy of an object in one tier: shards in memory, or a file."""
    key: tuple
    tier: str
    nbytes: int
    checksum: str
    shards: list[torch.Tensor] = field(default_factory=list)
    path: Path | None = None
    version: int | None = None   # the version of the op that wrote it (None: the model store's own)


@dataclass
class Pending:
    """An executed op waiting for the planner's answer."""
    op: Op
    key: tuple
    source: Copy | None          # the ready copy it read (released on commit unless kept)
    target: Copy | None          # the new copy (None: drop, or the target tier already held it)
    release_source: bool


# ---- the data plane -------------------------------------------------------------------------------

class LocalDataPlane:
    """Real bytes in files, host tensors and GPU (or arena) tensors, moved by transactions."""

    def __init__(self, root: str | Path, node: str = "n0", arena_bytes: int | dict[int, int] | None = None,
                 host_bytes: int | None = None, nvme_bytes: int | None = None, bytes_scale: float = 1.0,
                 use_cuda: bool | None = None, gpu_map: dict[int, int] | None = None):
        """`arena_bytes`: per GPU index, the byte capacity of its arena (no CUDA; default 1 GiB
        each) or a budget on its CUDA device (default: the device's memory); one int for all GPUs,
        or {index: bytes} naming the only GPU indexes there are. `gpu_map`: cluster GPU index ->
        local CUDA device (default: the same number). `bytes_scale` shrinks a real plan's objects
        to fit a small machine (new objects get `op.bytes * bytes_scale` bytes)."""
        self.root, self.node = Path(root), node
        self.nvme_dir = self.root / "nvme"
        self.nvme_dir.mkdir(parents=True, exist_ok=True)
        self.cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
        self.device = "cuda" if self.cuda else "arena"
        self.gpu_map = gpu_map or {}
        self.bytes_scale = bytes_scale
        self._arena_bytes = arena_bytes
        self.gpu_pools: dict[int, Pool] = {}
        if isinstance(arena_bytes, dict):
            for i in arena_bytes:
                self._gpu_pool(i)
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.host_pool = Pool(f"host:{node}", host_bytes if host_bytes is not None else phys)
        self.nvme_pool = Pool(f"nvme:{node}", nvme_bytes if nvme_bytes is not None else shutil.disk_usage(self.nvme_dir).total)
        self.copies: dict[tuple[tuple, str], Copy] = {}  # (key, tier) -> ready copy
        self.pending: dict[str, Pending] = {}            # op id -> executed, not yet answered
        self.totals: dict[str, dict[str, float]] = {}    # "nvme->host" -> bytes, seconds, ops
        self._lock = threading.RLock()
        self.generation = 0  # bumped each time the GPU memory is lost (`lose_gpus`)
        self._adopt_files()

    # ---- tiers ------------------------------------------------------------------------------------
    def _gpu_pool(self, i: int) -> Pool:
        pool = self.gpu_pools.get(i)
        if pool is not None:
            return pool
        spec = self._arena_bytes
        if isinstance(spec, dict):
            if i not in spec:
                raise DataPlaneError(f"no GPU index {i} on this data plane (GPUs: {sorted(spec)})")
            cap = spec[i]
        elif spec is not None:
            cap = spec
        elif self.cuda:
            cap = torch.cuda.get_device_properties(self._cuda_index(i)).total_memory
        else:
            cap = 1 << 30
        if self.cuda:
            self._cuda_index(i)
        pool = self.gpu_pools[i] = Pool(f"gpu:{i}", int(cap))
        return pool

    def _cuda_index(self, i: int) -> int:
        d = self.gpu_map.get(i, i)
        if d >= torch.cuda.device_count():
            raise DataPlaneError(f"GPU index {i} maps to CUDA device {d}, but this machine has {torch.cuda.device_count()}")
        return d

    def _check_tier(self, tier: str) -> None:
        kind, _, where = tier.partition(":")
        if kind in ("host", "nvme"):
            if where != self.node:
                raise DataPlaneError(f"tier {tier!r}: this data plane serves node {self.node!r}")
        elif kind == "gpu":
            try:
                [int(x) for x in where.split(",")]
            except ValueError:
                raise DataPlaneError(f"bad GPU tier {tier!r}") from None
        elif tier != "none":
            raise DataPlaneError(f"unknown tier {tier!r} (gpu:<i>[,<j>...], host:<node>, nvme:<node>, none)")

    def _alloc(self, key: tuple, tier: str, n: int, tag: str) -> Copy:
        """An empty target copy in `tier`, its bytes reserved; all or nothing."""
        kind, _, where = tier.partition(":")
        if kind == "nvme":
            self.nvme_pool.reserve(n)
            return Copy(key, tier, n, "", path=self.nvme_dir / f"{file_name(key)}.{tag}.pending.safetensors")
        if kind == "host":
            self.host_pool.reserve(n)
            try:
                return Copy(key, tier, n, "", [torch.empty(n, dtype=torch.uint8, pin_memory=self.cuda)])
            except RuntimeError as e:
                self.host_pool.free(n)
                raise CapacityError(f"{tier}: cannot allocate {n} B: {e}") from None
        group = [int(x) for x in where.split(",")]
        sizes = split_sizes(n, len(group))
        done: list[tuple[Pool, int]] = []
        shards = []
        try:
            for i, size in zip(group, sizes):
                pool = self._gpu_pool(i)
                pool.reserve(size)
                done.append((pool, size))
                dev = f"cuda:{self._cuda_index(i)}" if self.cuda else "cpu"
                try:
                    shards.append(torch.empty(size, dtype=torch.uint8, device=dev))
                except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
                    raise CapacityError(f"gpu:{i}: cannot allocate {size} B: {e}") from None
        except Exception:
            for pool, size in done:
                pool.free(size)
            raise
        return Copy(key, tier, n, "", shards)

    def _release(self, c: Copy) -> None:
        kind, _, where = c.tier.partition(":")
        if kind == "nvme":
            c.path.unlink(missing_ok=True)
            self.nvme_pool.free(c.nbytes)
        elif kind == "host":
            self.host_pool.free(c.nbytes)
        else:
            for i, s in zip((int(x) for x in where.split(",")), c.shards):
                self.gpu_pools[i].free(s.numel())
        c.shards = []

    def _adopt_files(self) -> None:
        """Files left by an earlier run become ready NVMe copies; half-written ones are removed."""
        for p in sorted(self.nvme_dir.glob("*.safetensors")):
            if p.name.endswith(".pending.safetensors"):
                p.unlink()
                continue
            try:
                data, meta = read_safetensors(p)
                key = tuple(json.loads(meta["object"]))
                c = Copy(key, f"nvme:{self.node}", data.numel(), meta["checksum"], path=p)
            except Exception as e:  # not ours, or damaged: leave it alone
                log.warning("ignoring %s: %s", p, e)
                continue
            self.nvme_pool.used += c.nbytes
            self.copies[(key, c.tier)] = c

    # ---- the model store --------------------------------------------------------------------------
    def _object_bytes(self, op: Op) -> int:
        return max(0, int(round(op.bytes * self.bytes_scale)))

    def store(self, key: Sequence[str], n: int) -> Copy:
        """The model store's NVMe copy of a weights or expert object, created on first need."""
        key = tuple(key)
        tier = f"nvme:{self.node}"
        with self._lock:
            c = self.copies.get((key, tier))
            if c is None:
                data = make_bytes(key, n)
                self.nvme_pool.reserve(n)
                c = Copy(key, tier, n, checksum([data]), path=self.nvme_dir / f"{file_name(key)}.safetensors")
                write_safetensors(c.path, data, self._meta(c))
                self.copies[(key, tier)] = c
            return c

    def stock(self, catalog) -> int:
        """Create the model store of a catalog up front, as an operator's checkpoints are on disk
        before serving: the first promotion of a model then reads a file instead of making one.
        Refuses, before writing anything, when the store would not fit the disk's free space."""
        import shutil

        total = sum(self._object_bytes(Op(op_id="stock", kind="promote", object=["w", m.name], src="none",
                                          dst=f"nvme:{self.node}", bytes=m.total_bytes)) for m in catalog.models)
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        if total > free:
            raise DataPlaneError(f"the model store of catalog {catalog.name!r} needs {total / 1e9:.1f} GB and "
                                 f"{self.root} has {free / 1e9:.1f} GB free: pass a smaller catalog or shrink "
                                 f"objects with bytes_scale (adapter --bytes-scale)")
        n = 0
        for m in catalog.models:
            objs = [(["w", m.name], m.dense_bytes)]
            if m.moe:
                objs += [(["e", m.name, str(p)], m.moe.page_bytes) for p in range(m.moe.pages)]
            for key, nbytes in objs:
                self.store(key, self._object_bytes(Op(op_id="stock", kind="promote", object=key, src="none",
                                                       dst=f"nvme:{self.node}", bytes=nbytes)))
                n += 1
        return n

    def _meta(self, c: Copy) -> dict[str, str]:
        return {"format": FORMAT, "object": json.dumps(list(c.key)), "checksum": c.checksum}

    # ---- the transaction ------------------------------------------------------------------------------
    def execute(self, op: Op) -> OpResult:
        """Allocate, copy, verify; the target stays pending until `commit` or `abort`."""
        with self._lock:
            t0 = time.perf_counter()
            try:
                moved, path, target_sum = self._execute(op)
            except DataPlaneError as e:
                return OpResult(status="failed", error=str(e), version=op.version, epoch=op.epoch)
            seconds = time.perf_counter() - t0
            if moved:
                tot = self.totals.setdefault(path, {"bytes": 0.0, "seconds": 0.0, "ops": 0})
                tot["bytes"] += moved
                tot["seconds"] += seconds
                tot["ops"] += 1
            return OpResult(status="done", bytes=moved, seconds=seconds, checksum=target_sum,
                            version=op.version, epoch=op.epoch)

    def _execute(self, op: Op) -> tuple[int, str, str | None]:
        """-> (bytes copied, path such as "nvme->host", checksum of the target's content)."""
        if op.op_id in self.pending:
            raise DataPlaneError(f"op {op.op_id} already executed and waiting for the planner")
        key, src, dst = tuple(op.object), op.src, op.dst
        self._check_tier(src)
        self._check_tier(dst)
        if src == dst:
            raise DataPlaneError(f"source and target are the same tier {src!r}")

        source: Copy | None = self.copies.get((key, src))
        if dst == "none":  # a drop: nothing to copy; the source (if there is one) goes on commit
            if src == "none":
                raise DataPlaneError("an op from none to none")
            self.pending[op.op_id] = Pending(op, key, source, None, True)
            return 0, f"{tier_kind(src)}->none", None

        # The source: a ready copy, the model store, or (KV from none) a simulated prefill.
        src_data: list[torch.Tensor] | None = None
        if src == "none" or (source is None and key[0] == "kv" and tier_kind(src) == "gpu"):
            # KV recomputed, or KV the engine's calls left in HBM (there is no engine here: the
            # data plane stands in for it and makes those bytes, as a prefill would)
            if key[0] != "kv":
                raise DataPlaneError(f"{list(key)}: weights come from the model store (nvme:{self.node}), not from none")
            data = make_bytes(key, self._object_bytes(op))
            src_data, src_sum = [data], checksum([data])
        elif source is None and tier_kind(src) == "nvme" and key[0] in ("w", "e"):
            source = self.store(key, self._object_bytes(op))
        elif source is None:
            raise DataPlaneError(f"no ready copy of {list(key)} in {src}")
        if source is not None:
            src_sum = source.checksum

        release_source = source is not None and TIER_RANK[tier_kind(src)] <= TIER_RANK[tier_kind(dst)]
        held = self.copies.get((key, dst))
        if held is not None and held.checksum == src_sum:  # inclusive tiers: the target already has it
            self.pending[op.op_id] = Pending(op, key, source, None, release_source)
            return 0, f"{tier_kind(src)}->{tier_kind(dst)}", held.checksum

        n = source.nbytes if source is not None else src_data[0].numel()
        target = self._alloc(key, dst, n, re.sub(r"[^A-Za-z0-9_-]", "_", op.op_id))
        target.checksum = src_sum  # what it must hold (a file records it in its metadata)
        try:
            self._copy(source, src_data, target)
            got = self._target_checksum(target)
            if got != src_sum:
                raise DataPlaneError(f"checksum mismatch copying {list(key)} {src} -> {dst}: "
                                     f"source {src_sum}, target {got}")
        except BaseException:
            self._release(target)
            raise
        self.pending[op.op_id] = Pending(op, key, source, target, release_source)
        return n, f"{tier_kind(src)}->{tier_kind(dst)}", target.checksum

    def _copy(self, source: Copy | None, src_data: list[torch.Tensor] | None, target: Copy) -> None:
        """The bytes of `source` (or of `src_data`) into `target`. Files are read through a memory
        map; CUDA copies stage through pinned host memory; a file is written from host memory."""
        if src_data is None:
            src_data = [read_safetensors(source.path)[0]] if source.path is not None else source.shards
        devices = {t.device for t in [*src_data, *target.shards] if t.device.type == "cuda"}
        if target.path is not None:  # to a file: from one host tensor
            host = src_data[0] if len(src_data) == 1 and src_data[0].device.type == "cpu" else None
            if host is None:
                host = torch.empty(target.nbytes, dtype=torch.uint8, pin_memory=self.cuda)
                copy_ranges(src_data, [host])
                for d in devices:
                    torch.cuda.synchronize(d)
            write_safetensors(target.path, host, self._meta(target))
            return
        if devices and source is not None and source.path is not None:  # file -> GPU: stage in pinned memory
            stage = torch.empty(target.nbytes, dtype=torch.uint8, pin_memory=True)
            stage.copy_(src_data[0])
            src_data = [stage]
        copy_ranges(src_data, target.shards)
        for d in devices:
            torch.cuda.synchronize(d)

    def _target_checksum(self, target: Copy) -> str:
        if target.path is not None:  # read back what was written (from the page cache)
            return checksum([read_safetensors(target.path)[0]])
        return checksum(target.shards)

    def commit(self, op: Op) -> None:
        """The planner acknowledged `op`: the target becomes ready, the source is released (unless
        it is a lower-tier copy kept by inclusion)."""
        with self._lock:
            p = self.pending.pop(op.op_id, None)
            if p is None:
                return
            if p.target is not None:
                if p.target.path is not None:
                    final = self.nvme_dir / f"{file_name(p.key)}.safetensors"
                    os.replace(p.target.path, final)
                    p.target.path = final
                old = self.copies.pop((p.key, p.op.dst), None)
                if old is not None:
                    if old.path is not None and old.path == p.target.path:
                        old.path = None  # already replaced on disk: free its bytes only
                        self.nvme_pool.free(old.nbytes)
                    else:
                        self._release(old)
                p.target.version = p.op.version
                self.copies[(p.key, p.op.dst)] = p.target
            if p.release_source and p.source is not None and self.copies.get((p.key, p.op.src)) is p.source:
                del self.copies[(p.key, p.op.src)]
                self._release(p.source)

    def abort(self, op: Op) -> None:
        """The planner refused `op`: free its target; the source is as it was."""
        with self._lock:
            p = self.pending.pop(op.op_id, None)
            if p is not None and p.target is not None:
                self._release(p.target)

    # ---- what it holds --------------------------------------------------------------------------------
    def held(self) -> list[dict]:
        """Every ready copy in HBM (arena) and host DRAM, with the version that wrote it: the
        inventory the adapter sends the planner."""
        with self._lock:
            return [{"object": list(k), "tier": t, "bytes": float(c.nbytes), "version": c.version}
                    for (k, t), c in sorted(self.copies.items()) if tier_kind(t) in ("gpu", "host")]

    def forget(self, key: Sequence[str], tier: str) -> None:
        """Free a ready copy the planner's books do not take (an inventory's `drop`)."""
        with self._lock:
            c = self.copies.pop((tuple(key), tier), None)
            if c is not None:
                self._release(c)

    def lose_gpus(self) -> int:
        """What a crashed engine does: every copy in HBM is gone, ready or pending (their ops can
        no longer commit). Returns the copies lost; `generation` counts the losses."""
        with self._lock:
            lost = [kt for kt in self.copies if tier_kind(kt[1]) == "gpu"]
            for kt in lost:
                self._release(self.copies.pop(kt))
            for op_id, p in list(self.pending.items()):
                if p.target is not None and tier_kind(p.target.tier) == "gpu":
                    self._release(p.target)
                    del self.pending[op_id]
            self.generation += 1
            return len(lost)

    # ---- views ---------------------------------------------------------------------------------------
    def ready(self, key: Sequence[str], tier: str) -> bool:
        """A committed copy of `key` in `tier` (a pending target is not ready)."""
        return (tuple(key), tier) in self.copies

    def where(self, key: Sequence[str]) -> list[str]:
        return sorted(t for (k, t) in self.copies if k == tuple(key))

    def read(self, key: Sequence[str], tier: str) -> torch.Tensor:
        """The bytes of a ready copy, end to end, as one CPU tensor (for checks and tests)."""
        c = self.copies[(tuple(key), tier)]
        if c.path is not None:
            return read_safetensors(c.path)[0].clone()
        return torch.cat([s.cpu() for s in c.shards]) if c.shards else torch.empty(0, dtype=torch.uint8)

    def copy_of(self, key: Sequence[str], tier: str) -> Copy:
        return self.copies[(tuple(key), tier)]

    def stats(self) -> dict[str, dict[str, float]]:
        """Per path ("nvme->host", "host->gpu", "none->gpu" for a simulated prefill, ...): bytes
        copied, seconds (allocation + copy + checksum), ops and their ratio in bytes/s."""
        return {k: {**v, "Bps": v["bytes"] / v["seconds"] if v["seconds"] > 0 else 0.0}
                for k, v in sorted(list(self.totals.items()))}

    def health(self) -> dict:
        """Tiers' used and capacity bytes, ready copies per tier, pending ops. Lock-free (snapshots),
        so it answers while a long copy runs."""
        pools = [*(self.gpu_pools[i] for i in sorted(list(self.gpu_pools))), self.host_pool, self.nvme_pool]
        per_tier: dict[str, int] = {}
        for _, tier in list(self.copies):
            per_tier[tier] = per_tier.get(tier, 0) + 1
        return {"ok": True, "device": self.device, "node": self.node, "root": str(self.root),
                "tiers": {p.name: {"used_bytes": p.used, "capacity_bytes": p.capacity} for p in pools},
                "copies": per_tier, "pending": len(self.pending)}
