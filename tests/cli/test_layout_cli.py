"""`statebudget layout`: a layout chosen by replaying a history trace, and bad input named."""

import json

from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.planner.homes import layout
from statebudget.models.load import load_catalog, load_cluster

runner = CliRunner()


def _history(tmp_path, hours="0.3"):
    path = tmp_path / "history.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--seed", "3", "--hours", hours,
                              "--out", str(path)])
    assert res.exit_code == 0, res.output
    return path


def test_layout_replays_candidates_on_the_history_and_keeps_an_acceptable_one(tmp_path):
    out = tmp_path / "layout.json"
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history",
                              str(_history(tmp_path)), "--warmup", "300", "--budget", "3", "--workers", "1",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "kept:" in res.stdout
    got = json.loads(out.read_text())
    tried = got["tried"]
    assert tried[0]["layout"] is None and len(tried) == 4, "no layout, then three within the budget"
    none = tried[0]
    if got["kept"] is not None:
        kept = next(t for t in tried if t["layout"] == got["kept"])
        assert kept["acceptable"] and kept["handoff_p95_s"] < none["handoff_p95_s"]
        assert kept["ttft_p95_s"] <= 1.05 * none["ttft_p95_s"]
        assert "--planner \"homes=((" in res.stdout
        layout(load_catalog("agent-team"), load_cluster("hetero16"), tuple(
            (m, tuple(g)) for m, g in got["kept"]))  # one the planner takes
    else:
        assert all(not t["acceptable"] or t["handoff_p95_s"] >= none["handoff_p95_s"] for t in tried[1:])


def test_layout_names_bad_input_before_any_replay(tmp_path):
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history",
                              str(_history(tmp_path, "0.05")), "--warmup", "1800"])
    assert res.exit_code == 2, res.output
    assert "--warmup 1800 s: no program of" in res.stderr and "Traceback" not in res.stderr
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history",
                              str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "missing.jsonl" in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def test_layout_refuses_a_baseline_and_a_history_naming_a_model_the_catalog_lacks(tmp_path):
    path = _history(tmp_path, "0.2")
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history", str(path),
                              "--warmup", "60", "--policy", "lru-keepwarm"])
    assert res.exit_code == 2 and "--policy lru-keepwarm: a layout is for our planners" in res.stderr
    lines = path.read_text().splitlines()
    prog = json.loads(lines[1])
    call = next(n for n in prog["nodes"] if n.get("model"))
    call["model"] = "ghost"
    lines[1] = json.dumps(prog)
    path.write_text("\n".join(lines) + "\n")
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history", str(path),
                              "--warmup", "60"])
    assert res.exit_code == 2, res.output
    assert "ghost" in res.stderr and str(path) in res.stderr and "Traceback" not in res.stderr

