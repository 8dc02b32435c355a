"""Prometheus metrics of the service (`GET /metrics`), one registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..service.telemetry import Telemetry

_SECONDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_STALL = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServiceMetrics(Telemetry):
    """The planner's `Telemetry` hooks as Prometheus counters, histograms and gauges."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("statebudget_decisions", "planning steps taken", registry=r)
        self.decision_s = Histogram("statebudget_decision_seconds", "wall time of one planning step",
                                    buckets=_SECONDS, registry=r)
        self.leases = Counter("statebudget_leases", "leases by outcome", ["outcome"], registry=r)
        self.bytes = Counter("statebudget_bytes_moved", "bytes committed per link", ["link"], registry=r)
        self.stalls = Histogram("statebudget_stall_seconds", "wait from call arrival to start",
                                ["handoff"], buckets=_STALL, registry=r)
        self.events = Counter("statebudget_events", "runtime events by type", ["type"], registry=r)
        self.ops = Counter("statebudget_ops", "ops closed by status", ["status"], registry=r)
        self.kv_actions = Counter("statebudget_kv_actions", "tool-wait KV decisions by rule (preserve, swap, discard)",
                                  ["rule"], registry=r)
        self.open_ops = Gauge("statebudget_open_ops", "ops created and not yet closed", registry=r)
        self.plan_version = Gauge("statebudget_plan_version", "current plan version", registry=r)
        self.program_service_cv = Gauge("statebudget_program_service_cv", "queue auto: coefficient of variation of "
                                        "the last finished programs' attained service (NaN until 50)", registry=r)
        self.program_service_cv.set(float("nan"))  # not judged (yet, or not under auto)
        self.queue_ordering = Gauge("statebudget_queue_ordering", "queue auto: 1 for the discipline it orders by now",
                                    ["discipline"], registry=r)

    def decision(self, seconds: float) -> None:
        self.decisions.inc()
        self.decision_s.observe(seconds)

    def lease(self, outcome: str) -> None:
        self.leases.labels(outcome).inc()

    def moved(self, link: str, nbytes: float) -> None:
        self.bytes.labels(link).inc(nbytes)

    def stall(self, seconds: float, handoff: bool) -> None:
        self.stalls.labels("true" if handoff else "false").observe(seconds)

    def event(self, kind: str) -> None:
        self.events.labels(kind).inc()

    def op(self, status: str) -> None:
        self.ops.labels(status).inc()

    def kv_action(self, rule: str) -> None:
        self.kv_actions.labels(rule).inc()

    def program_sizes(self, cv: float | None, ordering: str) -> None:
        self.program_service_cv.set(float("nan") if cv is None else cv)
        for d in ("atlas", "fcfs"):
            self.queue_ordering.labels(d).set(1.0 if d == ordering else 0.0)
