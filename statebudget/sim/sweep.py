"""A grid of replays — clusters x traces x seeds x policies — run on a local process pool or on a
Ray cluster, collected into one table. Each job regenerates its trace from (preset, seed, hours),
so a job is a few strings and the result is the same wherever it runs."""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor

from ..models.load import load_catalog, load_cluster
from ..traces.generators import generate
from .config import SimConfig
from .runner import replay

COLUMNS = ("handoff_p95_s", "handoff_p99_s", "stall_mean_s", "ttft_p95_s", "lease_late_p99_s", "warm_tax",
           "wasted_tb", "moved_tb", "slo_violations")


def jobs(clusters, traces, seeds, policies, catalog: str, hours: float) -> list[dict]:
    return [{"cluster": c, "trace": t, "seed": s, "policy": p, "catalog": catalog, "hours": hours}
            for c, t, s, p in itertools.product(clusters, traces, seeds, policies)]


def run_job(job: dict) -> dict:
    """One replay; the job's seed makes its trace and seeds the simulator."""
    cl, cat = load_cluster(job["cluster"]), load_catalog(job["catalog"])
    tr = generate(job["trace"], job["seed"], job["hours"])
    r = replay(cl, cat, tr, [job["policy"]], SimConfig(seed=job["seed"])).report.policies[job["policy"]]
    return dict(job, handoff_p95_s=r.handoff_stall_s.p95, handoff_p99_s=r.handoff_stall_s.p99,
                stall_mean_s=r.stall_s.mean, ttft_p95_s=r.ttft_s.p95, lease_late_p99_s=r.lease_lateness_s.p99,
                warm_tax=r.warm_tax, wasted_tb=round(r.wasted_bytes / 1e12, 9), moved_tb=round(r.bytes_moved / 1e12, 9),
                slo_violations=r.slo_violations)


def _key(row: dict):
    return (row["cluster"], row["trace"], row["seed"], row["policy"])


def run_local(todo: list[dict], workers: int | None = None, progress=None) -> list[dict]:
    rows = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for row in pool.map(run_job, todo):
            rows.append(row)
            if progress:
                progress(len(rows), len(todo))
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
