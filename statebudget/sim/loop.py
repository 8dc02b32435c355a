"""The event loop: pop `(time, priority, tie, handler, args)`, set the clock, run the handler, push
the events it returns `(time, priority, handler, args)`. Ties break by priority, then by the order
the events were pushed (`tie`), so a seed gives one history."""

from __future__ import annotations

import heapq

PRIO_FLOW, PRIO_TIMER, PRIO_NODE, PRIO_PROGRAM, PRIO_TICK, PRIO_QUEUE = range(6)


class EventLoop:
    """The clock and the heap of a simulator. A subclass provides `recorder` (`Recorder`),
    `check_invariants`, `_check_books(dirty)`, `_open_programs` and `_when_idle()`: what to do when
    the heap is empty (True if it pushed something)."""

    def _init_loop(self) -> None:
        self.now = 0.0
        self._heap: list = []
        self._tie = 0  # the heap's tie-break: the order events were pushed

    def push(self, t, prio, fn, args=()):
        self._tie += 1
        heapq.heappush(self._heap, (t, prio, self._tie, fn, args))

    def _push_all(self, events):
        """Schedule events `(time, priority, handler, args)`."""
        if events:
            for t, prio, fn, args in events:
                self._tie += 1
                heapq.heappush(self._heap, (t, prio, self._tie, fn, args))

    def _run_loop(self, progress=None) -> None:
        heap, pop, rec = self._heap, heapq.heappop, self.recorder
        next_report = 0.0
        while heap or self._when_idle():
            t, _, _, fn, args = pop(heap)
            if t > self.now:
                rec.advance(self.now, t)
                self.now = t
            rec.events += 1
            self._push_all(fn(*args))
            if self.check_invariants:
                self._check_books(rec.dirty)
            if rec.end is None and self._open_programs == 0:
                rec.end = self.now  # later events only finish transfers
            if progress is not None and t >= next_report:
                progress(t)
                next_report = t + 60.0
