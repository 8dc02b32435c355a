"""The `sum64` checksum of an object's bytes, over one tensor or a tensor-parallel group's shards,
and the shard sizes it needs (every shard but the last a whole number of 8-byte words)."""

from __future__ import annotations

from typing import Sequence

import torch

WORD = 8                 # checksum word: 8 bytes
BLOCK_WORDS = 8192       # checksum position weight: one per 64 KiB block
_MASK = (1 << 64) - 1


def _words_sum(w: torch.Tensor, first_word: int) -> tuple[int, int]:
    """(Σ w, Σ block_weight · w) of int64 words starting at global word index `first_word`."""
    s1 = s2 = 0
    n, g = w.numel(), first_word
    head = min(n, (-g) % BLOCK_WORDS)                   # up to the next block boundary
    rows = (n - head) // BLOCK_WORDS
    pieces = [(w[:head], g), (w[head + rows * BLOCK_WORDS:], g + head + rows * BLOCK_WORDS)]
    for piece, at in pieces:                            # partial blocks: one weight each
        if piece.numel():
            s = int(piece.sum().item())
            s1 += s
            s2 += (at // BLOCK_WORDS + 1) * s
    if rows:
        r = w[head:head + rows * BLOCK_WORDS].view(rows, BLOCK_WORDS).sum(dim=1)
        first_block = (g + head) // BLOCK_WORDS
        weights = torch.arange(first_block + 1, first_block + rows + 1, dtype=torch.int64, device=r.device)
        s1 += int(r.sum().item())
        s2 += int((r * weights).sum().item())
    return s1 & _MASK, s2 & _MASK


def checksum(shards: Sequence[torch.Tensor]) -> str:
    """`sum64` of the bytes of `shards` taken end to end (uint8, 1-D, on any device). Every shard
    but the last must be a whole number of 8-byte words (`split_sizes` makes them so)."""
    s1 = s2 = 0
    offset = 0
    for t in shards:
        n = t.numel()
        if n and offset % WORD:
            raise ValueError("only the last non-empty shard may end inside an 8-byte word")
        full = n - n % WORD
        if full:
            body = t[:full]
            try:
                w = body.view(torch.int64)
            except RuntimeError:                        # storage not 8-byte aligned (e.g. a mapped file)
                w = body.clone().view(torch.int64)
            a, b = _words_sum(w, offset // WORD)
            s1, s2 = s1 + a, s2 + b
        if n % WORD:                                    # the last word, zero-padded
            last = torch.zeros(WORD, dtype=torch.uint8, device=t.device)
            last[:n % WORD] = t[full:]
            a, b = _words_sum(last.view(torch.int64), (offset + full) // WORD)
            s1, s2 = s1 + a, s2 + b
        offset += n
    return f"sum64:{offset}:{s1 & _MASK:016x}{s2 & _MASK:016x}"


def split_sizes(n: int, k: int) -> list[int]:
    """Equal shards of `n` bytes over `k` GPUs (each a whole number of words but the last)."""
    per = -(-n // k)                           # ceil(n / k)
    q = -(-per // WORD) * WORD                 # ... rounded up to a word
    return [max(0, min(q, n - i * q)) for i in range(k)]
