"""Past capacity: what the planner does when calls queue for HBM faster than groups drain them.

The one signal is the admission queue the view reports now (`ResidencyView.admission_queue`:
each call waiting for HBM, its model and group, its expected run seconds from the cost model and
the output estimate — never its true output, never a future arrival — and how long it has
waited). A group is past capacity when the work queued on it would keep a new call waiting at
least `PlannerConfig.overload_wait_s` and a call there has already waited that long (a queue
that a burst or a cold start leaves behind drains before both hold):

    wait(g) = max over GPUs i of g:  queued run seconds on i / max(1, calls running on i)

Past capacity on a group, three things change, and nothing below it:

- placement: a call goes where restore + that wait is least, not to the group that holds its
  weights (at 3x swe-team, 40 of 41 waiting calls could have been admitted elsewhere at once);
- leases onto the group are rejected, with the wait as `retry_after_s`: their state would sit
  behind the queue while it takes link and HBM from calls that are waiting already;
- speculation yields: the planning step promotes nothing onto the group that no lease asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueLoad:
    """The admission queue summed per GPU, without the clock: what a view can keep up to date as
    calls join and leave and output estimates move (the simulator's `queue_load`, `sim/waiting.py`),
    so that a step reads 16 numbers instead of a queue hundreds long."""
    waiting: tuple[int, ...]     # per GPU: calls waiting for HBM on a group that holds it
    queued_s: tuple[float, ...]  # per GPU: their expected run seconds
    first_s: tuple[float, ...]   # per GPU: when its longest-waiting call arrived (inf: none waits)

    @classmethod
    def of(cls, n_gpu: int, by_group: dict) -> "QueueLoad":
        """From {group: (calls waiting on it, their run seconds, the first one's arrival)}."""
        waiting, queued, first = [0] * n_gpu, [0.0] * n_gpu, [math.inf] * n_gpu
        for group, (n, run_s, arrived) in by_group.items():
            for i in group:
                waiting[i] += n
                queued[i] += run_s
                if arrived < first[i]:
                    first[i] = arrived
        return cls(tuple(waiting), tuple(queued), tuple(first))


@dataclass(frozen=True)
class Pressure:
    """The admission queue as the planner reads it at one instant."""
    waiting: tuple[int, ...]      # per GPU: calls waiting for HBM on a group that holds it
    queued_s: tuple[float, ...]   # per GPU: their expected run seconds
    running: tuple[int, ...]      # per GPU: calls running there
    oldest_s: tuple[float, ...]   # per GPU: how long its longest-waiting call has waited
    threshold_s: float

    @classmethod
    def of(cls, view, threshold_s: float, queue=None) -> "Pressure":
        """`queue`: the view's `admission_queue()` if the caller has it already."""
        n = len(view.tiers.hbm_cap)
        waiting, queued, oldest = [0] * n, [0.0] * n, [0.0] * n
        for _, group, run_s, waited_s in (view.admission_queue() if queue is None else queue):
            for i in group:
                waiting[i] += 1
                queued[i] += run_s
                if waited_s > oldest[i]:
                    oldest[i] = waited_s
        running = getattr(view, "running_on", None) or [0] * n
        return cls(tuple(waiting), tuple(queued), tuple(running), tuple(oldest), threshold_s)

    @classmethod
    def at(cls, load: QueueLoad, running, now: float, threshold_s: float) -> "Pressure":
        """From a kept `QueueLoad` at `now`: the longest wait is `now` less the first arrival."""
        oldest = tuple(now - f if f != math.inf else 0.0 for f in load.first_s)
        return cls(load.waiting, load.queued_s, tuple(running), oldest, threshold_s)

    def wait_s(self, group) -> float:
        """Seconds a call joining `group`'s queue now is expected to wait for the calls ahead."""
        return max(self.queued_s[i] / max(1, self.running[i]) for i in group)

    def longest_wait_s(self, group) -> float:
        """How long the longest-waiting call on `group`'s GPUs has waited."""
        return max(self.oldest_s[i] for i in group)

    def past_capacity(self, group) -> bool:
        """The queue ahead would hold a new call `threshold_s`, and one call has already waited
        that long: a queue that a burst or a cold start leaves drains before either holds."""
        return self.wait_s(group) >= self.threshold_s and self.longest_wait_s(group) >= self.threshold_s

    @property
    def any_past(self) -> bool:
        return any(self.past_capacity((i,)) for i in range(len(self.waiting)))

    def reason(self, group) -> tuple[str, float]:
        """Why a lease onto `group` is rejected, in words, and when to ask again (seconds)."""
        n = max(self.waiting[i] for i in group)
        wait = self.wait_s(group)
        gpus = ",".join(str(i) for i in group)
        return (f"overloaded: {n} calls wait for HBM on gpu:{gpus}, about {wait:.0f} s of work; "
                f"retry after {wait:.0f} s"), round(wait, 3)
