"""`statebudget sweep`: the same rows from the local process pool and from a real Ray cluster (a
head started by the test on 127.0.0.1 and stopped after it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.sim.sweep import METRICS, WALL_CLOCK
from tests.helpers import free_port

RAY = Path(sys.executable).with_name("ray")



@pytest.fixture
def ray_head():
    port = free_port()
    # A one-node cluster on the loopback interface: without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 Ray
    # replaces 127.0.0.1 by the host's network address.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    subprocess.run([str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)


ARGS = ["sweep", "--traces", "swe-team,mapreduce", "--seeds", "1,2", "--policy", "ondemand,frequency,statebudget",
        "--hours", "0.1"]


def test_process_pool_and_ray_give_the_same_rows(tmp_path, ray_head):
    runner = CliRunner()
    res = runner.invoke(app, ARGS + ["--workers", "2", "--json", str(tmp_path / "local.json")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ARGS + ["--ray", ray_head, "--json", str(tmp_path / "ray.json")])
    assert res.exit_code == 0, res.output
    local = json.loads((tmp_path / "local.json").read_text())["rows"]
    remote = json.loads((tmp_path / "ray.json").read_text())["rows"]
    assert len(local) == 2 * 2 * 3
    assert _pure(local) == _pure(remote)  # decision times are wall time: equal only by chance
    assert {r["policy"] for r in local} == {"ondemand", "frequency", "statebudget"}
    assert all(r["start"] == "warm" and r["warmup_s"] == 0.0 for r in local)
    assert all(set(METRICS) <= set(r) and r["decision_p99_ms"] >= r["decision_p50_ms"] >= 0 for r in local)
    _check_split(local)


def _check_split(rows):
    """The per-model split of each row's handoff stall adds up to the row's share of it, and its
    per-model SLO@5, weighted by calls, is the row's."""
    for r in rows:
        slo = r["slo_at5_by_model"]
        assert slo and all(n > 0 and 0 <= a <= 1 for n, a in slo.values())
        assert sum(n * a for n, a in slo.values()) / sum(n for n, _ in slo.values()) == pytest.approx(r["slo_at5"], abs=1e-6)
        parts = list(r["handoff_by_model"].values())
        assert all(w >= 0 and ld >= 0 for w, ld in parts)
        total = sum(w + ld for w, ld in parts)
        if total > 0:
            assert r["handoff_hbm_wait_share"] == pytest.approx(sum(w for w, _ in parts) / total, abs=1e-6)
        else:
            assert r["handoff_hbm_wait_share"] is None


def _pure(rows):
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in rows]


def test_start_and_warmup_reach_the_simulator(tmp_path):
    base = ["sweep", "--traces", "swe-team", "--seeds", "3", "--policy", "ondemand", "--hours", "0.2", "--workers", "1"]
    out = {}
    for name, extra in {"warm": [], "cold": ["--start", "cold"], "warmup": ["--warmup", "300"]}.items():
        res = CliRunner().invoke(app, base + extra + ["--json", str(tmp_path / f"{name}.json")])
        assert res.exit_code == 0, res.output
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert out["cold"]["start"] == "cold" and out["cold"]["rows"][0]["start"] == "cold"
    assert out["warmup"]["rows"][0]["warmup_s"] == 300.0
    warm, cold, late = (out[k]["rows"][0] for k in ("warm", "cold", "warmup"))
    assert _pure([cold])[0] != dict(_pure([warm])[0], start="cold")  # the start changed the run
    assert late["calls_completed"] < warm["calls_completed"]  # the warm-up's calls count nowhere
    _check_split([warm, cold, late])
    assert any(cold["handoff_by_model"].values()), "a cold start stalls some handoff"


def test_sweep_refuses_a_warmup_as_long_as_the_trace():
    res = CliRunner().invoke(app, ["sweep", "--traces", "swe-team", "--seeds", "1", "--policy", "ondemand",
                                   "--hours", "0.1", "--warmup", "360"])
    assert res.exit_code == 2 and "leaves nothing" in res.output, res.output
    res = CliRunner().invoke(app, ["sweep", "--start", "lukewarm"])
    assert res.exit_code == 2 and "--start" in res.output, res.output


def test_sweep_rejects_bad_grids():
    runner = CliRunner()
    res = runner.invoke(app, ["sweep", "--traces", "nope"])
    assert res.exit_code == 2 and "unknown trace preset 'nope'" in res.output
    res = runner.invoke(app, ["sweep", "--seeds", "1,x"])
    assert res.exit_code == 2 and "--seeds" in res.output


def test_sweep_on_an_unreachable_ray_head_fails_fast_in_one_line():
    port = free_port()  # nothing listens on it
    res = CliRunner().invoke(app, ["sweep", "--traces", "swe-team", "--seeds", "1", "--policy", "ondemand",
                                   "--hours", "0.05", "--ray", f"127.0.0.1:{port}"])
    assert res.exit_code == 2 and "cannot reach a Ray head" in res.output, res.output
    res = CliRunner().invoke(app, ["sweep", "--traces", "swe-team", "--seeds", "1", "--policy", "ondemand",
                                   "--hours", "0.05", "--ray", "no-port-here"])
    assert res.exit_code == 2 and "expected auto or HOST:PORT" in res.output, res.output


def test_a_job_can_set_the_re_plan_period_of_statebudget_track_and_only_of_it():
    from statebudget.sim.paired import series
    from statebudget.sim.sweep import jobs, policy_maker, run_job

    (job,) = jobs(["hetero16"], ["swe-team"], [100], ["statebudget-track"], "agent-team", 0.25, warmup_s=300.0)
    rows = [run_job(job), run_job(dict(job, replan_s=10.0)), run_job(dict(job, replan_s=60.0))]
    assert rows[0]["stall_total_s"] == rows[2]["stall_total_s"]  # 60 s is the default
    ran = rows[0]["groups_by_model"]  # where each model's calls ran (the layout search learns from it)
    assert ran and sum(n for by in ran.values() for n in by.values()) == rows[0]["calls_completed"]
    assert all(all(int(i) < 16 for g in by for i in g.split(",")) for by in ran.values())
    # whether a fresher target ends elsewhere on a short job is the layout lottery's: the job's
    # policy is asked instead
    assert policy_maker(dict(job, replan_s=10.0))("statebudget-track").track_cfg.replan_s == 10.0
    assert series(rows, [100], "stall_total_s", replan_s=10.0) == [rows[1]["stall_total_s"]]
    with pytest.raises(ValueError, match="two rows match"):  # the default and R = 60 s: not pinned down
        series(rows[:1] + rows[2:], [100], "stall_total_s", policy="statebudget-track")
    (other,) = jobs(["hetero16"], ["swe-team"], [3], ["frequency"], "agent-team", 0.25)
    with pytest.raises(ValueError, match="replan_s is a knob of statebudget-track"):
        run_job(dict(other, replan_s=60.0))


def test_a_job_s_planner_fields_reach_our_planners_and_no_baseline():
    from statebudget.sim.sweep import policy_maker

    def made(policy, **job):
        return policy_maker(dict(job, policy=policy))(policy)
    lease = made("statebudget-lease", planner={"scale_out_calls": 3})
    assert lease.config.scale_out_calls == 3 and lease.config.lease_page_min_touch == 0.99  # lease_config's own
    assert made("statebudget", planner={"scale_out_calls": 3}).config.scale_out_calls == 3
    track = made("statebudget-track", planner={"scale_out_calls": 3}, replan_s=120)
    assert track.config.scale_out_calls == 3 and track.track_cfg.replan_s == 120
    assert made("statebudget-lease").config.scale_out_calls is None  # no fields: the registry's
    assert type(made("frequency", planner={"scale_out_calls": 3})).__name__ == "Frequency"
    with pytest.raises(ValueError, match="replan_s"):
        policy_maker({"policy": "statebudget", "replan_s": 60})


def test_jobs_carry_planner_fields_and_refuse_an_unknown_one_before_any_run():
    from statebudget.sim.sweep import jobs

    made = jobs(["hetero16"], ["swe-team"], [1, 2], ["statebudget", "frequency"], "agent-team", 0.25,
                planner={"scale_out_calls": 3})
    assert [j["planner"] for j in made] == [{"scale_out_calls": 3}] * 4
    assert "planner" not in jobs(["hetero16"], ["swe-team"], [1], ["statebudget"], "agent-team", 0.25)[0]
    with pytest.raises(ValueError, match="planner: .*'nope'"):
        jobs(["hetero16"], ["swe-team"], [1], ["statebudget"], "agent-team", 0.25, planner={"nope": 1})


def test_planner_fields_are_read_as_field_value_pairs_and_a_slip_is_named():
    from statebudget.sim.sweep import parse_fields

    assert parse_fields("") == {}
    assert parse_fields("a=-1, b=1e-3, c='x',") == {"a": -1, "b": 0.001, "c": "x"}
    assert parse_fields("scale_out_calls=3, place_keeps_weights=TRUE, spread_until_s=none, homes=(('a', (1,)),)") == \
        {"scale_out_calls": 3, "place_keeps_weights": True, "spread_until_s": None, "homes": (("a", (1,)),)}
    for text, says in (("scale_out_calls", "'scale_out_calls' is not FIELD=VALUE"), ("3", "'3' is not FIELD=VALUE"),
                       ("a=1, a=2", "a given twice"), ("a=abc", "a=abc: not a Python literal"), ("a=", "expected FIELD=VALUE"),
                       ("a=1)(b=2", "expected FIELD=VALUE"), ("a=1) + (1", "expected FIELD=VALUE"),
                       ("a={[1]: 2}", "not a Python literal")):
        with pytest.raises(ValueError, match=says):
            parse_fields(text)


def test_a_restart_job_starts_each_policy_from_what_it_learnt_the_day_before(monkeypatch):
    from statebudget.sim import sweep

    with pytest.raises(ValueError, match="history hours"):
        sweep.jobs(["hetero16"], ["swe-team"], [100], ["frequency"], "agent-team", 0.05, history_hours=0)
    with pytest.raises(ValueError, match="history hours"):
        sweep.jobs(["hetero16"], ["swe-team"], [100], ["frequency"], "agent-team", 0.05, history_hours=float("inf"))
    (job,) = sweep.jobs(["hetero16"], ["swe-team"], [100], ["frequency"], "agent-team", 0.05, history_hours=0.2)
    made, taken = [], []
    generate, taking_up = sweep.generate, sweep._taking_up

    def gen(preset, seed, hours, **kw):
        made.append((seed, hours))
        return generate(preset, seed, hours, **kw)

    def spy(make, state):
        taken.append(state)
        return taking_up(make, state)
    monkeypatch.setattr(sweep, "generate", gen)
    monkeypatch.setattr(sweep, "_taking_up", spy)
    with_history = sweep.run_job(job)
    assert sorted(made) == [(100, 0.05), (100 + sweep.HISTORY_SEED, 0.2)]  # the day before: another draw
    (state,) = taken
    assert state["policy"] == "frequency" and state["hotness"]  # what it learnt there
    without = sweep.run_job({k: v for k, v in job.items() if k != "history_hours"})
    assert made[2:] == [(100, 0.05)] and len(taken) == 1
    assert with_history["history_hours"] == 0.2 and "history_hours" not in without
    with pytest.raises(ValueError, match="is a file"):
        sweep.learnt_before(dict(job, trace_file="x.jsonl"))


def test_sweep_table_gives_each_policy_its_mean_over_seeds(tmp_path, monkeypatch):
    from statebudget.cli.common import console

    monkeypatch.setattr(console, "width", 300)  # a worker's COLUMNS=80 would fold the figures
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["sweep", "--traces", "swe-team", "--seeds", "1,2", "--policy", "ondemand",
                                   "--hours", "0.1", "--warmup", "60", "--workers", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    mean = sum(r["ttft_p95_s"] for r in rows) / 2
    line = next(ln for ln in res.output.splitlines() if "mean of 2" in ln)
    assert f"{mean:.3f}" in line, line  # the TTFT p95 column holds the mean of the two seeds
    assert "TTFT p95 s" in res.output and "start warm, warm-up 60 s" in res.output


def test_jobs_take_simulator_fields_for_every_policy_and_refuse_the_ones_a_job_sets():
    from statebudget.sim import sweep as sw

    todo = sw.jobs(["toy2"], ["swe-team"], [1, 2], ["ondemand"], "toy", 0.1, sim={"kv_reserve": "written"})
    assert [j["sim"] for j in todo] == [{"kv_reserve": "written"}] * 2
    assert "sim" not in sw.jobs(["toy2"], ["swe-team"], [1], ["ondemand"], "toy", 0.1)[0]
    with pytest.raises(ValueError, match="seed is set per job"):
        sw.jobs(["toy2"], ["swe-team"], [1], ["ondemand"], "toy", 0.1, sim={"seed": 3})
    with pytest.raises(ValueError, match="sim: .*kv_reservd"):
        sw.jobs(["toy2"], ["swe-team"], [1], ["ondemand"], "toy", 0.1, sim={"kv_reservd": "written"})
    with pytest.raises(ValueError, match="kv_reserve must be one of"):
        sw.jobs(["toy2"], ["swe-team"], [1], ["ondemand"], "toy", 0.1, sim={"kv_reserve": "blocks"})
