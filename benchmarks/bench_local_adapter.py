"""The local adapter's data plane against a plain torch copy of the same bytes, side by side.

    .venv/bin/python benchmarks/bench_local_adapter.py [--size-mb 256] [--repeat 5] [--json out/bench_local_adapter.json]

Each repeat moves one `--size-mb` object through the data plane's transactions and does the same
data movement with plain torch right next to it (the order alternates between repeats):

    path           data plane op (allocate + copy + checksum)      plain torch
    nvme -> host   promote nvme:n0 -> host:n0                      safetensors.torch.load_file(f)["data"].clone()
    host -> gpu    promote host:n0 -> gpu:0 (the arena w/o CUDA)    host.clone()  (CUDA: .to("cuda:0") + sync)
    gpu -> host    demote gpu:0 -> host:n0                          gpu.clone()   (CUDA: pinned copy_ + sync)

Both sides write into freshly allocated memory (as a new copy must), so both pay the page faults.
Throughput is bytes / seconds. The table shows the best run of each side (the least disturbed on a
shared machine) and the medians, each with the ratio data plane / plain torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from statebudget.engine_adapters.local import LocalDataPlane
from statebudget.models.plan import Op

MiB = 1 << 20
OBJ = ["w", "bench"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=float, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    n = int(args.size_mb * MiB)
    cuda = torch.cuda.is_available()
    seq = iter(range(1 << 30))

    with tempfile.TemporaryDirectory(prefix="bench-local-") as d:
        plane = LocalDataPlane(d, arena_bytes=4 * n)

        def move(kind, src, dst):
            op = Op(op_id=f"b{next(seq)}", kind=kind, object=OBJ, src=src, dst=dst, bytes=n)
            r = plane.execute(op)
            assert r.status == "done", r.error
            plane.commit(op)
            return r

        path = plane.store(OBJ, n).path                      # the model store's file, written once
        move("promote", "nvme:n0", "host:n0")                # warm-up of every path
        move("promote", "host:n0", "gpu:0")
        move("drop", "host:n0", "none")
        move("demote", "gpu:0", "host:n0")
        move("drop", "host:n0", "none")

        def plain_nvme_host():
            return load_file(path)["data"].clone()

        def plain_host_gpu(host):
            if cuda:
                out = host.to("cuda:0", non_blocking=True)
                torch.cuda.synchronize()
                return out
            return host.clone()

        def plain_gpu_host(gpu):
            if cuda:
                out = torch.empty(n, dtype=torch.uint8, pin_memory=True).copy_(gpu, non_blocking=True)
                torch.cuda.synchronize()
                return out
            return gpu.clone()

        runs = {p: {"plane": [], "torch": []} for p in ("nvme->host", "host->gpu", "gpu->host")}

        def timed(fn, *a):
            t0 = time.perf_counter()
            out = fn(*a)
            return n / (time.perf_counter() - t0), out

        for i in range(args.repeat):
            plane_first = i % 2 == 0
            # nvme -> host
            for side in (("plane", "torch") if plane_first else ("torch", "plane")):
                if side == "plane":
                    r = move("promote", "nvme:n0", "host:n0")
                    runs["nvme->host"]["plane"].append(r.bytes / r.seconds)
                else:
                    bps, out = timed(plain_nvme_host)
                    runs["nvme->host"]["torch"].append(bps)
                    del out
            host = plane.copy_of(OBJ, "host:n0").shards[0]
            # host -> gpu
            for side in (("plane", "torch") if plane_first else ("torch", "plane")):
                if side == "plane":
                    r = move("promote", "host:n0", "gpu:0")
                    runs["host->gpu"]["plane"].append(r.bytes / r.seconds)
                else:
                    bps, out = timed(plain_host_gpu, host)
                    runs["host->gpu"]["torch"].append(bps)
                    del out
            del host
            move("drop", "host:n0", "none")
            gpu = plane.copy_of(OBJ, "gpu:0").shards[0]
            # gpu -> host
            for side in (("plane", "torch") if plane_first else ("torch", "plane")):
                if side == "plane":
                    r = move("demote", "gpu:0", "host:n0")
                    runs["gpu->host"]["plane"].append(r.bytes / r.seconds)
                else:
                    bps, out = timed(plain_gpu_host, gpu)
                    runs["gpu->host"]["torch"].append(bps)
                    del out
            del gpu
            move("drop", "host:n0", "none")                  # next repeat starts from the store again

    rows = []
    title = f"{args.repeat} x {args.size_mb:g} MiB, device {'cuda' if cuda else 'arena (RAM)'}, " \
            f"{torch.get_num_threads()} torch threads"
    print(title)
    print(f"{'path':<12} {'data plane GB/s':>16} {'plain torch GB/s':>17} {'ratio':>7} "
          f"{'median plane':>13} {'median torch':>13} {'ratio':>7}")
    for p, r in runs.items():
        a, b = max(r["plane"]), max(r["torch"])
        am, bm = statistics.median(r["plane"]), statistics.median(r["torch"])
        rows.append({"path": p, "plane_Bps": a, "torch_Bps": b, "ratio": a / b,
                     "plane_median_Bps": am, "torch_median_Bps": bm, "median_ratio": am / bm,
                     "plane_runs_Bps": r["plane"], "torch_runs_Bps": r["torch"]})
        print(f"{p:<12} {a / 1e9:>16.2f} {b / 1e9:>17.2f} {a / b:>7.0%} {am / 1e9:>13.2f} {bm / 1e9:>13.2f} {am / bm:>7.0%}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"title": title, "size_mb": args.size_mb, "repeat": args.repeat,
                                         "device": "cuda" if cuda else "arena", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
