"""The reference data plane: an adapter that moves REAL bytes between three tiers with torch, no
engine behind it. It shows what every adapter must do per op, and measures what this machine does.

    nvme:<node>   safetensors files   root/nvme/<object>.safetensors (one uint8 tensor "data",
       │  ▲                           its checksum in the header's metadata); also the model store
       ▼  │
    host:<node>   CPU tensors         pinned (page-locked) when CUDA is present
       │  ▲
       ▼  │
    gpu:<i>       CUDA tensors on device i, or, without a GPU, a byte-bounded "arena" in RAM per
    gpu:<i>,<j>   GPU index; a tensor-parallel group holds the object in equal shards, one a GPU

Every op is a transaction (`execute`, then the planner's answer decides `commit` or `abort`):

    execute:  allocate target ──▶ copy ──▶ checksum(target) == checksum(source)? ──no──▶ free target, "failed"
                                                      │yes
                                            target pending (not `ready`), report "done"
    commit:   target becomes ready (replaces an older copy in that tier); the source is released,
              except for a copy to a faster tier (nvme/host -> gpu, nvme -> host): tiers are
              inclusive, the lower copy stays so a later demote costs nothing
    abort:    target freed; the source was never touched

Choices:
  * Checksum: `sum64`, a Fletcher-like pair over the object as little-endian 64-bit words,
    s1 = Σ w_i and s2 = Σ (i // 8192 + 1) · w_i (mod 2^64): 64 KiB blocks weighted by position, so
    a flipped byte, a truncation or shards in the wrong order all change it. It is one torch
    reduction (≈45 GB/s on two CPU cores, HBM speed on a GPU) against ≈1.3 GB/s for blake2b and
    ≈7 GB/s for zlib.crc32, and it composes over shards, so a TP group is checked where it lies
    without gathering it. It is an error check, not a cryptographic hash (a permutation of words
    inside one 64 KiB block goes unseen).
  * Sources keep the checksum they were verified with (files: in their metadata), so a move reads
    the source once (the copy) and the target once (the check).
  * Weights and expert pages not present anywhere are created on first need in the model store
    (nvme), as deterministic pseudo-random bytes seeded from the object key: two data planes agree
    on content and checksums. KV promoted from `none` is created the same way (a simulated prefill).
  * Object size is `op.bytes` (rounded, times `bytes_scale`) when created; an existing copy moves
    whole, and the bytes reported are the bytes actually copied (0 when the target tier already
    holds the same content).

Modules: `checksums` (sum64, shard sizes), `files` (an object's bytes and its safetensors file),
`plane` (`LocalDataPlane`), `adapter` (`LocalAdapter`), `profile` (this machine's links measured
with the same copies, for the cost model; imported on demand).
"""

from .adapter import LocalAdapter
from .checksums import checksum, split_sizes
from .files import copy_ranges, make_bytes, write_safetensors
from .plane import DataPlaneError, LocalDataPlane

__all__ = ["DataPlaneError", "LocalAdapter", "LocalDataPlane", "checksum", "copy_ranges", "make_bytes", "split_sizes",
           "write_safetensors"]
