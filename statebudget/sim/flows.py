"""Fair sharing of links and GPUs among concurrent work (DESIGN.md §3).

Every transfer and every compute phase is a *flow*: an amount of work (bytes, or seconds of GPU
time at full speed) crossing a set of resources. A resource splits its capacity equally among the
*share groups* of the flows on it, and a flow runs at the smallest share it gets on its path:

    link  h2d:n0/g0  cap 25 GB/s, 2 flows          -> 12.5 GB/s each
    gpu   gpu:3      cap 1.0, calls of 2 models    -> 0.5 each; calls of one model batch together

A background flow has a weight below 1, and the background flows of that weight on a resource
are one *pool* (`Pool`): the pool counts once, with that weight, and its flows split its share. So the
background traffic on a link together gets a budget: with weight 0.25, tool-wait KV swaps next
to one weight load get 20 % of the link between them and the load 80 %, however many swaps
there are; with no foreground flow, the whole link. (A share group of foreground flows is a
batch instead: calls of one model each run at the group's share.)

Only flows that share a resource with a flow that started or ended change rate, so an update
touches those flows alone. Completion events carry the flow's version; a stale one is ignored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

_EPS = 1e-12


@dataclass(frozen=True)
class Pool:
    """The share key of the background flows of one weight: on each resource they split one
    share among them (a budget), where the flows of any other key each take the group's whole
    share (a batch). One pool per weight, so a group's weight is its members' weight."""
    weight: float


@dataclass(slots=True, eq=False)
class Flow:
    fid: int
    remaining: float
    resources: tuple[str, ...]
    share_key: object
    on_done: Callable[[float], object]
    rate: float = 0.0
    t_last: float = 0.0
    version: int = 0
    done: float = 0.0  # work done so far
    tag: object = None  # what the owner accounts this flow's work under (e.g. a tier pair)
    weight: float = 1.0  # its share group's weight on every resource it crosses


@dataclass
class FairShare:
    capacity: dict[str, float]
    flows: dict[int, Flow] = field(default_factory=dict)
    _on: dict[str, set[int]] = field(default_factory=dict)
    _groups: dict[str, Counter] = field(default_factory=dict)
    _weight: dict[str, float] = field(default_factory=dict)  # resource -> sum of its share groups' weights
    _next: int = 0
    work_done: Counter = field(default_factory=Counter)  # per resource, for bytes-per-link

    def add(self, now: float, amount: float, resources: tuple[str, ...], on_done, share_key=None, tag=None,
            weight: float = 1.0) -> list:
        """Start a flow; returns completion events `(eta, fid, version)` to schedule. Flows of one
        share key must have one weight; a flow of weight below 1 with no key joins the pool of its weight."""
        fid = self._next
        self._next += 1
        if share_key is None:
            share_key = Pool(weight) if weight < 1.0 else fid
        f = Flow(fid, max(amount, 0.0), resources, share_key, on_done, t_last=now, tag=tag, weight=weight)
        self.flows[fid] = f
        touched = set()
        for r in resources:
            self._on.setdefault(r, set()).add(fid)
            self._join(f, r)
            touched.update(self._on[r])
        return self._reprice(now, touched)

    def reweight(self, now: float, fid: int, weight: float) -> list:
        """Change a flow's weight (a background transfer that a call now waits for: it leaves the
        pool for a share of its own); returns the re-priced completion events."""
        f = self.flows.get(fid)
        if f is None or f.weight == weight:
            return []
        touched = set()
        for r in f.resources:
            self._leave(f, r)
        f.weight = weight
        if isinstance(f.share_key, Pool):
            f.share_key = fid
        for r in f.resources:
            self._join(f, r)
            touched.update(self._on[r])
        return self._reprice(now, touched)

    def _join(self, f: Flow, r: str) -> None:
        g = self._groups.setdefault(r, Counter())
        if not g[f.share_key]:
            self._weight[r] = self._weight.get(r, 0.0) + f.weight
        g[f.share_key] += 1

    def _leave(self, f: Flow, r: str) -> None:
        g = self._groups[r]
        g[f.share_key] -= 1
        if g[f.share_key] <= 0:
            del g[f.share_key]
            self._weight[r] = self._weight[r] - f.weight if g else 0.0

    def finish(self, now: float, fid: int, version: int) -> tuple[list, Flow | None]:
        """Handle a completion event; returns (events to schedule, the finished flow or None if stale)."""
        f = self.flows.get(fid)
        if f is None or f.version != version:
            return [], None
        self._advance(f, now)
        if f.remaining > 0 and f.remaining < 1e-6 * max(f.done, 1.0):
            f.done += f.remaining  # float residue of a completed flow
        del self.flows[fid]
        touched = set()
        for r in f.resources:
            self._on[r].discard(fid)
            self._leave(f, r)
            self.work_done[r] += f.done
            touched.update(self._on[r])
        return self._reprice(now, touched), f

    def _advance(self, f: Flow, now: float) -> None:
        step = f.rate * (now - f.t_last)
        f.remaining -= step
        f.done += step
        f.t_last = now

    def _reprice(self, now: float, fids) -> list:
        events = []
        for fid in sorted(fids):
            f = self.flows[fid]
            pooled = isinstance(f.share_key, Pool)
            rate = min(self.capacity[r] * f.weight / self._weight[r] / (self._groups[r][f.share_key] if pooled else 1)
                       for r in f.resources)
            if rate == f.rate and f.version > 0:
                continue  # same share: its scheduled completion still holds
            self._advance(f, now)
            f.rate = rate
            f.version += 1
            eta = now + max(f.remaining, 0.0) / f.rate if f.remaining > _EPS else now
            events.append((eta, fid, f.version))
        return events

    def cancel(self, now: float, fid: int) -> tuple[list, Flow | None]:
        """Stop a flow before it completes (its work so far still counts on its links)."""
        f = self.flows.get(fid)
        if f is None:
            return [], None
        return self.finish(now, fid, f.version)
