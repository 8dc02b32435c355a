"""The replay of an offline schedule (`Oracle`): each call's GPU group and the time it holds it.

Per group the calls are kept in the schedule's order. On every event the replay promotes what the
next `lookahead` pending calls of each group need (their weights, the expert pages they will
touch, their program's KV), nearest first; a promote may only evict state the schedule needs
later than the promoted state (Belady's rule with the schedule's foresight), evictions go by the
same next use, and evicted weights sleep in host DRAM. Where a call runs is the `Oracle`'s choice
(`group` gives the schedule's).
"""

from __future__ import annotations

import math

from ..core.decisions import Promote
from ..models.state import expert_key, kv_key, weights_key

_PASSED = frozenset({"loading", "queued", "running", "done", "cancelled", "unplaceable"})


class FollowSchedule:
    def __init__(self, schedule: dict, sim, lookahead: int | None = None):
        """`schedule`: {(program, node): (group, ready_s, end_s)}; `lookahead`: pending calls per
        group whose state is prefetched (None: all)."""
        self.plan, self.lookahead = schedule, lookahead
        self.model = {(p.program, n.id): n.model for p in sim.trace.programs for n in p.nodes if n.kind == "call"}
        self.order: dict[tuple, list] = {}
        self.uses: dict[tuple, list] = {}  # (group, state id) -> keys in schedule order
        for key, (g, _, _) in sorted(schedule.items(), key=lambda kv: (kv[1][1], kv[0])):
            self.order.setdefault(g, []).append(key)
            m = self.model[key]
            self.uses.setdefault((g, ("m", m)), []).append(key)
            self.uses.setdefault((g, kv_key(key[0], m)), []).append(key)
        self.ptr: dict[tuple, int] = {}
        self.need: dict = {}

    def _rec(self, sim, key):
        pr = sim.programs.get(key[0])
        return pr.calls.get(key[1]) if pr is not None else None

    def _pending(self, sim, key) -> bool:
        rec = self._rec(sim, key)
        return rec is None or rec.state not in _PASSED

    def _first_pending(self, sim, name, keys: list) -> int:
        i = self.ptr.get(name, 0)
        while i < len(keys) and not self._pending(sim, keys[i]):
            i += 1
        self.ptr[name] = i
        return i

    def group(self, call):
        """The group the schedule runs the call on (None: not in the schedule)."""
        return self.plan.get((call.program, call.node), (None,))[0]

    def next_states(self, sim) -> list:
        out, self.need = [], {}
        for g, keys in self.order.items():
            taken = 0
            for key in keys[self._first_pending(sim, g, keys):]:
                if self.lookahead is not None and taken >= self.lookahead:
                    break
                if not self._pending(sim, key):
                    continue
                taken += 1
                model = self.model[key]
                want = [weights_key(model)]
                rec = self._rec(sim, key)
                if rec is not None:
                    want += [expert_key(model, p) for p in rec.pages]
                kvk = kv_key(key[0], model)
                if sim.kv_tokens.get(kvk, 0) > 0:
                    want.append(kvk)
                for k in want:
                    if (k, g) not in self.need:
                        self.need[(k, g)] = self.plan[key][1]
                        if (k, g) not in sim.tiers.gpu:
                            out.append(Promote(k, g))
        return out

    def next_use(self, sim, copy) -> float:
        """When the next pending call on the copy's group needs it, by the schedule (inf: never)."""
        sid = copy.key if copy.key[0] == "kv" else ("m", copy.key[1])
        keys = self.uses.get((copy.group, sid))
        if not keys:
            return math.inf
        for key in keys[self._first_pending(sim, (copy.group, sid), keys):]:
            if self._pending(sim, key):
                return self.plan[key][1]
        return math.inf

    def evict_priority(self, sim, copy):
        """What no pending call on its group needs goes first, then what is needed last."""
        return (-self.next_use(sim, copy), copy.last_use)

    def may_evict(self, sim, victim, key, group) -> bool:
        """A prefetch of `key` onto `group` evicts only what its own group's schedule needs later."""
        return self.next_use(sim, victim) > self.need.get((key, group), math.inf)
