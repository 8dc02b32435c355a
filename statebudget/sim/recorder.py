"""What a run measures: counters the mechanism bumps as it moves bytes and runs calls, the HBM
samples and the warm-tax integral, and the `SimResult` built from them at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .calls import CallRec
    from .programs import ProgRun


@dataclass
class SimResult:
    calls: list[CallRec]
    programs: dict[str, ProgRun]
    bytes_by_pair: Counter
    bytes_by_link: dict[str, float]
    wasted_bytes: float
    warm_tax: float
    hbm_samples: list[tuple[float, float, float, float]]  # t, weights, experts, kv bytes in HBM
    decision_ms: list[float]
    events: int
    stale_events: int
    sim_end: float
    hbm_total: float
    kv_actions: Counter = field(default_factory=Counter)
    kv_hbm_byte_s: float = 0.0
    recomputed_tokens: int = 0
    ttl_errors: list = field(default_factory=list)
    failed_attempts: int = 0      # call attempts that failed (`call_failure_rate`) and were retried
    failed_service_s: float = 0.0  # compute seconds those attempts had run: lost, yet attained service
    moved_calls: int = 0  # calls moved to another group while they waited for HBM (`Policy.on_waiting`)
    page_refusals: int = 0  # times a group refused a call its own pages could not fit (`AdmissionMixin._maybe_refuse`)
    preemptions: int = 0  # running calls an engine preempted for want of KV room (`kv_reserve` paged)
    queue_switches: list = field(default_factory=list)  # `auto`'s switches (`ProgramSizes.changes`)
    warmup_s: float = 0.0  # SimConfig.warmup_s: the metrics leave out what came before it
    cost: object = None    # the run's CostModel (ideal TTFT, `metrics.py`)
    timeline: list = field(default_factory=list)  # `Recorder.weights_event`s, with SimConfig.timeline


class Recorder:
    """The measurements of one run. `tiers` and `running_models` are the simulator's books, read
    to sample HBM; whoever changes what HBM holds sets `dirty`."""

    def __init__(self, tiers, running_models: Counter, sample_dt: float):
        self.tiers, self.running_models, self.sample_dt = tiers, running_models, sample_dt
        self.events = 0
        self.stale_events = 0  # flow completions superseded by a re-pricing of their flow
        self.bytes_by_pair: Counter = Counter()
        self.wasted_bytes = 0.0
        self.decision_ms: list[float] = []
        self.kv_hbm_byte_s = 0.0
        self.recomputed_tokens = 0
        self.failed_attempts, self.failed_service_s = 0, 0.0
        self.moved_calls = 0
        self.page_refusals = 0
        self.preemptions = 0
        self.hbm_samples: list = []
        self.end: float | None = None  # when the last program finished; the warm tax stops there
        self.dirty = True
        self._last_sample = -1e18
        self._wt_value = 0.0
        self._wt_integral = 0.0
        self.warmup_s, self.flows, self.cost = 0.0, None, None
        self._base: tuple | None = None  # the byte counters at the end of the warm-up
        self.timeline: list | None = None  # a list when SimConfig.timeline asks for it

    def weights_event(self, t: float, event: str, model: str, group, **detail) -> None:
        """One change of where a model's weights live (`SimConfig.timeline`), e.g. `load` (a call
        brings them), `prefetch`, `evict`, `engine-stop`: when, on which GPUs, and why."""
        if self.timeline is not None:
            self.timeline.append({"t": round(t, 3), "event": event, "model": model, "gpus": list(group), **detail})

    def measure_from(self, warmup_s: float, flows, cost) -> None:
        """Count bytes and the warm tax from `warmup_s` on (`flows`: whose per-link bytes to
        snapshot then); `cost` travels to the `SimResult` for the metrics."""
        self.warmup_s, self.flows, self.cost = warmup_s, flows, cost

    def _snapshot(self) -> None:
        """What was moved and wasted before the warm-up ended, to take off the totals."""
        links = Counter(self.flows.work_done) if self.flows is not None else Counter()
        self._base = (Counter(self.bytes_by_pair), self.wasted_bytes, links)

    def advance(self, old: float, new: float) -> None:
        """The clock moves from `old` to `new`. HBM metrics are piecewise constant: computed once
        per instant, from the state all events at `old` left behind."""
        if self.dirty:
            self._refresh_hbm(old)
        if self._base is None and self.warmup_s > 0 and new >= self.warmup_s:
            self._snapshot()  # before the first event at or after the warm-up's end
        if self.end is None:
            lo = max(old, self.warmup_s)
            if new > lo:
                self._wt_integral += self._wt_value * (new - lo)

    def _refresh_hbm(self, now: float) -> None:
        self.dirty = False
        idle = w = e = kv = 0.0
        running = self.running_models
        for c in self.tiers.gpu.values():
            kind = c.key[0]
            nb = c.per_gpu * len(c.group)
            if kind == "kv":
                kv += nb
                continue
            if kind == "w":
                w += nb
            else:
                e += nb
            if not running.get((c.key[1], c.group)):
                idle += nb
        self._wt_value = idle / sum(self.tiers.hbm_cap)
        if now - self._last_sample >= self.sample_dt:
            self._last_sample = now
            self.hbm_samples.append((now, w, e, kv))

    def result(self, calls, programs, flows, kvw, sizes) -> SimResult:
        end = self.end
        pairs, wasted, links = self.bytes_by_pair, self.wasted_bytes, flows.work_done
        if self.warmup_s > 0:
            if self._base is None:  # nothing happened after the warm-up: nothing counts
                self.flows = flows
                self._snapshot()
            b_pairs, b_wasted, b_links = self._base
            pairs = Counter({k: v - b_pairs.get(k, 0.0) for k, v in pairs.items()})
            wasted = wasted - b_wasted
            links = {k: v - b_links.get(k, 0.0) for k, v in links.items()}
        span = (end or 0.0) - self.warmup_s
        return SimResult(
            calls=calls, programs=programs, bytes_by_pair=pairs,
            bytes_by_link={k: v for k, v in sorted(links.items()) if not k.startswith("gpu:")},
            wasted_bytes=wasted, warm_tax=self._wt_integral / span if span > 0 else 0.0,
            hbm_samples=self.hbm_samples, decision_ms=self.decision_ms, events=self.events,
            stale_events=self.stale_events, sim_end=end or 0.0,
            hbm_total=sum(self.tiers.hbm_cap), kv_actions=kvw.actions, kv_hbm_byte_s=self.kv_hbm_byte_s,
            recomputed_tokens=self.recomputed_tokens, ttl_errors=kvw.ttl_errors,
            failed_attempts=self.failed_attempts, failed_service_s=self.failed_service_s, moved_calls=self.moved_calls,
            page_refusals=self.page_refusals, preemptions=self.preemptions,
            queue_switches=sizes.changes, warmup_s=self.warmup_s, cost=self.cost, timeline=self.timeline or [])
