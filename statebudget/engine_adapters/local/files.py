"""An object's bytes: made deterministically from its key, copied between shards on any devices, and
kept as a one-tensor safetensors file named from its key."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .checksums import WORD


def object_seed(key: Sequence[str]) -> int:
    return int.from_bytes(hashlib.blake2b(json.dumps(list(key)).encode(), digest_size=8).digest(), "little")


def make_bytes(key: Sequence[str], n: int) -> torch.Tensor:
    """`n` deterministic pseudo-random bytes for object `key` (PCG64 seeded from the key; a longer
    object extends a shorter one, as a grown KV cache would)."""
    words = np.random.PCG64(object_seed(key)).random_raw((n + WORD - 1) // WORD)
    return torch.from_numpy(words.view(np.uint8)[:n])


def copy_ranges(src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor]) -> None:
    """Copy the bytes of `src` (shards end to end) into `dst` (shards end to end), any devices."""
    i = j = si = dj = 0
    while i < len(src) and j < len(dst):
        n = min(src[i].numel() - si, dst[j].numel() - dj)
        if n:
            dst[j][dj:dj + n].copy_(src[i][si:si + n], non_blocking=True)
        si, dj = si + n, dj + n
        if si == src[i].numel():
            i, si = i + 1, 0
        if dj == dst[j].numel():
            j, dj = j + 1, 0


def write_safetensors(path: Path, data: torch.Tensor, metadata: dict[str, str], fsync: bool = False) -> None:
    """One uint8 tensor "data" as a safetensors file, written straight from the tensor's memory
    (the library's `save_file` copies it to Python bytes first). Any safetensors reader opens it."""
    header = {"__metadata__": metadata, "data": {"dtype": "U8", "shape": [data.numel()], "data_offsets": [0, data.numel()]}}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)                           # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        if data.numel():
            f.write(memoryview(data.numpy()))
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def read_safetensors(path: Path) -> tuple[torch.Tensor, dict[str, str]]:
    """(the "data" tensor, memory-mapped: pages are read when touched; the header metadata)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor("data"), f.metadata() or {}


def file_name(key: Sequence[str]) -> str:
    """A safe, unique file stem per object: readable part + a short hash of the exact key."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(key))[:80]
    return f"{readable}-{hashlib.blake2b(json.dumps(list(key)).encode(), digest_size=4).hexdigest()}"
