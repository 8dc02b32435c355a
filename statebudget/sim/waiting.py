"""The calls waiting for HBM, summed per group as they join and leave (`AdmissionMixin.queue_load`).

The planner reads the admission queue at every planning step and placement, and past capacity
the queue is hundreds of calls long (the decision-time bench keeps ~175 waiting). Summing it anew
whenever a call joined, left or its model's output estimate moved cost a third of a step; kept
here, a join or a leave touches one group, and a moved estimate re-reads that model's calls only,
on every group in one numpy pass (`AdmissionMixin._queued_runs`).

Runs are summed in whole nanoseconds: integer sums are exact, so adding and removing calls in any
order gives the sums a fresh pass would (to the nanosecond of each run)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..planner.overload import QueueLoad
from .calls import CallRec

NS = 1e9


class WaitingSums:
    """Per group: the calls that wait there, in their order of arrival (a call joins at the
    instant it arrives, but one routed again after a refusal joins late and is put in its
    place), and their expected runs summed in ns."""

    def __init__(self, n_gpu: int):
        self.n_gpu = n_gpu
        # id -> (call, its run ns as summed, the group it is summed on: a call the policy moves
        # (`on_waiting`) leaves the group it joined)
        self.calls: dict[int, tuple[CallRec, int, tuple]] = {}
        self.at: dict[tuple, dict[int, CallRec]] = {}    # group -> id -> call, first arrived first
        self.of_model: dict[str, dict[tuple, dict[int, CallRec]]] = {}  # model -> group -> id -> call
        self.count_at: dict[str, int] = {}              # model -> estimate count its runs were taken at
        self.ns: dict[tuple, int] = {}
        self._load: QueueLoad | None = None              # None: changed since built
        self._oldest: dict[tuple, float] | None = None   # `oldest`; None: a call joined or left since

    def add(self, c: CallRec, run_s: float) -> None:
        ns, g = round(run_s * NS), c.group
        self.calls[id(c)] = (c, ns, g)
        for by in (self.at, self.of_model.setdefault(c.model, {})):
            calls = by.setdefault(g, {})
            late = calls and next(reversed(calls.values())).arrive > c.arrive
            calls[id(c)] = c
            if late:  # routed again after a refusal: into its place by arrival
                by[g] = dict(sorted(calls.items(), key=lambda kv: kv[1].arrive))
        self.ns[g] = self.ns.get(g, 0) + ns
        self._load = self._oldest = None

    def discard(self, c: CallRec) -> None:
        got = self.calls.pop(id(c), None)
        if got is None:
            return
        g = got[2]
        del self.at[g][id(c)]
        del self.of_model[c.model][g][id(c)]
        self.ns[g] -= got[1]
        self._load = self._oldest = None

    def oldest(self) -> dict[tuple, float]:
        """(model, group) -> when the longest-waiting call of that model there arrived: the first
        in the group's order of arrival. Kept until a call joins or leaves (every planning step
        asks); the caller only reads it."""
        if self._oldest is None:
            self._oldest = {(model, g): next(iter(calls.values())).arrive
                            for model, of_group in self.of_model.items() for g, calls in of_group.items() if calls}
        return self._oldest

    def depth(self) -> dict[tuple, int]:
        """(model, group) -> how many calls of that model wait there."""
        return {(model, g): len(calls) for model, of_group in self.of_model.items() for g, calls in of_group.items() if calls}

    def load(self, counts: dict[str, int], runs: Callable[[str, list, list], np.ndarray]) -> QueueLoad | None:
        """The sums as a `QueueLoad`, None when no call waits; `counts`: each model's output
        estimate count now (its version), `runs(model, groups, calls)`: their expected run seconds
        (`groups`: each call's group)."""
        if not self.calls:
            return None
        for model, of_group in self.of_model.items():
            now = counts.get(model, 0)
            if self.count_at.get(model) == now:
                continue
            self.count_at[model] = now
            got, at = [], []
            for g, calls in of_group.items():
                got += calls.values()
                at += [g] * len(calls)
            if not got:
                continue
            new = np.rint(runs(model, at, got) * NS).astype(np.int64).tolist()
            calls = self.calls
            for c, g, ns in zip(got, at, new):
                old = calls[id(c)][1]
                if ns != old:
                    calls[id(c)] = (c, ns, g)
                    self.ns[g] += ns - old
            self._load = None
        if self._load is None:
            self._load = QueueLoad.of(self.n_gpu, {g: (len(calls), self.ns[g] / NS, next(iter(calls.values())).arrive)
                                                   for g, calls in self.at.items() if calls})
        return self._load
