"""The data of the offline MILP (`model.py`): an instance (slots, objects, calls, capacities), a
solution (the variables per object and slot), and the lookups the model, the heuristics and the
rolling horizon share: a call's affinity and chosen option, who needs an object when, and the
names of the objects an instance is built from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

STATUS_OPTIMAL, STATUS_FEASIBLE, STATUS_INFEASIBLE, STATUS_NOT_SOLVED = "OPTIMAL", "FEASIBLE", "INFEASIBLE", "NOT_SOLVED"


@dataclass(frozen=True)
class Obj:
    name: str            # e.g. "w:coder" or "kv:p17:coder"
    gpus: tuple[int, ...]
    node: str
    bytes: float
    restore_host_s: float
    restore_nvme_s: float
    live: tuple[int, int]  # first and last slot (inclusive) where the object exists


@dataclass(frozen=True)
class Call:
    name: str
    slot: int                  # arrival slot t_c (< 0 in a rolling window: it arrived in an earlier one)
    needs: tuple[int, ...]     # object indices of its first option
    produces: tuple[int, ...]  # objects created by this call (no stall), in any option
    end: int | None = None     # last slot it runs in (inclusive); None: its arrival slot only
    alts: tuple[tuple[int, ...], ...] = ()  # further options: the same state on other GPU groups
    affinity: int | None = None  # calls sharing an affinity choose the same option; None: its own
    wait_s: float | None = None  # W_c: the call may wait instead of running (q_c), at this stall

    @property
    def options(self) -> tuple[tuple[int, ...], ...]:
        return (self.needs,) + self.alts

    @property
    def last(self) -> int:
        return self.slot if self.end is None else max(self.end, self.slot)


@dataclass(frozen=True)
class Instance:
    slot_s: tuple[float, ...]      # slot durations Δ_t
    objects: tuple[Obj, ...]
    calls: tuple[Call, ...]
    hbm: tuple[float, ...]         # per GPU
    h2d: tuple[float, ...]         # per GPU, bytes/s
    dram: dict = field(default_factory=dict)   # node -> bytes
    root: dict = field(default_factory=dict)   # node -> bytes/s
    nvme: dict = field(default_factory=dict)   # node -> bytes/s
    lam: float = 1e-12             # seconds of objective per byte moved
    init: tuple[int, ...] = ()     # tier of each object before slot 0: 0 HBM, 1 DRAM, 2 neither (default)
    lead_s: float = 0.0            # link time before slot 0 for prefetching into it (a window's predecessor)

    @property
    def T(self) -> int:
        return len(self.slot_s)

    def init_tier(self, o: int) -> int:
        return self.init[o] if self.init else 2

    def window_s(self, t: int) -> float:
        """Link time for moves into slot t: the previous slot's duration."""
        return self.slot_s[t - 1] if t > 0 else self.lead_s


@dataclass
class Solution:
    x: np.ndarray  # [O x T]
    y: np.ndarray
    u: np.ndarray
    d: np.ndarray
    v: np.ndarray
    stall: np.ndarray  # per call
    status: str = STATUS_NOT_SOLVED
    objective: float = 0.0
    bound: float = 0.0
    gap: float = 0.0
    solve_s: float = 0.0
    backend: str = ""
    choice: dict = field(default_factory=dict)  # affinity -> option index (absent: option 0)
    wait: np.ndarray | None = None  # per call, 1 where it waits (q_c); None: none waits

    def waits(self, ci: int) -> bool:
        return self.wait is not None and self.wait[ci] > 0.5


def affinity(ci: int, c: Call) -> int:
    """The key of a call's choice: its affinity, or its own (negative) key when it has none."""
    return c.affinity if c.affinity is not None else -1 - ci


def chosen(inst: Instance, sol: Solution, ci: int) -> tuple[int, ...]:
    """The objects of the option call `ci`'s affinity chose in `sol` (where it runs, or loads
    and waits)."""
    c = inst.calls[ci]
    return c.options[sol.choice.get(affinity(ci, c), 0)]


def needers(inst: Instance) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(object, slot) -> (call, option) pairs of the calls arriving at that slot whose option needs it."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ci, c in enumerate(inst.calls):
        for k, opt in enumerate(c.options):
            for o in opt:
                out.setdefault((o, c.slot), []).append((ci, k))
    return out


def active(inst: Instance) -> dict[int, list[int]]:
    """slot -> the calls running in it (their span S_c, cut to the instance)."""
    out: dict[int, list[int]] = {}
    for ci, c in enumerate(inst.calls):
        for t in range(max(c.slot, 0), min(c.last, inst.T - 1) + 1):
            out.setdefault(t, []).append(ci)
    return out


def object_model(name: str) -> tuple[str, str | None, str]:
    """("w" or "kv", program or None, model) of a MILP object name (`w:MODEL@G` or
    `kv:PROGRAM:MODEL@G`, G the GPU group as `0-1`)."""
    kind, rest = name.split(":", 1)
    rest = rest.rsplit("@", 1)[0]
    if kind == "kv":
        prog, model = rest.rsplit(":", 1)
        return kind, prog, model
    return kind, None, rest
