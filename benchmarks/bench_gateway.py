"""What the gateway adds to a request, and how many requests/s it passes, against calling the
engine directly.

Starts, each as its own process on 127.0.0.1: the planner (`statebudget serve`, one GPU, the toy
catalog), a fake OpenAI engine of `coder` (awake, tokens as fast as it can write them) and the
gateway in front of it (`statebudget gateway --no-adapter`: the engine found awake at start is
reported to the planner, so no adapter runs). Then, from this process:

  latency     one request at a time, alternating direct and through the gateway (so both see the
              same noise): a streamed chat completion of `--tokens` tokens, timed to its last byte;
              added = gateway - direct, p50 and p99 of each
  throughput  `--connections` keep-alive connections, closed loop, `--seconds` each way: requests/s,
              and the CPU each server (planner, engine, gateway) spends a request through the
              gateway (from /proc, where there is one)

  handoff     (`--handoff N`) a second stack where two of the three toy models fit the GPU, their
              engines asleep until woken (`--wake-s`), the gateway running the node's vLLM adapter:
              N programs planner -> coder -> reviewer with `--tool-s` waits between calls, every
              other one with X-Next-Model hints; the client's time to first token of each handoff

Goals (issue 23): p50 <= 2 ms added, >= 1,000 requests/s on 2 cores. Each gateway request is one
program (no X-Program-Id): program_started, call_arrived and the start in one planner request on
the request's path, call_finished and program_finished in a batch after it.

    .venv/bin/python benchmarks/bench_gateway.py [--requests 400] [--seconds 10] [--connections 16]
        [--program-id] [--json out/bench_gateway.json]
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
BIN = ROOT / ".venv" / "bin"
RUNTIME, ADAPTER, ADMIN = "bench-gw-runtime-0123456789", "bench-gw-adapter-0123456789", "bench-gw-admin-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Conn:
    """A minimal HTTP/1.1 keep-alive client that reads chunked (streamed) answers: httpx would
    cost more CPU than the servers on 2 cores and measure itself."""

    def __init__(self, port: int):
        self.port = port

    async def open(self):
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.w.write((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
                      f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
        status = int((await self.r.readline()).split()[1])
        length, chunked = 0, False
        while (line := await self.r.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            if k.lower() == "content-length":
                length = int(v)
            elif k.lower() == "transfer-encoding" and "chunked" in v:
                chunked = True
        if not chunked:
            return status, await self.r.readexactly(length)
        out = bytearray()
        while True:
            size = int((await self.r.readline()).split(b";")[0], 16)
            if size == 0:
                await self.r.readline()
                return status, bytes(out)
            out += await self.r.readexactly(size)
            await self.r.readexactly(2)


def start_stack(tmp: Path, handoff_wake_s: float | None = None) -> tuple[list[subprocess.Popen], int, int]:
    """Planner, engine(s) and gateway. `handoff_wake_s`: the handoff stack (three engines asleep,
    a GPU for two of them, the adapter in the gateway) instead of one awake engine."""
    from statebudget.api.auth import digest

    (tmp / "tokens.json").write_text(json.dumps({"tokens": [
        {"sha256": digest(RUNTIME), "role": "runtime", "tenant": "bench"},
        {"sha256": digest(ADAPTER), "role": "adapter", "node": "n0"},
        {"sha256": digest(ADMIN), "role": "admin"}]}))  # for a look at /v1/residency when a run goes wrong
    (tmp / "runtime.token").write_text(RUNTIME + "\n")
    (tmp / "adapter.token").write_text(ADAPTER + "\n")
    handoff = handoff_wake_s is not None
    (tmp / "cluster.json").write_text(json.dumps({
        "name": "one", "hbm_reserve_frac": 0.0, "gpu_kinds": {"G": {"hbm_gb": 0.3 if handoff else 1.0, "hbm_gbps": 1000, "h2d_gbps": 10,
                                           "d2h_gbps": 10, "tflops": 10, "wake_s": handoff_wake_s or 0.1,
                                           "cold_start_s": 1.0}},
        "nodes": [{"name": "n0", "host_dram_gb": 4, "nvme_gb": 100, "nvme_read_gbps": 2, "nvme_write_gbps": 1,
                   "root_gbps": 16, "gpus": {"G": 1}}]}))
    pp, gp = free_port(), free_port()
    models = ["planner", "coder", "reviewer"] if handoff else ["coder"]
    ports = {m: free_port() for m in models}
    ep = ports["coder"]
    (tmp / "gw.yaml").write_text(json.dumps({"engines": [
        {"model": m, "url": f"http://127.0.0.1:{ports[m]}", "node": "n0", "gpus": [0], "max_inflight": 256}
        for m in models], "queue_limit": 1024}))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = {n: open(tmp / f"{n}.log", "w") for n in ("planner", "gateway", *models)}
    procs = [subprocess.Popen([str(BIN / "statebudget"), "serve", "--db", str(tmp / "sb.db"), "--cluster",
                               str(tmp / "cluster.json"), "--catalog", "toy", "--tokens", str(tmp / "tokens.json"),
                               "--port", str(pp), "--log-level", "warning", "--tick-s", "0.5"],
                              stdout=logs["planner"], stderr=subprocess.STDOUT, env=env)]
    for m in models:
        procs.append(subprocess.Popen([sys.executable, "-m", "statebudget.gateway.fake_engine", "--model", m, "--port",
                                       str(ports[m])] + (["--asleep", "--wake-s", str(handoff_wake_s)] if handoff else []),
                                      stdout=logs[m], stderr=subprocess.STDOUT, env=env))
    wait_up(pp, "/healthz", procs, tmp)
    for m in models:
        wait_up(ports[m], "/health", procs, tmp)
    procs.append(subprocess.Popen([str(BIN / "statebudget"), "gateway", "--planner", f"http://127.0.0.1:{pp}",
                                   "--config", str(tmp / "gw.yaml"), "--token-file", str(tmp / "runtime.token"),
                                   "--adapter-token-file", f"n0={tmp / 'adapter.token'}",
                                   "--adapter" if handoff else "--no-adapter",
                                   "--port", str(gp), "--log-level", "warning"], stdout=logs["gateway"],
                                  stderr=subprocess.STDOUT, env=env))
    wait_up(gp, "/healthz", procs, tmp)
    return procs, ep, gp


def cpu_s(proc: subprocess.Popen) -> float | None:
    """CPU seconds (user + system) the process has used, from /proc; None where there is none."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(port: int, path: str, procs, tmp: Path) -> None:
    import httpx

    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"a server exited; logs in {tmp}:\n" + "\n".join(
                    f.read_text()[-1500:] for f in tmp.glob("*.log")))
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # polling a starting server
    raise SystemExit(f"no answer on port {port} within 60 s; logs in {tmp}")


PROMPT_CHARS = 120  # `--prompt-chars`: an agent's call carries far more (a 30k-token context is ~120k)


def body(tokens: int) -> dict:
    prompt = ("hello " * (PROMPT_CHARS // 6 + 1))[:PROMPT_CHARS]
    return {"model": "coder", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True}


async def latency(ep: int, gp: int, n: int, tokens: int, headers: dict) -> dict:
    direct, gw = await Conn(ep).open(), await Conn(gp).open()
    out = {"direct": [], "gateway": []}
    for i in range(n + 20):
        for name, c in (("direct", direct), ("gateway", gw)) if i % 2 else (("gateway", gw), ("direct", direct)):
            t0 = time.perf_counter()
            status, data = await c.post("/v1/chat/completions", body(tokens), headers if name == "gateway" else None)
            dt = time.perf_counter() - t0
            if status != 200 or not data.endswith(b"data: [DONE]\n\n"):
                raise SystemExit(f"{name}: {status} {data[-300:]!r}")
            if i >= 20:  # warm-up: connections, caches
                out[name].append(dt)
    return out


async def throughput(port: int, seconds: float, connections: int, tokens: int, headers: dict) -> dict:
    stop = time.monotonic() + seconds
    done, errors = [0], []

    async def worker():
        c = await Conn(port).open()
        while time.monotonic() < stop:
            status, data = await c.post("/v1/chat/completions", body(tokens), headers)
            if status == 200:
                done[0] += 1
            else:
                errors.append(status)
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return {"rps": done[0] / (time.monotonic() - t0), "requests": done[0], "errors": len(errors)}


async def handoffs(gp: int, programs: int, tool_s: float) -> dict:
    """TTFT at the client of each handoff (the 2nd and 3rd call of a program), with and without hints."""
    out = {"hints": [], "no_hints": [], "first": []}
    c = await Conn(gp).open()
    chain = ["planner", "coder", "reviewer"]
    for i in range(programs):
        hinted = i % 2 == 0
        for k, model in enumerate(chain):
            headers = {"X-Program-Id": f"h{i}"}
            if hinted and k + 1 < len(chain):
                headers["X-Next-Model"] = f"{chain[k + 1]}; in={tool_s}"
            t0 = time.perf_counter()
            status, data = await c.post("/v1/chat/completions", {**body(4), "model": model}, headers)
            dt = time.perf_counter() - t0  # 4 tokens at full speed: the whole answer is its first token
            if status != 200:
                raise SystemExit(f"handoff {model}: {status} {data[-300:]!r}")
            (out["first"] if k == 0 else out["hints" if hinted else "no_hints"]).append(dt)
            if k + 1 < len(chain):
                await asyncio.sleep(tool_s)  # the agent's tool wait
    return out


def main() -> None:
    global PROMPT_CHARS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=8, help="tokens per streamed answer")
    ap.add_argument("--program-id", action="store_true",
                    help="all requests in one program per connection (X-Program-Id): tool waits between calls")
    ap.add_argument("--handoff", type=int, default=0, metavar="N", help="also N programs through the handoff stack")
    ap.add_argument("--prompt-chars", type=int, default=PROMPT_CHARS, help="characters of each request's prompt")
    ap.add_argument("--tool-s", type=float, default=1.5)
    ap.add_argument("--wake-s", type=float, default=0.5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    PROMPT_CHARS = a.prompt_chars
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs, ep, gp = start_stack(tmp)
    try:
        headers = {"X-Program-Id": "bench-1"} if a.program_id else {}
        lat = asyncio.run(latency(ep, gp, a.requests, a.tokens, headers))
        d, g = np.array(lat["direct"]) * 1e3, np.array(lat["gateway"]) * 1e3
        res = {"requests": a.requests, "tokens": a.tokens, "prompt_chars": a.prompt_chars, "program_id": a.program_id,
               "direct_ms": {"p50": float(np.percentile(d, 50)), "p99": float(np.percentile(d, 99))},
               "gateway_ms": {"p50": float(np.percentile(g, 50)), "p99": float(np.percentile(g, 99))},
               "cores": os.cpu_count()}
        res["added_ms"] = {q: res["gateway_ms"][q] - res["direct_ms"][q] for q in ("p50", "p99")}
        res["direct_rps"] = asyncio.run(throughput(ep, a.seconds, a.connections, a.tokens, {}))
        before = [cpu_s(p) for p in procs]
        res["gateway_rps"] = asyncio.run(throughput(gp, a.seconds, a.connections, a.tokens,
                                                    {"X-Program-Id": "bench-2"} if a.program_id else {}))
        done = res["gateway_rps"]["requests"]
        if done and None not in before:  # CPU of each server per request through the gateway
            res["cpu_ms_per_request"] = {name: round((cpu_s(p) - b) / done * 1e3, 3)
                                         for name, p, b in zip(("planner", "engine", "gateway"), procs, before)}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    if a.handoff:
        tmp2 = Path(tempfile.mkdtemp(prefix="bench-gateway-handoff-"))
        procs, _, gp = start_stack(tmp2, handoff_wake_s=a.wake_s)
        try:
            h = asyncio.run(handoffs(gp, a.handoff, a.tool_s))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
        res["handoff_ms"] = {k: {"n": len(v), "p50": float(np.percentile(np.array(v) * 1e3, 50)),
                                 "p95": float(np.percentile(np.array(v) * 1e3, 95))} for k, v in h.items()}
    print(f"latency, {a.requests} sequential streamed requests of {a.tokens} tokens, prompts of {a.prompt_chars:,} "
          "characters (ms):")
    for k in ("direct_ms", "gateway_ms", "added_ms"):
        print(f"  {k[:-3]:8s} p50 {res[k]['p50']:7.2f}  p99 {res[k]['p99']:7.2f}")
    print(f"throughput, {a.connections} connections, {a.seconds:g} s: direct {res['direct_rps']['rps']:.0f} req/s, "
          f"gateway {res['gateway_rps']['rps']:.0f} req/s ({res['gateway_rps']['errors']} errors)")
    if "cpu_ms_per_request" in res:
        print("  CPU a request through the gateway (ms): " +
              ", ".join(f"{k} {v:.2f}" for k, v in res["cpu_ms_per_request"].items()))
    for k, v in res.get("handoff_ms", {}).items():
        print(f"handoff TTFT at the client, {k:8s} (n={v['n']}): p50 {v['p50']:7.1f} ms  p95 {v['p95']:7.1f} ms")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
