"""Bad input: one clear line naming the file, the line or field and the problem; exit 2; no traceback."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from statebudget.cli import app

runner = CliRunner()

CLUSTER = {"name": "c", "gpu_kinds": {"A100-40G": {"hbm_gb": 40, "hbm_gbps": 1555, "h2d_gbps": 25, "d2h_gbps": 25,
                                                    "tflops": 312, "wake_s": 0.5, "cold_start_s": 30}},
           "nodes": [{"name": "n0", "host_dram_gb": 256, "nvme_gb": 2000, "nvme_read_gbps": 7, "nvme_write_gbps": 5,
                      "root_gbps": 50, "gpus": {"A100-40G": 2}}]}
CATALOG = {"models": [{"name": "planner", "version": "v", "weights_gb": 16, "kv_bytes_per_token": 131072,
                       "active_params_b": 8, "tp": 1}]}
PROGRAM = {"program": "p1", "start": 0, "nodes": [
    {"id": "a", "kind": "call", "model": "planner", "context_tokens": 100, "output_tokens": 10, "after": []},
    {"id": "b", "kind": "tool", "tool": "test", "duration": 1, "after": ["a"]}]}


def write(tmp_path, cluster=CLUSTER, catalog=CATALOG, lines=None):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    (tmp_path / "k.json").write_text(json.dumps(catalog))
    body = lines if lines is not None else [json.dumps(PROGRAM)]
    (tmp_path / "t.jsonl").write_text("\n".join(body) + "\n")


def replay(tmp_path):
    return runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                               "--trace", str(tmp_path / "t.jsonl")])


def assert_clean_error(res, *parts):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for p in parts:
        assert p in res.output, res.output


def test_valid_input_replays(tmp_path):
    write(tmp_path)
    res = replay(tmp_path)
    assert res.exit_code == 0, res.output
    assert "ondemand" in res.output


def test_model_too_big_for_every_gpu_group(tmp_path):
    cat = {"models": [dict(CATALOG["models"][0], weights_gb=90)]}
    write(tmp_path, catalog=cat)
    assert_clean_error(replay(tmp_path), "models.planner", "too big for every GPU group", "90")


def test_negative_size(tmp_path):
    cat = {"models": [dict(CATALOG["models"][0], weights_gb=-1)]}
    write(tmp_path, catalog=cat)
    assert_clean_error(replay(tmp_path), "k.json", "models.0.weights_gb", "greater than 0")


def test_missing_size(tmp_path):
    m = dict(CATALOG["models"][0])
    del m["kv_bytes_per_token"]
    write(tmp_path, catalog={"models": [m]})
    assert_clean_error(replay(tmp_path), "k.json", "models.0.kv_bytes_per_token", "Field required")


def test_unknown_gpu_kind(tmp_path):
    cl = json.loads(json.dumps(CLUSTER))
    cl["nodes"][0]["gpus"] = {"H900": 2}
    write(tmp_path, cluster=cl)
    assert_clean_error(replay(tmp_path), "c.yaml", "unknown GPU kind 'H900'", "A100-40G")


def test_unknown_model_in_trace(tmp_path):
    prog = json.loads(json.dumps(PROGRAM))
    prog["nodes"][0]["model"] = "wizard"
    write(tmp_path, lines=[json.dumps(prog)])
    assert_clean_error(replay(tmp_path), "t.jsonl", "program p1 node a", "unknown model 'wizard'")


def test_after_names_unknown_node(tmp_path):
    prog = json.loads(json.dumps(PROGRAM))
    prog["nodes"][1]["after"] = ["zz"]
    write(tmp_path, lines=[json.dumps({"trace_format": 1}), json.dumps(prog)])
    assert_clean_error(replay(tmp_path), "t.jsonl:2", "node 'b' is after unknown node 'zz'")


def test_cycle(tmp_path):
    prog = json.loads(json.dumps(PROGRAM))
    prog["nodes"][0]["after"] = ["b"]
    write(tmp_path, lines=[json.dumps(prog)])
    assert_clean_error(replay(tmp_path), "t.jsonl:1", "dependency cycle", "a -> b -> a")


def test_malformed_json_line(tmp_path):
    write(tmp_path, lines=[json.dumps(PROGRAM), '{"program": "p2", "start": 0, "nodes": [', json.dumps(PROGRAM)])
    assert_clean_error(replay(tmp_path), "t.jsonl:2", "malformed JSON line")


def test_duplicate_program_names_the_first_line(tmp_path):
    write(tmp_path, lines=[json.dumps(PROGRAM), json.dumps(PROGRAM)])
    assert_clean_error(replay(tmp_path), "t.jsonl:2", "already defined on line 1")


def test_unknown_preset_and_policy(tmp_path):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", "nope", "--catalog", "agent-team", "--trace", str(tmp_path / "t.jsonl")])
    assert_clean_error(res, "nope", "hetero16")
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--policy", "ondemand,magic"])
    assert_clean_error(res, "unknown policy 'magic'")


def test_bad_trace_preset_and_hours(tmp_path):
    res = runner.invoke(app, ["trace", "gen", "--preset", "chaos", "--out", str(tmp_path / "x.jsonl")])
    assert_clean_error(res, "unknown trace preset 'chaos'", "swe-team")
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", "-1", "--out", str(tmp_path / "x.jsonl")])
    assert_clean_error(res, "hours must be a positive, finite number, got -1")


@pytest.mark.parametrize("cl", ["hetero16", "hetero8", "h200x8"])
def test_agent_team_fits_the_multi_gpu_presets(tmp_path, cl):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", cl, "--catalog", "agent-team", "--trace", str(tmp_path / "t.jsonl")])
    assert res.exit_code == 0, res.output


def test_single_a100_rejects_a_tp2_model_and_takes_solo(tmp_path):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", "single-a100", "--catalog", "agent-team", "--trace", str(tmp_path / "t.jsonl")])
    assert_clean_error(res, "models.coder.tp", "tp=2")
    res = runner.invoke(app, ["replay", "--cluster", "single-a100", "--catalog", "solo", "--trace", str(tmp_path / "t.jsonl")])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("body, parts", [
    ({"endpoints": {"coder@cpu:0": "http://127.0.0.1:9"}}, ["e.json", "endpoints", "MODEL@gpu"]),
    ({"endpoints": {"coder@gpu:0": "127.0.0.1:9"}}, ["e.json", "not an http(s) URL"]),
    ({"endpoints": {}}, ["e.json", "endpoints"]),
])
def test_adapter_engine_file_errors(tmp_path, body, parts):
    (tmp_path / "e.json").write_text(json.dumps(body))
    res = runner.invoke(app, ["adapter", "vllm", "--planner", "http://127.0.0.1:9", "--node", "n0", "--token", "t",
                              "--engines", str(tmp_path / "e.json")])
    assert_clean_error(res, *parts)


def test_adapter_kind_and_missing_engine_file(tmp_path):
    res = runner.invoke(app, ["adapter", "nope", "--planner", "http://127.0.0.1:9", "--node", "n0", "--token", "t"])
    assert_clean_error(res, "unknown adapter kind 'nope'", "local")
    res = runner.invoke(app, ["adapter", "sglang", "--planner", "http://127.0.0.1:9", "--node", "n0", "--token", "t"])
    assert_clean_error(res, "--engines")


def test_serve_rejects_a_bad_token_file(tmp_path):
    (tmp_path / "tok.json").write_text(json.dumps({"tokens": [{"token": "short", "role": "admin"}]}))
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--tokens", str(tmp_path / "tok.json")])
    assert_clean_error(res, "tok.json", "tokens.0.token")


@pytest.mark.parametrize("flag,value", [("--kv-rule", "keep"), ("--queue", "lifo")])
def test_serve_rejects_an_unknown_kv_rule_or_queue_before_writing_anything(tmp_path, flag, value):
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), flag, value])
    assert_clean_error(res, flag, repr(value), "fcfs" if flag == "--queue" else "adaptive")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--overload-wait-s", "--scale-out-wait-s"])
def test_serve_rejects_a_negative_wait_before_writing_anything(tmp_path, flag):
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), flag, "-1"])
    assert res.exit_code != 0 and flag in res.output
    assert not list(tmp_path.iterdir())



def test_serve_hands_the_replica_rule_to_the_planner(tmp_path, monkeypatch):
    import uvicorn

    from statebudget.service import live

    made = []

    class Recording(live.LivePlanner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(live, "LivePlanner", Recording)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)  # built, not served
    for args, want in (([], True), (["--scale-out-anywhere"], False)):
        res = runner.invoke(app, ["serve", "--db", str(tmp_path / f"{want}.db"), *args])
        assert res.exit_code == 0, res.output
        assert made[-1].core.cfg.scale_out_fits_typical is want
        made[-1].store.close()

@pytest.mark.parametrize("value,msg", [("soon", "expected seconds or 'none'"), ("-5", "must be >= 0")])
def test_bad_admit_starve(tmp_path, value, msg):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--admit-starve", value])
    assert_clean_error(res, "--admit-starve", msg)


def test_admit_starve_none_replays(tmp_path):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--admit-starve", "none"])
    assert res.exit_code == 0, res.output


def test_bad_tenant_weights_fail_before_anything_is_written(tmp_path):
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--tenant-weights", "dev=two"])
    assert_clean_error(res, "--tenant-weights", "'dev=two'")
    assert not list(tmp_path.iterdir())
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "mixed-tenants", "--hours", "0.1", "--out", str(out),
                              "--tenant-weights", "dev00=2,nobody=1"])
    assert_clean_error(res, "--tenant-weights", "nobody", "dev00")  # names the tenants the preset has
    assert not out.exists()
    res = runner.invoke(app, ["trace", "gen", "--preset", "mixed-tenants", "--hours", "0.1", "--out", str(out),
                              "--tenant-weights", "dev00=2, batch0=0.5"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text().splitlines()[0])["tenant_weights"] == {"dev00": 2.0, "batch0": 0.5}


def _load_cluster_in_worker(path: str):
    from statebudget.models.load import load_cluster
    return load_cluster(path)


def test_an_input_error_in_a_worker_process_reaches_the_parent_whole(tmp_path):
    # Sweeps and the benchmarks run replays in a process pool: the error a worker raises is
    # pickled back. It must arrive as itself, with its message, not as a BrokenProcessPool.
    from concurrent.futures import ProcessPoolExecutor

    from statebudget.models.errors import InputError
    bad = dict(CLUSTER, nodes=[dict(CLUSTER["nodes"][0], gpus={"H900": 1})])
    write(tmp_path, cluster=bad)
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(InputError) as e:
            pool.submit(_load_cluster_in_worker, str(tmp_path / "c.yaml")).result()
    assert e.value.source.endswith("c.yaml") and "H900" in str(e.value)


def test_an_unknown_kv_reserve_is_one_line(tmp_path):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--kv-reserve", "blocks"])
    assert_clean_error(res, "--kv-reserve must be one of asked, written, paged", "'blocks'")


def test_output_paths_that_cannot_be_written_are_refused_before_the_work(tmp_path):
    write(tmp_path)
    (tmp_path / "d").mkdir()
    base = ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
            "--trace", str(tmp_path / "t.jsonl")]
    assert_clean_error(runner.invoke(app, base + ["--json", str(tmp_path / "d")]), "is a folder; --json takes a file")
    assert_clean_error(runner.invoke(app, base + ["--plots", str(tmp_path / "t.jsonl")]), "is a file; --plots takes a folder")
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", "0.1", "--out", str(tmp_path / "d")])
    assert_clean_error(res, "is a folder; --out takes a file")
    assert list((tmp_path / "d").iterdir()) == []
    assert_clean_error(runner.invoke(app, base + ["--json", str(tmp_path / "t.jsonl" / "r.json")]),
                       "t.jsonl is a file, so --json cannot be written there")
    if Path("/proc/self").is_dir():  # Linux: a folder no one can create a file in, root included
        assert_clean_error(runner.invoke(app, base + ["--json", "/proc/statebudget-r.json"]),
                           "--json cannot be written in /proc")
    from statebudget.cli.common import check_outputs
    check_outputs(files=[("--json", Path("/dev/null"))])  # an existing file is written in place: no probe beside it


def test_a_planner_that_cannot_be_reached_is_one_line(tmp_path, monkeypatch):
    import socket

    import httpx

    from statebudget.cli import service

    monkeypatch.setattr(service, "PLANNER_WAIT_S", 0.0)  # drive would wait 10 s for a planner still starting
    write(tmp_path)
    with socket.socket() as s:  # bound, not listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        res = runner.invoke(app, ["residency", "--planner", url, "--token", "x"])
        assert_clean_error(res, "cannot reach the planner at", url, "/v1/residency")
        res = runner.invoke(app, ["drive", "--planner", url, "--token", "x", "--trace", str(tmp_path / "t.jsonl")])
        assert_clean_error(res, "cannot reach the planner at", "/healthz")  # at once, not after the driver's retries
    assert_clean_error(runner.invoke(app, ["residency", "--planner", "127.0.0.1:1", "--token", "x"]),
                       "cannot reach the planner", "is missing")
    # Something answers, but not a planner (a base URL with a path, another service): drive says so.
    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Response(404, request=httpx.Request("GET", url)))
    res = runner.invoke(app, ["drive", "--planner", "http://127.0.0.1:9/v1", "--token", "x", "--trace", str(tmp_path / "t.jsonl")])
    assert_clean_error(res, "GET /healthz answered 404: not a StateBudget planner")


def test_an_os_error_without_a_path_keeps_its_traceback(tmp_path, monkeypatch):
    # Only a path that cannot be written is the user's input; any other OSError is a bug or the
    # machine's, and a one-line "error:" would hide it.
    from statebudget.sim import runner as sim_runner

    write(tmp_path)

    def boom(*a, **kw):
        raise TimeoutError("the simulator hung")

    monkeypatch.setattr(sim_runner, "replay", boom)
    res = replay(tmp_path)
    assert res.exit_code == 1 and isinstance(res.exception, TimeoutError)


def test_serve_on_a_port_in_use_says_so_before_writing_anything(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--cluster", "toy2", "--catalog", "toy",
                                  "--port", str(port)])
    assert_clean_error(res, f"cannot listen on 127.0.0.1:{port}", "in use")
    assert list(tmp_path.iterdir()) == []  # no ledger, no token file


def test_serve_on_a_db_that_is_a_folder_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "d"), "--cluster", "toy2", "--catalog", "toy", "--port", "0"])
    assert_clean_error(res, str(tmp_path / "d"), "is a folder; --db takes a file")
    assert len(res.output.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and not list((tmp_path / "d").iterdir())


def test_serve_on_a_db_that_is_not_sqlite_writes_nothing(tmp_path):
    (tmp_path / "notes.txt").write_text("not a ledger\n")
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "notes.txt"), "--cluster", "toy2", "--catalog", "toy",
                              "--port", "0"])
    assert_clean_error(res, "notes.txt", "is not a SQLite file")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_serve_first_start_keeps_the_admin_secret_out_of_the_token_file_and_the_log(tmp_path, monkeypatch):
    import uvicorn

    from statebudget.api.auth import Auth, digest

    for var in ("STATEBUDGET_TOKENS_FILE", "STATEBUDGET_TOKENS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--cluster", "toy2", "--catalog", "toy",
                              "--port", "0"])
    assert res.exit_code == 0, res.output
    tokens, secret_file = tmp_path / "sb.db.tokens.json", tmp_path / "sb.db.admin-token"
    secret = secret_file.read_text().strip()
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600" and oct(tokens.stat().st_mode & 0o777) == "0o600"
    assert secret not in tokens.read_text() and secret not in res.output and str(secret_file) in res.output
    assert json.loads(tokens.read_text())["tokens"] == [{"sha256": digest(secret), "role": "admin"}]
    assert Auth.load(tokens).principal(secret).role == "admin"
    # a restart keeps both files as they are
    before = tokens.read_bytes(), secret_file.read_bytes()
    assert runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--port", "0"]).exit_code == 0
    assert (tokens.read_bytes(), secret_file.read_bytes()) == before


@pytest.mark.parametrize("text, where", [
    ("name: c\nnodes: [\n  - a: 1\n  b: {\n", "c.yaml:3:3"),
    ("name: c\nnodes:\n  - a: 1\n b: 2\n", "c.yaml:4:2"),
    ('name: "c\nnodes: 1\n', "c.yaml:3:1"),
    ("name: c\n  x: : 1\n", "c.yaml:2:4"),
    ("name: c\nx: 1\x00\n", "c.yaml:2"),
    ("name: c\ngpu_kinds: {}\nname: d\n", "c.yaml:3:1"),  # a key written twice: which one was meant?
])
def test_malformed_yaml_is_one_line_naming_file_and_line(tmp_path, text, where):
    (tmp_path / "c.yaml").write_text(text)
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", "toy", "--trace", "t.jsonl"])
    assert_clean_error(res, where, "malformed YAML")
    assert len(res.output.strip().splitlines()) == 1 and "<unicode string>" not in res.output


def test_undecodable_trace_cluster_and_token_files_are_named(tmp_path):
    write(tmp_path)
    (tmp_path / "t.jsonl").write_bytes((json.dumps(PROGRAM) + "\n").encode() + b'{"program": "\xff\xfe"}\n')
    assert_clean_error(replay(tmp_path), "t.jsonl:2", "not UTF-8")
    assert_clean_error(runner.invoke(app, ["trace", "stats", str(tmp_path / "t.jsonl")]), "t.jsonl:2", "not UTF-8")
    (tmp_path / "c.yaml").write_bytes(b"name: c\n\xc3\x28\n")
    assert_clean_error(replay(tmp_path), "c.yaml:2", "not UTF-8")
    (tmp_path / "tok.json").write_bytes(b"\xff\xfe{}")
    res = runner.invoke(app, ["serve", "--db", str(tmp_path / "sb.db"), "--tokens", str(tmp_path / "tok.json"),
                              "--cluster", "toy2", "--catalog", "toy", "--port", "0"])
    assert_clean_error(res, "tok.json:1", "not UTF-8")
    assert not (tmp_path / "sb.db").exists()
    assert_clean_error(runner.invoke(app, ["token", "list", "--tokens", str(tmp_path / "tok.json")]), "tok.json:1", "not UTF-8")
    assert_clean_error(runner.invoke(app, ["token", "add", "--tokens", str(tmp_path / "tok.json"), "--role", "admin"]),
                       "tok.json:1", "not UTF-8")


def test_evidence_checks_its_profile_before_any_replay(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"statebudget_profile": 1, "links": {"h2d:no-such-node": 1e10}}))
    res = runner.invoke(app, ["evidence", "--quick", "--out", str(tmp_path / "out"), "--profile", str(prof)])
    assert res.exit_code == 2 and "p.json" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "out" / "evidence.json").exists()


def test_a_cluster_file_may_merge_a_shared_block_and_override_its_keys(tmp_path):
    from statebudget.models.load import load_cluster

    text = (Path(__file__).parents[2] / "examples" / "clusters" / "toy2.yaml").read_text()
    node = "{name: n1, host_dram_gb: 1.5, nvme_gb: 20, nvme_read_gbps: 1, nvme_write_gbps: 1, root_gbps: 8, gpus: {Arena-0.4G: 1}}"
    assert node in text
    text = text.replace(node, "{<<: *n0, name: n1}").replace("  - {name: n0,", "  - &n0 {name: n0,")
    (tmp_path / "c.yaml").write_text(text)
    assert [n.name for n in load_cluster(str(tmp_path / "c.yaml")).nodes] == ["n0", "n1"]


@pytest.mark.parametrize("script,args", [("bench_config.py", ["promote_min=1.01"]),
                                         ("bench_policies.py", ["--tuning", "--planner", "promote_min=1.01"])])
def test_a_misspelt_planner_field_in_a_benchmark_is_one_line_before_any_replay(script, args):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(root / "benchmarks" / script)] + args, capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert res.returncode != 0, res.stderr
    assert "Traceback" not in res.stderr and "did you mean 'promote_min_p'" in res.stderr, res.stderr
    assert res.stdout == ""
