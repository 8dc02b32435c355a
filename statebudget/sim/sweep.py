"""A grid of replays — clusters x traces x seeds x policies — run on a local process pool or on a
Ray cluster, collected into one table. Each job regenerates its trace from (preset, seed, hours),
so a job is a few strings and the result is the same wherever it runs. A job also names its start
(`cold` | `warm`) and warm-up seconds (DESIGN.md §4), passed to `SimConfig`.

Every figure a row carries is in `METRICS`; `COLUMNS` are those the `sweep` table prints. The
decision times (`decision_*_ms`) are wall time, so they differ from run to run and machine to
machine; every other figure is a pure function of the job."""

from __future__ import annotations

import ast
import itertools
import math
from concurrent.futures import ProcessPoolExecutor, as_completed

from ..core.programs import parse_spec
from ..models.load import load_catalog, load_cluster, load_trace
from ..policies import REGISTRY, make_policy
from ..traces.generators import generate
from ..planner.config import check_fields
from .config import SimConfig
from .runner import replay

COLUMNS = ("handoff_p95_s", "handoff_p99_s", "ttft_p95_s", "slo_at5", "program_p95_s", "stall_total_s",
           "warm_tax", "wasted_tb", "decision_p99_ms")
# Each column's header in the `sweep` table, named as `replay` names the same figure.
LABELS = {"handoff_p95_s": "handoff stall p95 s", "handoff_p99_s": "handoff stall p99 s", "ttft_p95_s": "TTFT p95 s",
          "slo_at5": "SLO@5", "program_p95_s": "program p95 s", "stall_total_s": "total stall s",
          "warm_tax": "warm tax", "wasted_tb": "wasted TB", "decision_p99_ms": "decision p99 ms"}
METRICS = ("handoff_p50_s", "handoff_p95_s", "handoff_p99_s", "stall_mean_s", "stall_total_s", "ttft_p95_s",
           "ttft_p99_s", "ttft_slowdown_p95", "slo_at2", "slo_at5", "slo_at10", "program_p95_s", "lease_late_p99_s",
           "nonlease_ttft_p99_s", "warm_tax", "wasted_tb", "moved_tb", "slo_violations", "decision_p50_ms",
           "decision_p99_ms", "calls_completed", "unplaceable_calls", "handoff_hbm_wait_share")
WALL_CLOCK = ("decision_p50_ms", "decision_p99_ms")  # the only figures that are not a function of the job


_WORDS = {"true": True, "false": False, "none": None}


def parse_fields(text: str) -> dict:
    """"a=1, b=0.5" -> {"a": 1, "b": 0.5}: FIELD=VALUE pairs, each value a Python literal (true,
    false and none in any case too). Anything else is a ValueError that names the bad part."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"expected FIELD=VALUE, ... ({e.msg})") from None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise ValueError("expected FIELD=VALUE, ...")  # brackets that close the wrapper early: "a=1)(b=2"
    for arg in call.args:
        raise ValueError(f"{ast.unparse(arg)!r} is not FIELD=VALUE")
    out = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ValueError(f"'**{ast.unparse(kw.value)}' is not FIELD=VALUE")
        if kw.arg in out:
            raise ValueError(f"{kw.arg} given twice")
        try:
            out[kw.arg] = ast.literal_eval(kw.value)
        except (TypeError, ValueError):  # TypeError: an unhashable key, {[1]: 2}
            word = kw.value.id.lower() if isinstance(kw.value, ast.Name) else None
            if word not in _WORDS:
                raise ValueError(f"{kw.arg}={ast.unparse(kw.value)}: not a Python literal (a number, True/False, "
                                 f"None, a quoted string, a tuple of them)") from None
            out[kw.arg] = _WORDS[word]
    return out


def jobs(clusters, traces, seeds, policies, catalog: str, hours: float, start: str = "warm",
         warmup_s: float = 0.0, load: float = 1.0, planner: dict | None = None,
         history_hours: float | None = None, sim: dict | None = None) -> list[dict]:
    """`load` multiplies the presets' program arrival rates (`generate`); `planner`: `PlannerConfig`
    fields our planners take over their defaults (`policy_maker`; baselines ignore them);
    `history_hours`: a restart, each policy first takes up what it learnt over that many hours of
    the day before (`learnt_before`); `sim`: other `SimConfig` fields, for every policy."""
    clash = sorted(set(sim or {}) & {"seed", "start", "warmup_s"})
    if clash:  # each job sets these itself
        raise ValueError(f"sim: {', '.join(clash)} is set per job (its seed, start=, warmup_s=), not in sim")
    try:  # bad values fail here, not in a worker
        SimConfig(start=start, warmup_s=warmup_s, **(sim or {}))
    except TypeError as e:  # a field SimConfig does not have
        raise ValueError(f"sim: {e}") from None
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load}")
    extra = {}
    if planner is not None:
        try:
            check_fields(planner)
        except ValueError as e:
            raise ValueError(f"planner: {e}") from None
        extra["planner"] = planner
    if history_hours is not None:
        if not 0 < history_hours < math.inf:
            raise ValueError(f"history hours must be > 0 and finite, got {history_hours}")
        extra["history_hours"] = float(history_hours)
    if sim:
        extra["sim"] = dict(sim)
    return [{"cluster": c, "trace": t, "seed": s, "policy": p, "catalog": catalog, "hours": hours,
             "start": start, "warmup_s": float(warmup_s), "load": float(load), **extra}
            for c, t, s, p in itertools.product(clusters, traces, seeds, policies)]


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 9)


def figures(r) -> dict:
    """The row figures of one `PolicyReport` (DESIGN.md §4 and §8). The §8 keys added later
    (`stall_total_s`, `ttft_slowdown`, `slo_attainment`) are read when present: the total stall
    falls back to mean x count, the others to None."""
    total = getattr(r, "stall_total_s", None)
    if total is None:
        total = r.stall_s.mean * r.stall_s.n
    att = getattr(r, "slo_attainment", None) or {}
    slow = getattr(r, "ttft_slowdown", None)
    return {
        "handoff_p50_s": r.handoff_stall_s.p50, "handoff_p95_s": r.handoff_stall_s.p95,
        "handoff_p99_s": r.handoff_stall_s.p99, "stall_mean_s": r.stall_s.mean, "stall_total_s": _num(total),
        "ttft_p95_s": r.ttft_s.p95, "ttft_p99_s": r.ttft_s.p99,
        "ttft_slowdown_p95": _num(slow.p95) if slow is not None else None,
        "slo_at2": _num(att.get("2")), "slo_at5": _num(att.get("5")), "slo_at10": _num(att.get("10")),
        "program_p95_s": r.program_latency_s.p95, "lease_late_p99_s": r.lease_lateness_s.p99,
        "nonlease_ttft_p99_s": r.nonlease_ttft_s.p99, "warm_tax": r.warm_tax,
        "wasted_tb": round(r.wasted_bytes / 1e12, 9), "moved_tb": round(r.bytes_moved / 1e12, 9),
        "slo_violations": r.slo_violations,
        "decision_p50_ms": round(r.decision_ms.p50, 4), "decision_p99_ms": round(r.decision_ms.p99, 4),
        "calls_completed": r.calls_completed, "unplaceable_calls": r.unplaceable_calls,
        "page_refusals": r.page_refusals, "preemptions": r.preemptions,
        "handoff_hbm_wait_share": _hbm_wait_share(handoff_split(getattr(r, "stall_by_model", None) or {})),
    }


def handoff_split(by_model: dict) -> dict[str, list[float]]:
    """Per model with handoff stall (`ModelStall`): [seconds waiting for HBM room, seconds loading]."""
    return {name: [m.handoff_hbm_wait_total_s, round(m.handoff_stall_total_s - m.handoff_hbm_wait_total_s, 9)]
            for name, m in by_model.items() if m.handoff_stall_total_s > 0}


def slo_split(by_model: dict) -> dict[str, list[float]]:
    """Per model with an SLO attainment (`ModelStall`): [its calls, its SLO attainment at 5];
    weighted by calls, the row's `slo_at5`."""
    return {name: [m.calls, m.slo_attainment["5"]] for name, m in by_model.items() if m.slo_attainment}


def _hbm_wait_share(split: dict[str, list[float]]) -> float | None:
    """Of the handoff stall, the share spent waiting for HBM room; None when there is none."""
    total = sum(w + ld for w, ld in split.values())
    return _num(sum(w for w, _ in split.values()) / total) if total > 0 else None


def run_job(job: dict) -> dict:
    """One replay; the job's seed makes its trace (or `trace_file` names one, an imported real
    trace) and seeds the simulator; `sim`, when given, sets other `SimConfig` fields."""
    cl, cat = load_cluster(job["cluster"]), load_catalog(job["catalog"])
    tr = load_trace(job["trace_file"]) if job.get("trace_file") else \
        generate(job["trace"], job["seed"], job["hours"], load=job.get("load", 1.0))
    config = SimConfig(seed=job["seed"], start=job.get("start", "warm"), warmup_s=job.get("warmup_s", 0.0),
                       **(job.get("sim") or {}))
    make = policy_maker(job)
    if job.get("history_hours"):  # a restart: the policy starts from what it learnt the day before
        state = learnt_before(job, cl, cat)
        make = _taking_up(make, state)
    rep = replay(cl, cat, tr, [job["policy"]], config, make=make)
    block = rep.report.policies[job["policy"]]
    row = dict(job, **figures(block))
    row["handoff_by_model"] = handoff_split(block.stall_by_model)  # where the handoff stall went
    row["slo_at5_by_model"] = slo_split(block.stall_by_model)      # which model pays for SLO@5
    row["groups_by_model"] = {m: s.groups for m, s in block.stall_by_model.items()}  # where its calls ran
    row["handoff_tail"] = block.handoff_tail.model_dump()  # what sets the handoff-stall P95
    if job.get("kv_demand"):  # H1 of `evidence`: the replay's KV demand per model (hypotheses.py)
        from .hypotheses import kv_demand
        row["kv_demand"] = kv_demand(rep.results[job["policy"]], cat)
    return row


HISTORY_SEED = 1000  # "yesterday" of a job's trace: the same preset, seed + this (another day's draw)


def learnt_before(job: dict, cluster=None, catalog=None) -> dict | None:
    """What the job's policy learnt (`Policy.learnt`) over `history_hours` of the day before: the
    same preset and load at seed + `HISTORY_SEED`, from a warm start. Only the policy's own
    estimates carry over (switch counts, rates), never a trace or an outcome of the day replayed."""
    if job.get("trace_file"):
        raise ValueError(f"a restart replays the day before from a preset; {job['trace_file']} is a file")
    cl, cat = cluster or load_cluster(job["cluster"]), catalog or load_catalog(job["catalog"])
    seed = job["seed"] + HISTORY_SEED
    tr = generate(job["trace"], seed, job["history_hours"], load=job.get("load", 1.0))
    policy = policy_maker(job)(parse_spec(job["policy"], REGISTRY)[0])
    rep = replay(cl, cat, tr, [job["policy"]], SimConfig(seed=seed, start="warm", **(job.get("sim") or {})),
                 make=lambda _: policy)
    return policy.learnt(rep.results[job["policy"]].sim_end)


def _taking_up(make, state):
    def make_with(base):
        policy = make(base)
        if state is not None:
            policy.take_up(state, 0.0)
        return policy
    return make_with


def policy_maker(job: dict):
    """The policy factory of a job: the registry's; statebudget-track re-planning every `replan_s`
    seconds when the job names one (`evidence`'s "how often to re-plan"); our planners with the
    `PlannerConfig` fields of `planner` overridden when the job has them (baselines ignore them)."""
    from ..planner.target import TrackConfig
    from ..policies.ours import StateBudget, StateBudgetTrack

    name, kw = parse_spec(job["policy"], REGISTRY)[0], job.get("planner") or {}
    if job.get("replan_s") is not None and name != StateBudgetTrack.name:
        raise ValueError(f"replan_s is a knob of {StateBudgetTrack.name}, not of {job['policy']!r}")
    cls = REGISTRY[name]
    if (job.get("replan_s") is None and not kw) or not issubclass(cls, StateBudget):
        return make_policy
    config = cls.base_config(**kw) if kw else None
    if cls is StateBudgetTrack:
        track = TrackConfig(replan_s=float(job["replan_s"])) if job.get("replan_s") is not None else None
        return lambda base: StateBudgetTrack(config, track=track)
    return lambda base: cls(config)


def _key(row: dict):
    return (row["cluster"], row["trace"], row.get("start", ""), row.get("load", 1.0), row["seed"], row["policy"],
            row.get("replan_s") or 0.0, sorted((row.get("sim") or {}).items()))


def run_local(todo: list[dict], workers: int | None = None, progress=None) -> list[dict]:
    """Each job in its own task of a process pool; `progress(done, total)` as each one ends."""
    rows = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        try:
            for fut in as_completed([pool.submit(run_job, j) for j in todo]):
                rows.append(fut.result())
                if progress:
                    progress(len(rows), len(todo))
        except BaseException:  # a failed job (or Ctrl-C) stops the grid, not after every other job
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return sorted(rows, key=_key)


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast with a clear message when nothing listens at HOST:PORT (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray {address!r}: expected auto or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ValueError(f"--ray {address}: cannot reach a Ray head there ({e.strerror or e}); start one with "
                         f"`ray start --head --port {port}` or drop --ray to use local processes") from None


def run_ray(todo: list[dict], address: str, progress=None) -> list[dict]:
    import os

    if address.split(":")[0] in ("127.0.0.1", "localhost"):
        # Ray turns a loopback address into the host's network IP unless told it is a one-node
        # cluster; keep a local cluster on the loopback interface (must precede `import ray`).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if address != "auto":
        _reachable(address)
    import ray

    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    except ConnectionError as e:
        raise ValueError(f"--ray {address}: no Ray cluster there ({str(e).splitlines()[0]}); start one with "
                         f"`ray start --head` or drop --ray to use local processes") from None
    try:
        remote = ray.remote(run_job)
        pending = [remote.remote(j) for j in todo]
        rows = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rows += ray.get(done)
            if progress:
                progress(len(rows), len(todo))
        return sorted(rows, key=_key)
    finally:
        ray.shutdown()
