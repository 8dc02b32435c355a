"""What the live planner reports as it works. The planner calls these hooks; the service plugs
Prometheus in (`api/metrics.py`, `ServiceMetrics`); the default does nothing, for tests and
embedded use."""

from __future__ import annotations


class Telemetry:
    """The planner's hooks, each called once per thing it counts, never for a refused request."""

    def decision(self, seconds: float) -> None:
        """A planning step (`tick`) took `seconds` of wall time."""

    def lease(self, outcome: str) -> None:
        """A lease was decided (accepted, partial, rejected) or cancelled by the runtime."""

    def moved(self, link: str, nbytes: float) -> None:
        """A committed op put `nbytes` on `link`."""

    def stall(self, seconds: float, handoff: bool) -> None:
        """A call started `seconds` after it arrived; `handoff`: its program changed model."""

    def event(self, kind: str) -> None:
        """A runtime event of type `kind` was applied."""

    def op(self, status: str) -> None:
        """An op closed with `status` (done, failed, cancelled)."""

    def kv_action(self, rule: str) -> None:
        """A tool-wait KV decision of `rule` (preserve, swap, discard) was taken anew."""

    def program_sizes(self, cv: float | None, ordering: str) -> None:
        """Queue `auto`: the CV of finished programs' service, and the discipline it orders by."""
