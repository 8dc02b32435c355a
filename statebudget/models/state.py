"""State objects and tiers (DESIGN.md §1).

Every state object has a current residency (the tiers holding a full copy) and, in a plan, a
target tier. Keys are small tuples so the simulator can hash them cheaply:

    ("w", model)               dense weights of a model (on a GPU group each GPU holds 1/tp)
    ("e", model, page)         one MoE expert page
    ("kv", program, model)     a program's KV cache for one model
"""

from __future__ import annotations

from enum import IntEnum

StateKey = tuple


class TierKind(IntEnum):
    """Ordered fastest first: demotion moves to a larger value."""
    GPU = 0
    HOST = 1
    NVME = 2
    NONE = 3


def weights_key(model: str) -> StateKey:
    return ("w", model)


def expert_key(model: str, page: int) -> StateKey:
    return ("e", model, page)


def kv_key(program: str, model: str) -> StateKey:
    return ("kv", program, model)


def state_kind(key: StateKey) -> str:
    return {"w": "weights", "e": "experts", "kv": "kv"}[key[0]]


def describe(key: StateKey) -> str:
    """A key in words: "reviewer weights", "reasoner expert page 3", "KV of p7 on coder"."""
    if key[0] == "w":
        return f"{key[1]} weights"
    if key[0] == "e":
        return f"{key[1]} expert page {key[2]}"
    return f"KV of {key[1]} on {key[2]}"
