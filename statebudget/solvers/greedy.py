"""The online greedy solver over one budget for weights, KV and expert pages (seed 002's State
Residency Vector): every candidate object, whatever its kind, competes for HBM by the stall it is
expected to save per byte.

    value(o)   = P(o is needed within the horizon) x restore_s(o from its best lower tier)
                 - (1 - P) x bytes(o) x the price of a wasted byte, for o not yet in HBM
    density(o) = value(o) / bytes(o)          (x (1 + hysteresis) if o is already in HBM)

Objects are taken in density order while every GPU of their group has room (capacity less what
running calls pin, less a headroom for on-demand traffic): that is the target HBM set. Targets not
yet in HBM are promotions, scheduled in density order while every link on their path has budget
left in the window (bandwidth x window x (1 - headroom), less the bytes already queued on it).
Residents outside the target set with little value are demoted one tier (to host DRAM, which keeps
a wake cheap); under pressure the mechanism evicts lowest density first. All of it is numpy over
the candidate arrays; the one sequential step is the per-link budget of the few promotions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Candidates:
    """Parallel arrays over candidate (object, GPU group) pairs."""
    keys: list                 # state keys
    groups: list               # GPU group (tuple of indices) per candidate
    member: np.ndarray         # [n x G] bool: GPU g is in the candidate's group
    per_gpu: np.ndarray        # bytes on each GPU of the group
    value_s: np.ndarray        # P(use within horizon) x restore seconds saved, less the waste price
    resident: np.ndarray       # bool: a ready copy is on that group now
    paths: list                # {link: bytes} a promotion would put on each link, or {} if resident


@dataclass
class GreedyPlan:
    target: np.ndarray         # bool per candidate: keep / bring into HBM
    promote: list[int]         # candidate indices to promote now, in order
    density: np.ndarray


def solve(c: Candidates, gpu_budget: np.ndarray, link_budget: dict[str, float], hysteresis: float = 0.3) -> GreedyPlan:
    n = len(c.keys)
    if n == 0:
        return GreedyPlan(np.zeros(0, bool), [], np.zeros(0))
    nbytes = c.per_gpu * c.member.sum(axis=1)
    density = c.value_s / np.maximum(nbytes, 1.0)
    density = np.where(c.resident, density * (1.0 + hysteresis), density)
    order = np.argsort(-density, kind="stable")
    member = c.member[order]
    load = member * c.per_gpu[order, None]                    # [n x G] bytes each takes on each GPU
    cum = np.cumsum(load, axis=0)
    fits = ((cum <= gpu_budget[None, :]) | ~member).all(axis=1)
    # The prefix rule is conservative for later items (the running sum also counts items that did
    # not fit); good enough for an online step that runs again at the next event.
    taken = fits & (c.value_s[order] > 0)                     # in density order
    target = np.zeros(n, bool)
    target[order[taken]] = True
    promote = []
    left = dict(link_budget)
    # only targets not yet in HBM are scheduled, in density order
    for i in order[taken & ~c.resident[order]].tolist():
        path = c.paths[i]
        if all(left.get(link, 0.0) >= b for link, b in path.items()):
            for link, b in path.items():
                left[link] -= b
            promote.append(i)
    return GreedyPlan(target, promote, density)
