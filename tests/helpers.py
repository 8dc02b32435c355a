"""Small hand-made clusters, catalogs and traces for tests."""

from __future__ import annotations

import time
from statebudget.models import Catalog, Cluster, Program, Trace
from statebudget.models.trace import TraceHeader

GB = 1e9


class Clock:
    """A fake clock for the live planner: set `t` to move time."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self):
        return self.t


def wait_until(cond, timeout_s: float, what: str):
    """Poll `cond` (work of another thread or process) until it is truthy; fail the test with `what` after
    `timeout_s`. Returns the truthy value."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.05)


def cluster(gpus=1, hbm_gb=40.0, h2d=25.0, nvme_read=7.0, root=50.0, wake=0.5, cold=10.0, nodes=1, tflops=312.0,
            reserve=0.0, host_gb=256.0, overhead=0.0) -> Cluster:
    return Cluster.model_validate({
        "name": "test",
        "hbm_reserve_frac": reserve,
        "gpu_kinds": {"G": {"hbm_gb": hbm_gb, "hbm_gbps": 1555, "h2d_gbps": h2d, "d2h_gbps": h2d, "tflops": tflops,
                            "wake_s": wake, "cold_start_s": cold, "engine_overhead_gb": overhead}},
        "nodes": [{"name": f"n{i}", "host_dram_gb": host_gb, "nvme_gb": 4000, "nvme_read_gbps": nvme_read,
                   "nvme_write_gbps": 5, "root_gbps": root, "gpus": {"G": gpus}} for i in range(nodes)],
    })


def catalog(*models) -> Catalog:
    return Catalog.model_validate({"name": "test", "models": [
        {"name": m[0], "version": "v1", "weights_gb": m[1], "kv_bytes_per_token": m[2] if len(m) > 2 else 1000,
         "active_params_b": 1.0, "tp": m[3] if len(m) > 3 else 1} for m in models]})


def moe_catalog(dense=("d",)) -> Catalog:
    """Dense 2 GB models (`dense`, by default one, `d`) and a MoE model `e`: a 2 GB dense part and
    16 expert pages of 1 GB."""
    spec = {"version": "v", "weights_gb": 2.0, "kv_bytes_per_token": 1000, "active_params_b": 1.0, "tp": 1}
    return Catalog.model_validate({"name": "moe", "models": [
        *({"name": n, **spec} for n in dense),
        {"name": "e", **spec,
         "moe": {"experts": 16, "active": 2, "layers": 1, "expert_gb": 1.0, "pages": 16, "zipf_s": 1.0}},
    ]})


def resident(sim, key, group, gb):
    """A ready copy of `key` (e.g. ("w", model)) of `gb` per GPU in the HBM of `group`, as if a
    call had loaded it."""
    from statebudget.core.books import GpuCopy

    sim.tiers.add_gpu_copy(GpuCopy(key, group, gb * 1e9, True, 0.0, 0.0))
    sim.tiers.alloc_gpu(group, gb * 1e9)


def call(nid, model, after=(), ctx=100, out=10, max_tokens=None):
    """A call node. It asks for `max_tokens`, by default exactly what it writes (at least 1): the
    hand-made tests' calls reserve just the KV they leave, as before calls carried `max_tokens`."""
    return {"id": nid, "kind": "call", "model": model, "context_tokens": ctx, "output_tokens": out,
            "max_tokens": max(out, 1) if max_tokens is None else max_tokens, "after": list(after)}


def tool(nid, after, duration=1.0, name="test"):
    return {"id": nid, "kind": "tool", "tool": name, "duration": duration, "after": list(after)}


def trace(*programs) -> Trace:
    return Trace(header=TraceHeader(), programs=[Program.model_validate(p) for p in programs])


def program(pid, nodes, start=0.0, hints=(), cancel=(), tenant="t0"):
    return {"program": pid, "tenant": tenant, "start": start, "nodes": nodes, "hints": list(hints), "cancel": list(cancel)}


TOY_MODELS = {"planner": "planner", "coder": "coder", "fast-coder": "coder", "reviewer": "reviewer",
              "reasoner": "planner", "vlm": "reviewer", "summarizer": "reviewer"}


def toy_trace_jsonl(seed: int = 1, hours: float = 0.05) -> str:
    """A swe-team trace whose calls use the `toy` catalog's three models, as JSONL text."""
    import json

    from statebudget.traces.generators import generate

    t = generate("swe-team", seed, hours)
    lines = [json.dumps(t.header.model_dump(exclude_none=True))]
    for p in t.programs:
        d = p.model_dump(by_alias=True, exclude_none=True)
        for n in d["nodes"]:
            if n.get("model"):
                n["model"] = TOY_MODELS[n["model"]]
        for h in d.get("hints", []):
            h["model"] = TOY_MODELS.get(h["model"], h["model"])
        lines.append(json.dumps(d))
    return "\n".join(lines) + "\n"


def report_op(p, op, status="done", **kw):
    """An adapter's report of `op` to the live planner `p`: done (by default) with the op's version
    and epoch, as a correct adapter sends it."""
    return p.report(p.ops[op.op_id].node if op.op_id in p.ops else "n0", op.op_id,
                    {"status": status, "version": op.version, "epoch": op.epoch, "checksum": "c", **kw})


def make_live_planner(clock=None, **kw):
    """A `LivePlanner` on the toy2 cluster and toy catalog with an in-memory ledger and a fake
    clock (a `Clock` at t = 1000 s unless given: set `.t` to move time), reachable as `.clock`."""
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.live import LivePlanner

    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock or Clock(1000.0), **kw)


def real_data_dir():
    """The real workload data (`shared/data/real`): next to this checkout, else the workplace's
    copy (a clean clone elsewhere, as CI makes); tests that need it skip when neither exists."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
    return here if here.is_dir() else Path("/work/shared/data/real")


def real_data_missing() -> str | None:
    """None where `real-sessions` finds its real data (`traces/real_sessions.py:rounds_path`), else
    the error that says where it was looked for."""
    from statebudget.models.errors import InputError
    from statebudget.traces.real_sessions import rounds_path

    try:
        rounds_path()
    except InputError as e:
        return str(e)
    return None


def presets_here(exclude=()) -> list:
    """Every trace preset but `exclude`, for `parametrize`; `real-sessions` marked skip where its real
    data is not found (a checkout without shared/ beside it)."""
    import pytest

    from statebudget.traces.generators import PRESETS

    missing = real_data_missing()
    return [pytest.param(p, marks=pytest.mark.skip(reason=missing)) if p == "real-sessions" and missing else p
            for p in PRESETS if p not in exclude]


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toy_service(tmp_path, entries):
    """The planner service in process (toy2 cluster, toy catalog, a ledger under `tmp_path`, no
    planning loop) with the tokens `entries` (`TokenEntry`s): a context manager yielding
    (TestClient, LivePlanner)."""
    from contextlib import contextmanager

    from fastapi.testclient import TestClient

    from statebudget.api.app import create_app
    from statebudget.api.auth import Auth
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.ledger import Store
    from statebudget.service.live import LivePlanner

    @contextmanager
    def run():
        planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))
        with TestClient(create_app(planner, Auth(list(entries)), planning_loop=False)) as c:
            yield c, planner
    return run()
