"""Engines under supervision behind the gateway: the adapter starts each fake engine process when
the planner first needs its model, and a killed engine is started again; the call it was serving
gets a clear error, the next one its answer, and the ledger closes every call."""

from __future__ import annotations

import sys

import httpx
import openai
import pytest

from statebudget.engine_adapters.supervisor import Supervisor, command_argv
from statebudget.engine_adapters.vllm import VllmAdapter

from tests.gateway.stack import gateway_stack
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.xdist_group("e2e")
PROMPT = [{"role": "user", "content": "fix it"}]


def test_a_killed_engine_is_restarted_its_call_in_flight_fails_clearly_and_the_next_is_served(tmp_path):
    with gateway_stack(tmp_path, supervised=True, tokens_per_s=10.0) as s:
        sup, url = s["supervisor"], s["engines"]["coder"]
        assert not sup.running(url)  # nothing runs before the planner asks for it
        client = openai.OpenAI(base_url=s["url"] + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="coder", messages=PROMPT, max_tokens=2)
        assert r.choices[0].message.content == "coder:0 coder:1 "
        assert sup.running(url) and sup.status()["coder@gpu:0"]["restarts"] == 0

        stream = client.chat.completions.create(model="coder", messages=PROMPT, max_tokens=16, stream=True)
        got = []
        with pytest.raises(openai.APIError) as e:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
                    if len(got) == 2:
                        pid = sup.kill(url)  # a crash mid-answer
        assert "coder" in str(e.value) and "failed mid-answer" in str(e.value)
        assert got[:2] == ["coder:0 ", "coder:1 "] and len(got) < 16

        wait_until(lambda: sup.status()["coder@gpu:0"]["restarts"] == 1 and sup.running(url), 30,
                   "the supervisor to start the engine again")
        assert sup.status()["coder@gpu:0"]["pid"] != pid
        r = client.chat.completions.create(model="coder", messages=PROMPT, max_tokens=3)
        assert r.choices[0].message.content == "coder:0 coder:1 coder:2 "

        live = s["live"]
        wait_until(lambda: len(live.programs) == 3 and all(p.status == "finished" for p in live.programs.values()),
                   10, "the three programs to end")
        statuses = sorted(row["status"] for p in live.programs.values() for row in p.calls.values())
        assert statuses == ["cancelled", "finished", "finished"]  # the failed answer is cancelled, not lost
        assert httpx.get(url + "/stats").json()["requests"] == 1  # the new process served the last call


def test_command_templates_read_like_llama_swap_cmds():
    cmd = """
    # the coder
    vllm serve /models/coder \\
      --port ${PORT} --enable-sleep-mode
      --served-model-name 'coder x'
    """
    assert command_argv(cmd, 5801) == ["vllm", "serve", "/models/coder", "--port", "5801", "--enable-sleep-mode",
                                       "--served-model-name", "coder x"]
    with pytest.raises(ValueError):
        command_argv("# only a comment", 1)


def test_the_local_data_plane_runs_an_engine_process_per_model_for_the_whole_path_on_a_laptop(tmp_path):
    with gateway_stack(tmp_path, supervised=True, local=True) as s:
        sup, client = s["supervisor"], openai.OpenAI(base_url=s["url"] + "/v1", api_key="unused", max_retries=0)
        for model in ("planner", "coder", "reviewer", "planner"):  # two of the three fit the GPU
            r = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=2,
                                               extra_headers={"X-Program-Id": "laptop"})
            assert r.choices[0].message.content == f"{model}:0 {model}:1 "
        live = s["live"]

        def consistent():
            """Every model the books hold in HBM has its engine awake, and only those (the planner
            keeps planning after the last answer: checked until it holds)."""
            held = {c["object"][1] for c in live.residency().body()["copies"]
                    if c["ready"] and c["tier"] == "gpu:0" and c["object"][0] == "w"}
            awake = {name.split("@")[0] for name, st in sup.status().items() if st["running"] and not
                     httpx.get(s["engines"][name.split("@")[0]] + "/is_sleeping").json()["is_sleeping"]}
            return bool(held) and held == awake
        wait_until(consistent, 30, "the engines to follow the weights in HBM")
        assert len(s["adapter"].plane.copies) >= 3  # real bytes moved: the model store and the HBM copies


def _fake(tmp_path, n=1):
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(n)]
    cmd = f"{sys.executable} -m statebudget.gateway.fake_engine --model m --port ${{PORT}}"
    return Supervisor({f"m{i}@gpu:{i}": (cmd, u, {}) for i, u in enumerate(urls)}, tmp_path / "logs"), urls


def test_a_crash_restarts_an_awake_engine_before_check_returns_and_gives_up_an_asleep_one(tmp_path):
    sup, (awake, asleep) = _fake(tmp_path, 2)
    try:
        assert sup.check() == [] and not sup.running(awake)  # never started: nothing to restart
        sup.start(awake, 30)
        sup.start(asleep, 30)
        sup.slept(asleep, True)
        sup.kill(awake)
        sup.kill(asleep)
        assert sorted(sup.check()) == sorted([awake, asleep])
        assert sup.running(awake) and httpx.get(awake + "/health").status_code == 200  # healthy on return
        assert not sup.running(asleep) and not sup.status()["m1@gpu:1"]["wanted"]  # its DRAM copy is gone
    finally:
        sup.close()
    assert not sup.running(awake)


def test_an_engine_the_supervisor_has_not_started_is_not_a_restart(tmp_path):
    sup, (url,) = _fake(tmp_path)
    ad = VllmAdapter("http://127.0.0.1:9", "n0", "t", {("m0", "gpu:0"): url}, supervisor=sup)
    try:
        assert ad.engine_generation() == 0
        sup.start(url, 30)
        assert ad.engine_generation() == 0  # its first start is no crash
        sup.kill(url)
        assert ad.engine_generation() == 1 and sup.running(url)
    finally:
        sup.close()
