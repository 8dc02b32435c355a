"""Decision time of the online planner with about N live programs (`statebudget bench planner`),
measured on REPLAYED state (DESIGN.md §4, decision time): the whole policy hook (predictor update,
planning step, lease admission, decisions) as the simulator times it in `Simulator._decide`, while
a generated trace runs on the cluster, not one planning step on a frozen state.

How N programs come to be live: a preset's program arrival rate is scaled (`generate(..., load)`).
A first guess comes from Little's law, live = arrival rate x mean program duration, with the
zero-stall duration of the preset's programs on the reference machine; a loaded cluster stretches
programs, so the replay is rerun with the load scaled by N / (live seen) until the mean number of
live programs in the timed window is within `TOLERANCE` of N (at most `tries` replays; the result
says what it saw either way). A program is live from its start until its last node ends.

The replay runs `fill_s` simulated seconds (the live count builds up, default: 2 x the nominal
program duration) and then times every hook in the next `window_s` seconds; it is stopped there
(the drain that follows measures nothing).

A shared machine adds its own noise to a hook's wall time, and a single run's p99 moves with it.
With `repeat` > 1 the final replay runs that many times: it makes the same decisions each time
(same seed), so hook k is the same work in every run, and the least time each hook took over the
runs is its cost with most of the machine's noise taken out. Both are reported: each run's
percentiles, and those of the per-hook least times (`decision_ms_least`), also per hook
(`decision_ms_by_hook`: least times, else the final run's). Every run's decisions
are hashed: a policy whose solver stops on a wall-clock limit (`statebudget-track`'s MILP, `static`)
can decide differently on a loaded machine, and then there is no least time (`decisions_differ`).

The same decisions have taken twice as long on one machine as on another: `machine_reference_ms`
times a fixed piece of Python before and after the replays (the lesser is kept), a rough indicator
of the machine's speed to read beside the figures."""

from __future__ import annotations

import gc
import hashlib
import math
import platform
import time

import numpy as np

from ..models.catalog import Catalog
from ..models.cluster import Cluster
from ..policies import make_policy
from ..traces.generators import generate
from ..traces.timeline import nominal_timeline
from .config import SimConfig
from .engine import Simulator

TOLERANCE = (0.75, 1.33)  # accepted (mean live seen) / N


class _Stop(Exception):
    """Raised from a hook once the timed window is over: ends the replay there."""


class _TimedSim(Simulator):
    """Keeps, for every hook in [window_from, window_to), its time and the live programs then."""

    def __init__(self, *a, window_from: float, window_to: float, **kw):
        super().__init__(*a, **kw)
        self.window_from, self.window_to = window_from, window_to
        self.hook_ms: list[float] = []
        self.hook_names: list[str] = []
        self.live_seen: list[int] = []
        self.decisions = hashlib.sha256()  # what every timed hook decided, in order

    def live(self) -> int:
        # started (in `programs`) minus finished (counted down from the trace's total)
        return len(self.programs) - (len(self.trace.programs) - self._open_programs)

    def _decide(self, fn, *args):
        if self.now >= self.window_to:
            raise _Stop
        out = super()._decide(fn, *args)
        if self.now >= self.window_from:
            name = getattr(fn, "__name__", "")
            self.hook_ms.append(self.recorder.decision_ms[-1])
            self.hook_names.append(name)
            self.live_seen.append(self.live())
            self.decisions.update(repr((self.now, name, out)).encode())
        return out


def nominal_rate_and_duration(catalog: Catalog, preset: str, seed: int) -> tuple[float, float]:
    """Programs per second of the preset at load 1 and their mean zero-stall duration (s)."""
    tr = generate(preset, seed, 1.0)
    end: dict[str, float] = {}
    for (pid, _), (_, e) in nominal_timeline(tr, catalog).items():
        end[pid] = max(end.get(pid, 0.0), e)
    dur = [end[p.program] - p.start for p in tr.programs if p.program in end]
    return len(tr.programs) / 3600.0, float(np.mean(dur)) if dur else 60.0


def replayed_decisions(cluster: Cluster, catalog: Catalog, policy: str, preset: str, seed: int, load: float,
                       fill_s: float, window_s: float, start: str = "warm") -> dict:
    """One replay of `preset` at `load`, timed in [fill_s, fill_s + window_s)."""
    tr = generate(preset, seed, (fill_s + window_s) / 3600.0, load=load)
    sim = _TimedSim(cluster, catalog, tr, make_policy(policy), config=SimConfig(seed=seed, start=start),
                    window_from=fill_s, window_to=fill_s + window_s)
    try:
        sim.run()
    except _Stop:  # the timed window is over: the rest of the replay is not needed
        pass
    a = np.asarray(sim.hook_ms) if sim.hook_ms else np.zeros(0)
    return {"decision_ms": _percentiles(a), "hooks": int(a.size), "hook_ms": a, "hook_names": sim.hook_names,
            "decisions_sha256": sim.decisions.hexdigest(),
            "live_mean": round(float(np.mean(sim.live_seen)), 1) if sim.live_seen else 0.0,
            "live_max": int(max(sim.live_seen)) if sim.live_seen else 0, "load": round(load, 4),
            "programs_in_trace": len(tr.programs)}


def machine_reference_ms(repeat: int = 20) -> float:
    """The least wall time (ms) of a fixed piece of pure Python (dict lookups, float arithmetic,
    list appends), with the cyclic collector off, as `timeit` does. A rough indicator of how fast
    this interpreter runs on this machine, read beside decision times (with the Python version:
    the same code is not the same work on another CPython); the planner's numpy passes and its
    solve do not scale with it exactly."""
    keys = [("w", f"m{i % 7}", (i,)) for i in range(512)]
    table = {k: float(i) for i, k in enumerate(keys)}
    best = math.inf
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t = time.perf_counter()
            for _ in range(40):
                out = []
                acc = 0.0
                for k in keys:
                    v = table.get(k, 0.0)
                    acc += v * 0.5 + 1.0
                    out.append((k, acc))
            best = min(best, time.perf_counter() - t)
    finally:
        if collecting:
            gc.enable()
    return round(best * 1e3, 3)


def _percentiles(a: np.ndarray) -> dict:
    pct = (lambda q: round(float(np.percentile(a, q)), 4)) if a.size else (lambda q: None)
    return {"p50": pct(50), "p99": pct(99), "max": round(float(a.max()), 4) if a.size else None}


def bench_planner(cluster: Cluster, catalog: Catalog, programs: int, policy: str = "statebudget-lease",
                  preset: str = "swe-team", seed: int = 0, window_s: float = 300.0, fill_s: float | None = None,
                  tries: int = 3, start: str = "warm", repeat: int = 1) -> dict:
    """Whole-hook decision times of `policy` with about `programs` live programs (see the module)."""
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    ref = machine_reference_ms()
    rate, dur = nominal_rate_and_duration(catalog, preset, seed)
    fill = fill_s if fill_s is not None else 2.0 * dur
    load = programs / (rate * dur)
    attempts = []
    for _ in range(max(1, tries)):
        used = load
        res = replayed_decisions(cluster, catalog, policy, preset, seed, load, fill, window_s, start)
        attempts.append({"load": res["load"], "live_mean": res["live_mean"]})
        ratio = res["live_mean"] / programs
        if TOLERANCE[0] <= ratio <= TOLERANCE[1] or res["live_mean"] == 0:
            break
        load *= programs / res["live_mean"]
    runs = [res] + [replayed_decisions(cluster, catalog, policy, preset, seed, used, fill, window_s, start)
                    for _ in range(repeat - 1)]
    # Hook k is the same work in every run only if every run decided the same.
    differ = len({(r["hooks"], r["decisions_sha256"]) for r in runs}) > 1
    least = np.min([r["hook_ms"] for r in runs], axis=0) if res["hooks"] and not differ else np.zeros(0)
    # per hook: which is slow, and what a cheap hook that runs often does to the percentiles
    by_hook = least if least.size else res["hook_ms"]
    names = np.asarray(res["hook_names"])
    res = {k: v for k, v in res.items() if k not in ("hook_ms", "hook_names")}
    res["decision_ms_by_hook"] = {n: {"hooks": int((names == n).sum()), **_percentiles(by_hook[names == n])}
                                  for n in sorted(set(names.tolist()))} if by_hook.size else {}
    res["decision_ms_runs"] = [r["decision_ms"] for r in runs]
    res["decisions_differ"] = differ
    res["decision_ms_least"] = _percentiles(least)
    return {"programs": programs, "repeat": repeat, "policy": policy, "preset": preset, "seed": seed, "start": start,
            "fill_s": round(fill, 1), "window_s": window_s, "nominal_program_s": round(dur, 1), **res,
            "attempts": attempts, "cluster": cluster.name, "catalog": catalog.name,
            "machine_reference_ms": min(ref, machine_reference_ms()), "python": platform.python_version()}
