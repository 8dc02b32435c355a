"""The switch from llama-swap, as a user makes it: `statebudget serve`, then `statebudget gateway
--from-llama-swap config.yaml` with a node's adapter token, both as processes. The llama-swap
file's cmd starts a fake engine; the gateway's in-process adapter starts it when the planner
first needs the model, and the openai client gets its answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from statebudget.api.auth import digest

from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.xdist_group("e2e")
BIN = Path(sys.executable).parent



def _up(proc: subprocess.Popen, url: str, log: Path) -> bool:
    assert proc.poll() is None, log.read_text()[-3000:]
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_llama_swap_config_serves_through_the_gateway_with_one_command(tmp_path):
    (tmp_path / "tokens.json").write_text(json.dumps({"tokens": [
        {"sha256": digest("cli-runtime-0123456789"), "role": "runtime", "tenant": "t"},
        {"sha256": digest("cli-adapter-0123456789"), "role": "adapter", "node": "n0"}]}))
    (tmp_path / "runtime.token").write_text("cli-runtime-0123456789\n")
    (tmp_path / "n0.token").write_text("cli-adapter-0123456789\n")
    (tmp_path / "cluster.json").write_text(json.dumps({
        "name": "one", "gpu_kinds": {"G": {"hbm_gb": 1.0, "hbm_gbps": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                                           "tflops": 10, "wake_s": 0.1, "cold_start_s": 1.0}},
        "nodes": [{"name": "n0", "host_dram_gb": 4, "nvme_gb": 100, "nvme_read_gbps": 2, "nvme_write_gbps": 1,
                   "root_gbps": 16, "gpus": {"G": 1}}]}))
    start = free_port()
    (tmp_path / "config.yaml").write_text(f"""
startPort: {start}
macros:
  fake: "{sys.executable} -m statebudget.gateway.fake_engine"
models:
  coder:
    cmd: |
      # a fake engine stands in for llama-server or vllm
      ${{fake}} --model coder --port ${{PORT}}
    aliases: [qwen-coder]
    ttl: 300
  reviewer:
    cmd: ${{fake}} --model reviewer --port ${{PORT}}
groups:
  all: {{swap: true, members: [coder, reviewer]}}
""")
    pp, gp = free_port(), free_port()
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in ("planner", "gateway")}
    procs = []
    try:
        procs.append(subprocess.Popen([str(BIN / "statebudget"), "serve", "--db", str(tmp_path / "sb.db"), "--cluster",
                                       str(tmp_path / "cluster.json"), "--catalog", "toy", "--tokens",
                                       str(tmp_path / "tokens.json"), "--port", str(pp), "--tick-s", "0.5"],
                                      stdout=logs["planner"], stderr=subprocess.STDOUT))
        wait_until(lambda: _up(procs[0], f"http://127.0.0.1:{pp}/healthz", tmp_path / "planner.log"), 60,
                   "the planner to answer")
        procs.append(subprocess.Popen([str(BIN / "statebudget"), "gateway", "--planner", f"http://127.0.0.1:{pp}",
                                       "--from-llama-swap", str(tmp_path / "config.yaml"), "--token-file",
                                       str(tmp_path / "runtime.token"), "--adapter-token-file",
                                       f"n0={tmp_path / 'n0.token'}", "--port", str(gp)],
                                      stdout=logs["gateway"], stderr=subprocess.STDOUT, cwd=tmp_path))
        wait_until(lambda: _up(procs[1], f"http://127.0.0.1:{gp}/healthz", tmp_path / "gateway.log"), 60,
                   "the gateway to answer")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gp}/v1", api_key="unused", max_retries=0)
        assert sorted(m.id for m in client.models.list()) == ["coder", "qwen-coder", "reviewer"]
        r = client.chat.completions.create(model="qwen-coder", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
        assert r.choices[0].message.content == "coder:0 coder:1 coder:2 "
        # the engine the planner asked for runs on llama-swap's port for it (sorted ids: coder first)
        assert httpx.get(f"http://127.0.0.1:{start}/stats").json()["requests"] == 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(15)
    with pytest.raises(httpx.ConnectError):  # the gateway stopped the engines it started
        httpx.get(f"http://127.0.0.1:{start}/stats", timeout=2)
    out = (tmp_path / "gateway.log").read_text()
    assert "llama-swap:" in out and "group 'all'" in out  # what the switch left to the planner is said


def test_a_gateway_started_before_its_planner_says_so_and_a_url_without_scheme_fails(tmp_path, monkeypatch):
    # A planner may start after the gateway (requests get a 502 until then), so an unreachable one
    # is a warning; a URL no request could use is an error, before anything starts.
    import socket

    import uvicorn
    from typer.testing import CliRunner

    from statebudget.cli import app

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: started.append(kw["port"]))
    (tmp_path / "gw.yaml").write_text('engines:\n  - {model: coder, url: "http://127.0.0.1:9", node: n0, gpus: [0]}\n')
    (tmp_path / "rt.token").write_text("runtime-token-0123456789\n")
    args = ["--config", str(tmp_path / "gw.yaml"), "--token-file", str(tmp_path / "rt.token"), "--port", "18089"]
    with socket.socket() as s:  # bound, not listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        res = CliRunner().invoke(app, ["gateway", "--planner", url] + args)
    assert res.exit_code == 0, res.output
    assert f"warning: cannot reach the planner at {url}" in res.output and "502" in res.output
    assert started == [18089]
    res = CliRunner().invoke(app, ["gateway", "--planner", url.removeprefix("http://")] + args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "cannot reach the planner" in res.output and "http://" in res.output
    res = CliRunner().invoke(app, ["gateway", "--planner", "http://[::1"] + args)
    assert res.exit_code == 2 and "Traceback" not in res.output and "not a URL" in res.output, res.output
    assert started == [18089]
