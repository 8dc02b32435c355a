"""Prometheus metrics of the service (`GET /metrics`), one registry per app; docs/service.md
lists them. Counters follow the planner's `Telemetry` hooks; gauges that are cheap to read off the
books (occupancy per tier, engines, adapters' last contact, open ops) are set at scrape time
(`scrape`); `HttpMetrics` times every request by route template.

Every label takes values from a bounded set: tiers and nodes of the cluster, state kinds, the
route templates of the app, and fixed vocabularies (`LEASE_ENDS`, `OP_REASONS`, HTTP methods and
status codes). No id, path or error text is ever a label value.
"""

from __future__ import annotations

import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..service.telemetry import LEASE_ENDS, OP_REASONS, Telemetry

_SECONDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_STALL = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Up to a long poll's longest wait (GET /v1/plan?wait=60).
_HTTP = (1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_KINDS = {"w": "weights", "kv": "kv", "e": "experts"}
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
# An adapter polls at least every 10 s (`engine_adapters/base.py`) and reports after each op: one
# unheard of for a minute is stuck in a long op, or gone.
ADAPTER_ALIVE_S = 60.0


def adapter_ages(planner) -> dict[str, float]:
    """Seconds since each cluster node's adapter last polled its plan or reported an op, on the
    planner's clock (+inf: not since this planner started)."""
    now, seen = planner.now, getattr(planner, "last_seen", {})  # a planner that records no contact: none heard
    return {n: now - seen[n] if n in seen else math.inf for n in planner.cluster.node_by_name}


class ServiceMetrics(Telemetry):
    """The planner's `Telemetry` hooks as Prometheus counters, histograms and gauges, plus the
    gauges `scrape` reads off the planner and the request histogram `HttpMetrics` feeds."""

    def __init__(self, alive_s: float = ADAPTER_ALIVE_S):
        """`alive_s`: an adapter heard from within this many seconds counts as up."""
        self.alive_s = alive_s
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("statebudget_decisions", "planning steps taken", registry=r)
        self.decision_s = Histogram("statebudget_decision_seconds", "wall time of one planning step",
                                    buckets=_SECONDS, registry=r)
        self.leases = Counter("statebudget_leases", "leases by decision at submit (accepted, partial, rejected)",
                              ["outcome"], registry=r)
        self.lease_ends = Counter("statebudget_lease_ends", "leases by the terminal state they ended in, each once",
                                  ["state"], registry=r)
        for s in LEASE_ENDS:  # every series from the first scrape, so that rate() sees the first end
            self.lease_ends.labels(s)
        self.programs_ended = Counter("statebudget_programs_ended", "programs by how they ended, each once",
                                      ["status"], registry=r)
        self.bytes = Counter("statebudget_bytes_moved", "bytes committed per link", ["link"], registry=r)
        self.stalls = Histogram("statebudget_stall_seconds", "wait from call arrival to start",
                                ["handoff"], buckets=_STALL, registry=r)
        self.events = Counter("statebudget_events", "runtime events accepted, by type (repeats included)",
                              ["type"], registry=r)
        self.ops = Counter("statebudget_ops", "ops closed by status and reason class", ["status", "reason"],
                           registry=r)
        self.kv_actions = Counter("statebudget_kv_actions", "tool-wait KV decisions by rule (preserve, swap, discard)",
                                  ["rule"], registry=r)
        self.open_ops = Gauge("statebudget_open_ops", "ops created and not yet closed", registry=r)
        self.plan_version = Gauge("statebudget_plan_version", "current plan version", registry=r)
        self.program_service_cv = Gauge("statebudget_program_service_cv", "queue auto: coefficient of variation of "
                                        "the last finished programs' attained service (NaN until 50)", registry=r)
        self.program_service_cv.set(float("nan"))  # not judged (yet, or not under auto)
        self.queue_ordering = Gauge("statebudget_queue_ordering", "queue auto: 1 for the discipline it orders by now",
                                    ["discipline"], registry=r)
        self.tier_capacity = Gauge("statebudget_tier_capacity_bytes", "usable bytes of each GPU's HBM (gpu:<index>) "
                                   "and each node's host DRAM (host:<node>)", ["tier"], registry=r)
        self.tier_used = Gauge("statebudget_tier_used_bytes", "bytes the books hold in the tier: copies ready or in "
                               "flight, and engines' HBM overhead", ["tier"], registry=r)
        self.tier_copies = Gauge("statebudget_tier_copies", "copies in the tier by kind (weights, kv, experts) and "
                                 "state (ready, in_flight)", ["tier", "kind", "state"], registry=r)
        self.tier_copy_bytes = Gauge("statebudget_tier_copy_bytes", "bytes of those copies in the tier (a copy on a "
                                     "GPU group: its share on each GPU)", ["tier", "kind", "state"], registry=r)
        self.engines = Gauge("statebudget_engines", "engines per node, awake or asleep", ["node", "state"], registry=r)
        self.adapter_age = Gauge("statebudget_adapter_seen_age_seconds", "seconds since the node's adapter last "
                                 "polled its plan or reported an op (+Inf: not since the planner started)",
                                 ["node"], registry=r)
        self.adapter_up = Gauge("statebudget_adapter_up", f"1 if the node's adapter was heard from within the last "
                                f"{alive_s:g} s", ["node"], registry=r)
        self.target_s = Histogram("statebudget_target_solve_seconds", "wall time of one tracking MILP solve, by "
                                  "status (optimal, feasible, greedy)", ["status"], buckets=_SECONDS, registry=r)
        self.http_s = Histogram("statebudget_http_request_seconds", "HTTP requests by route template, method and "
                                "status code", ["route", "method", "status"], buckets=_HTTP, registry=r)

    # ---- the Telemetry hooks ----------------------------------------------------------------------
    def decision(self, seconds: float) -> None:
        self.decisions.inc()
        self.decision_s.observe(seconds)

    def target_solved(self, seconds: float, status: str) -> None:
        self.target_s.labels(status).observe(seconds)

    def lease(self, decision: str) -> None:
        self.leases.labels(decision).inc()

    def lease_ended(self, state: str) -> None:
        self.lease_ends.labels(state).inc()

    def program_ended(self, status: str) -> None:
        self.programs_ended.labels(str(status)).inc()

    def moved(self, link: str, nbytes: float) -> None:
        self.bytes.labels(link).inc(nbytes)

    def stall(self, seconds: float, handoff: bool) -> None:
        self.stalls.labels("true" if handoff else "false").observe(seconds)

    def event(self, kind: str) -> None:
        self.events.labels(kind).inc()

    def op(self, status: str, reason: str = "other") -> None:
        self.ops.labels(str(status), reason if reason in OP_REASONS else "other").inc()

    def kv_action(self, rule: str) -> None:
        self.kv_actions.labels(rule).inc()

    def program_sizes(self, cv: float | None, ordering: str) -> None:
        self.program_service_cv.set(float("nan") if cv is None else cv)
        for d in ("atlas", "fcfs"):
            self.queue_ordering.labels(d).set(1.0 if d == ordering else 0.0)

    # ---- read at scrape time ----------------------------------------------------------------------
    def adapters_up(self, planner) -> dict[str, bool]:
        """Each cluster node: was its adapter heard from within `alive_s`?"""
        return {n: age <= self.alive_s for n, age in adapter_ages(planner).items()}

    def scrape(self, planner) -> None:
        """Set the gauges read off the planner's books, just before the registry is written out.
        Labelled ones are rebuilt whole: a PUT /v1/cluster may have changed the tiers and nodes."""
        tiers, cluster = planner.tiers, planner.cluster
        self.open_ops.set(len(planner.ops))
        self.plan_version.set(planner.plan_version)
        for g in (self.tier_capacity, self.tier_used, self.tier_copies, self.tier_copy_bytes, self.engines,
                  self.adapter_age, self.adapter_up):
            g.clear()
        names = [f"gpu:{g.index}" for g in cluster.gpus] + [f"host:{n.name}" for n in cluster.nodes]
        for g in cluster.gpus:
            self.tier_capacity.labels(f"gpu:{g.index}").set(tiers.hbm_cap[g.index])
            self.tier_used.labels(f"gpu:{g.index}").set(tiers.hbm_used[g.index])
        for n in cluster.nodes:
            self.tier_capacity.labels(f"host:{n.name}").set(tiers.host_cap[n.name])
            self.tier_used.labels(f"host:{n.name}").set(tiers.host_used[n.name])
        count = {(t, k, s): 0 for t in names for k in _KINDS.values() for s in ("ready", "in_flight")}
        nbytes = dict.fromkeys(count, 0.0)
        held = [(f"gpu:{i}", key, c.ready, c.per_gpu) for (key, group), c in tiers.gpu.items() for i in group]
        held += [(f"host:{node}", key, hc.ready, hc.nbytes) for (key, node), hc in tiers.host.items()]
        for tier, key, ready, b in held:
            at = (tier, _KINDS.get(key[0], key[0]), "ready" if ready else "in_flight")
            count[at] = count.get(at, 0) + 1
            nbytes[at] = nbytes.get(at, 0.0) + b
        for at, n in count.items():
            self.tier_copies.labels(*at).set(n)
            self.tier_copy_bytes.labels(*at).set(nbytes[at])
        engines = {(n.name, s): 0 for n in cluster.nodes for s in ("awake", "asleep")}
        for (_, group), e in tiers.engines.items():
            engines[(planner.gpus[group[0]].node, "asleep" if e.asleep else "awake")] += 1
        for at, n in engines.items():
            self.engines.labels(*at).set(n)
        for node, age in adapter_ages(planner).items():
            self.adapter_age.labels(node).set(age)
            self.adapter_up.labels(node).set(1.0 if age <= self.alive_s else 0.0)

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One HTTP request answered (`HttpMetrics`)."""
        self.http_s.labels(route, method if method in _METHODS else "other", str(status)).observe(seconds)


class HttpMetrics:
    """ASGI middleware: each HTTP request's seconds, by the template of the route that took it
    (`/v1/leases/{lease_id}`, never the path with its ids; `unmatched` for a path no route has),
    method and status code. A request that raised counts as 500, the answer the server gives."""

    def __init__(self, app, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_seen(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_seen)
        finally:
            # the router sets the matched route into this very scope (Starlette's `Router.app`)
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.request(route, scope["method"], status, time.perf_counter() - t0)
