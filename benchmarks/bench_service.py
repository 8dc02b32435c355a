"""Sustained events/s and leases/s of the planner service, with client-side latency percentiles.

Starts `statebudget serve` (uvicorn, one process, a fresh SQLite ledger, the planning loop on) on
127.0.0.1, then drives it from this process over K keep-alive connections, closed loop, for a
fixed time per phase:

  events  each connection plays its own programs: program_started, then rounds of call_arrived,
          call_started, call_finished (the KV grows), tool_started, tool_finished; a program ends
          after 10 calls and the next starts
  leases  each connection submits a lease for its program (rotating models) and cancels it, so
          state stays bounded; leases/s counts submissions
  queue   with `--waiting N`: N programs with one call waiting each (a third of them per model),
          then GET /v1/queue?model=M (the waiting calls in the discipline's order now)

The client is a minimal HTTP/1.1 keep-alive writer on asyncio streams: httpx would cost more CPU
than the server on a 2-core machine and measure itself. Goal: >= 2,000 events/s at
p99 <= 20 ms on 2 cores.

    python benchmarks/bench_service.py --seconds 10 --connections 8 [--kv-rule adaptive] [--queue plas]
        [--waiting 1000] [--synchronous full|normal|both] [--rounds 2] [--src DIR] [--json OUT]

`--synchronous both` runs fresh servers with the ledger's `synchronous=FULL` (the default: a
commit survives a power loss) and `NORMAL` (a crash of the process only) alternately, and prints
the ratio of their rates: what FULL costs on this disk. `--src DIR` adds, each round, the server
of another checkout (with its own defaults) for a side-by-side comparison of versions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["planner", "coder", "reviewer"]
TOKEN = "bench-runtime-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    def __init__(self, port: int, token: str):
        self.port, self.token = port, token

    async def open(self):
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
        self.w.write(head + data)
        status_line = await self.r.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.r.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            if k.lower() == "content-length":
                length = int(v)
        return status, await self.r.readexactly(length)


async def events_worker(conn: Conn, wid: int, stop: float, lat: list, errors: list) -> None:
    n = 0
    while time.monotonic() < stop:
        prog = f"w{wid}-p{n}"
        n += 1
        seq = [{"type": "program_started", "program": prog}]
        tokens = 0
        for c in range(10):
            model = MODELS[(c + wid) % 3]
            tokens += 1500
            seq += [{"type": "call_arrived", "program": prog, "call": f"c{c}", "model": model, "context_tokens": tokens},
                    {"type": "call_started", "program": prog, "call": f"c{c}"},
                    {"type": "call_finished", "program": prog, "call": f"c{c}", "tokens": tokens + 300},
                    {"type": "tool_started", "program": prog, "tool": "shell", "call": f"t{c}"},
                    {"type": "tool_finished", "program": prog, "tool": "shell", "call": f"t{c}"}]
        seq.append({"type": "program_finished", "program": prog})
        for ev in seq:
            if time.monotonic() >= stop:
                return
            t0 = time.perf_counter()
            status, body = await conn.request("POST", "/v1/events", ev)
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(f"{status} {body[:120]!r}")


async def leases_worker(conn: Conn, wid: int, stop: float, lat: list, errors: list) -> None:
    prog = f"lw{wid}"
    await conn.request("POST", "/v1/events", {"type": "program_started", "program": prog})
    i = 0
    while time.monotonic() < stop:
        body = {"program": prog, "model": MODELS[i % 3], "deadline_s": 30.0, "confidence": 0.8}
        i += 1
        t0 = time.perf_counter()
        status, raw = await conn.request("POST", "/v1/leases", body)
        lat.append(time.perf_counter() - t0)
        if status != 200:
            errors.append(f"{status} {raw[:120]!r}")
            continue
        await conn.request("DELETE", f"/v1/leases/{json.loads(raw)['lease_id']}")


async def fill_queue(port: int, token: str, waiting: int) -> None:
    """`waiting` programs, each with one call that arrived and has not started."""
    conn = Conn(port, token)
    await conn.open()
    for i in range(waiting):
        prog = f"q{i}"
        for ev in ({"type": "program_started", "program": prog},
                   {"type": "call_arrived", "program": prog, "call": "c0", "model": MODELS[i % 3],
                    "context_tokens": 2000, "ttft_s": 30.0}):
            status, body = await conn.request("POST", "/v1/events", ev)
            if status != 200:
                raise SystemExit(f"filling the queue: {status} {body[:200]!r}")


async def queue_worker(conn: Conn, wid: int, stop: float, lat: list, errors: list) -> None:
    while time.monotonic() < stop:
        t0 = time.perf_counter()
        status, body = await conn.request("GET", f"/v1/queue?model={MODELS[wid % 3]}")
        lat.append(time.perf_counter() - t0)
        if status != 200:
            errors.append(f"{status} {body[:120]!r}")


async def phase(worker, port: int, token: str, connections: int, seconds: float) -> dict:
    conns = [Conn(port, token) for _ in range(connections)]
    for c in conns:
        await c.open()
    lat: list[float] = []
    errors: list[str] = []
    t0 = time.monotonic()
    stop = t0 + seconds
    await asyncio.gather(*(worker(c, i, stop, lat, errors) for i, c in enumerate(conns)))
    wall = time.monotonic() - t0
    a = np.asarray(lat) * 1e3
    return {"requests": len(lat), "per_s": round(len(lat) / wall, 1), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3),
            "errors": len(errors), "first_error": errors[0] if errors else None}


def run(args, synchronous: str, src: Path | None = None) -> dict:
    """One fresh server with `serve --synchronous SYNCHRONOUS` (of the checkout `src`, which
    then runs with its own default), its phases; the numbers."""
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    # clear tokens, which every version of the server reads (a current one hashes them in memory)
    (tmp / "tokens.json").write_text(json.dumps({"tokens": [
        {"token": TOKEN, "role": "runtime", "tenant": "bench"},
        {"token": "bench-admin-token-0123456789", "role": "admin"}]}))
    env = {**os.environ, "PYTHONPATH": str(src)} if src else {**os.environ}
    sync = [] if src else ["--synchronous", synchronous]
    port = args.port or free_port()
    server = None if args.port else subprocess.Popen([sys.executable, "-m", "statebudget.cli", "serve", "--db", str(tmp / "sb.db"),
                               "--cluster", "hetero16", "--catalog", "toy", "--port", str(port),
                               "--tokens", str(tmp / "tokens.json"), "--kv-rule", args.kv_rule, "--queue", args.queue,
                               *sync, "--log-level", "warning"],
                              cwd=src or ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(0.1)
        out = {"cores": os.cpu_count(), "connections": args.connections, "seconds": args.seconds, "kv_rule": args.kv_rule,
               "queue": args.queue, "synchronous": f"{src}'s default" if src else synchronous,
               "events": asyncio.run(phase(events_worker, port, TOKEN, args.connections, args.seconds)),
               "leases": asyncio.run(phase(leases_worker, port, TOKEN, args.connections, args.seconds))}
        if args.waiting:
            asyncio.run(fill_queue(port, TOKEN, args.waiting))
            out["waiting"] = args.waiting
            out["queue_reads"] = asyncio.run(phase(queue_worker, port, TOKEN, args.connections, args.seconds))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kv-rule", default="preserve", help="serve --kv-rule: the tool-wait KV rule the events phase exercises")
    ap.add_argument("--queue", default="fcfs", help="serve --queue: the discipline whose priority call_arrived answers")
    ap.add_argument("--waiting", type=int, default=0,
                    help="then N programs with a call waiting each, and GET /v1/queue?model=M in a closed loop")
    ap.add_argument("--synchronous", default="full", choices=["full", "normal", "both"],
                    help="the ledger's SQLite sync; both: full and normal alternately, --rounds times each")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the servers (full and/or normal, --src)")
    ap.add_argument("--src", type=Path, help="also run the server of this checkout (e.g. `git archive <commit> | "
                                             "tar -x -C DIR`) after each round, with its own default sync")
    ap.add_argument("--port", type=int, help=f"drive a server already running there (token: {TOKEN})")
    args = ap.parse_args()
    modes = ["full", "normal"] if args.synchronous == "both" else [args.synchronous]
    runs = []
    for _ in range(args.rounds):
        runs += [run(args, m) for m in modes] + ([run(args, "", args.src.resolve())] if args.src else [])
    for out in runs:
        report(out, args.waiting)
    by = {}
    for r in runs:
        by.setdefault(r["synchronous"], []).append(r)
    base = runs[0]["synchronous"]
    for what in ("events", "leases"):
        rate = {k: np.mean([r[what]["per_s"] for r in v]) for k, v in by.items()}
        print(f"{what}/s relative to {base}: " + ", ".join(f"{k} {rate[k] / rate[base]:.3f}" for k in by))
    if args.json:
        args.json.write_text(json.dumps(runs if len(runs) > 1 else runs[0], indent=1) + "\n")


def report(out: dict, waiting: int) -> None:
    print(f"[synchronous={out['synchronous']}]")
    print(f"events: {out['events']['per_s']:.0f}/s  p50 {out['events']['p50_ms']:.2f} ms  p99 {out['events']['p99_ms']:.2f} ms"
          f"  ({out['events']['requests']} requests, {out['events']['errors']} errors)")
    print(f"leases: {out['leases']['per_s']:.0f}/s  p50 {out['leases']['p50_ms']:.2f} ms  p99 {out['leases']['p99_ms']:.2f} ms"
          f"  ({out['leases']['requests']} requests, {out['leases']['errors']} errors)")
    if "queue_reads" in out:
        q = out["queue_reads"]
        print(f"GET /v1/queue, {waiting} calls waiting: {q['per_s']:.0f}/s  p50 {q['p50_ms']:.2f} ms"
              f"  p99 {q['p99_ms']:.2f} ms  ({q['requests']} requests, {q['errors']} errors)")


if __name__ == "__main__":
    main()
