"""`statebudget layout`: a layout chosen by replaying a history trace, and bad input named."""

import json

import pytest

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
    assert "kept:" in res.stdout or "kept (" in res.stdout
    got = json.loads(out.read_text())
    assert (got["cluster"], got["catalog"]) == ("hetero16", "agent-team"), "what `--layout` checks the file against"
    tried = got["tried"]
    assert tried[0]["layout"] is None and len(tried) == 4, "no layout, then three within the budget"
    none = tried[0]
    if got["kept"] is not None:
        kept = next(t for t in tried if t["layout"] == got["kept"])
        assert kept["acceptable"] and kept["handoff_p95_s"] < none["handoff_p95_s"]
        assert kept["ttft_p95_s"] <= 1.05 * none["ttft_p95_s"]
        assert f"take it as --layout {out}" in res.stdout and "\nhomes:\n" in res.stdout
        for m, g in got["kept"]:
            assert f"\n  {m}: [{', '.join(map(str, g))}]\n" in res.stdout
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
    for ref in ("statebudget-track", "foresight"):
        res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history", str(path),
                                  "--warmup", "60", "--against", f"sleep-swap,{ref}"])
        assert res.exit_code == 2 and f"--against {ref}: name baselines" in res.stderr, res.output
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



def _loads(timeline, model: str) -> set:
    """(policy, GPUs) of every load or prefetch of `model`'s weights in a `replay --timeline` file."""
    rows = [json.loads(line) for line in timeline.read_text().splitlines()]
    return {(r["policy"], tuple(r["gpus"])) for r in rows if r["model"] == model and r["event"] in ("load", "prefetch")}


def test_replay_takes_a_layout_file_for_our_planners_only(tmp_path):
    trace = _history(tmp_path, "0.1")
    runs = {}
    for name, text in (("none", None), ("homes.yaml", "homes:\n  summarizer: [6]\n"),
                       ("kept.json", json.dumps({"kept": [["summarizer", [6]]], "tried": []}))):
        args = ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(trace),
                "--policy", "statebudget-lease,lru-keepwarm", "--timeline", str(tmp_path / f"{name}.tl")]
        if text is not None:
            (tmp_path / name).write_text(text)
            args += ["--layout", str(tmp_path / name)]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        runs[name] = _loads(tmp_path / f"{name}.tl", "summarizer")
    assert ("statebudget-lease", (6,)) not in runs["none"]
    for name in ("homes.yaml", "kept.json"):
        assert {g for p, g in runs[name] if p == "statebudget-lease"} == {(6,)}, name
        assert {r for r in runs[name] if r[0] == "lru-keepwarm"} == {r for r in runs["none"] if r[0] == "lru-keepwarm"}


def test_a_layout_file_that_holds_reaches_our_planners(tmp_path):
    from statebudget.cli.common import load_layout_checked
    from statebudget.cli.sim import _layout_maker

    path = tmp_path / "l.yaml"
    path.write_text("homes:\n  summarizer: [6]\nholds: true\n")
    homes, holds = load_layout_checked(path, load_cluster("hetero16"), load_catalog("agent-team"))
    assert holds and _layout_maker(homes, ["statebudget-lease"], holds)("statebudget-lease").config.layout_holds
    path.write_text("homes:\n  summarizer: [6]\n")
    assert load_layout_checked(path)[1] is False


@pytest.mark.parametrize("text, error", [
    ("homes:\n  summarizer: [5, 6]\n", "homes[0]: summarizer (tp 1) cannot run on GPUs (5, 6)"),
    ("homes:\n  ghost: [5]\n", "homes[0]: no model 'ghost' in catalog 'agent-team'"),
    ("homes:\n  summarizer: 5\n", "homes.summarizer: expected a list of GPU indices, got 5"),
    ("homes: [summarizer]\n", "homes: expected a mapping, model: [GPU index, ...]"),
    ("layout: {}\n", "expected `homes:`"),
    ("homes:\n  summarizer: [6]\nholds: 1\n", "holds: expected true or false, got 1"),
])
def test_a_bad_layout_is_named_before_anything_runs_or_is_written(tmp_path, text, error):
    path = tmp_path / "layout.yaml"
    path.write_text(text)
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                              str(_history(tmp_path, "0.05")), "--policy", "statebudget-lease", "--layout", str(path)])
    assert res.exit_code == 2, res.output
    assert f"{path}" in res.stderr and error in res.stderr and "Traceback" not in res.stderr
    db = tmp_path / "sb.db"
    res = runner.invoke(app, ["serve", "--db", str(db), "--port", "0", "--layout", str(path)])
    assert res.exit_code == 2 and error in res.stderr
    assert not db.exists() and not list(tmp_path.glob("sb.db*"))


def test_a_search_that_kept_no_layout_leaves_the_planner_as_it_is(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"kept": None, "tried": []}))
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                              str(_history(tmp_path, "0.05")), "--policy", "statebudget-lease", "--layout", str(path)])
    assert res.exit_code == 0, res.output
    assert "the search kept no layout" in res.stderr
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace",
                              str(tmp_path / "history.jsonl"), "--policy", "lru-keepwarm", "--layout",
                              str(tmp_path / "layout.json")])
    assert res.exit_code == 0, res.output


def test_serve_checks_a_layout_against_the_cluster_it_runs_on_the_ledgers_on_a_restart(tmp_path, monkeypatch):
    import uvicorn

    from statebudget.service.ledger import Store
    from statebudget.service.live import LivePlanner

    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    db = tmp_path / "sb.db"
    LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(db)).store.close()
    fits_toy2, fits_hetero16 = tmp_path / "toy2.yaml", tmp_path / "hetero16.yaml"
    fits_toy2.write_text("homes:\n  reviewer: [1]\n")     # 29.5 GB fits no RTX 3090 of hetero16
    fits_hetero16.write_text("homes:\n  planner: [7]\n")  # toy2 has two GPUs
    res = runner.invoke(app, ["serve", "--db", str(db), "--port", "0", "--layout", str(fits_hetero16)])
    assert res.exit_code == 2, res.output
    assert f"{fits_hetero16}: homes[0]: planner (tp 1) cannot run on GPUs (7,)" in res.stderr
    assert "(on toy2 and toy, the ledger's" in res.stderr
    res = runner.invoke(app, ["serve", "--db", str(db), "--port", "0", "--layout", str(fits_toy2)])
    assert res.exit_code == 0, res.output
    assert "cluster toy2" in res.stderr and "layout reviewer:1" in res.stderr
    empty = tmp_path / "empty.db"  # a ledger file with nothing in it yet is a fresh start: --cluster
    empty.touch()
    res = runner.invoke(app, ["serve", "--db", str(empty), "--port", "0", "--layout", str(fits_toy2)])
    assert res.exit_code == 2 and "reviewer's weights (29.5 GB a GPU) do not fit GPUs (1,)" in res.stderr, res.output
    assert not list(tmp_path.glob("empty.db.*")), "no token file minted before the refusal"


def test_serve_keeps_the_ledgers_layout_on_a_restart_and_none_drops_it(tmp_path, monkeypatch):
    import uvicorn

    from statebudget.service.ledger import Store

    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    db, on_1 = tmp_path / "sb.db", tmp_path / "on1.yaml"
    on_1.write_text("homes:\n  reviewer: [1]\n")
    serve = ["serve", "--db", str(db), "--port", "0", "--cluster", "toy2", "--catalog", "toy"]
    res = runner.invoke(app, serve + ["--layout", str(on_1)])
    assert res.exit_code == 0 and "layout reviewer:1\n" in res.stderr, res.output
    res = runner.invoke(app, serve)
    assert res.exit_code == 0 and "layout reviewer:1 (the ledger's)" in res.stderr, res.output
    on_0 = tmp_path / "on0.yaml"
    on_0.write_text("homes:\n  reviewer: [0]\nholds: true\n")
    res = runner.invoke(app, serve + ["--layout", str(on_0)])
    assert res.exit_code == 0 and "layout reviewer:0 holding (replaces the ledger's reviewer:1)" in res.stderr, res.output
    res = runner.invoke(app, serve)
    assert res.exit_code == 0 and "layout reviewer:0 holding (the ledger's)" in res.stderr, res.output
    res = runner.invoke(app, serve + ["--layout", "none"])
    assert res.exit_code == 0 and "no layout (the ledger's reviewer:0 holding dropped)" in res.stderr, res.output
    assert Store(db).get_meta("layout") is None
    runner.invoke(app, serve + ["--layout", str(on_1)])
    kept_none = tmp_path / "searched.json"  # a search that kept no layout: none runs
    kept_none.write_text(json.dumps({"kept": None, "tried": []}))
    res = runner.invoke(app, serve + ["--layout", str(kept_none)])
    assert res.exit_code == 0 and "the ledger's reviewer:1 dropped" in res.stderr, res.output
    assert Store(db).get_meta("layout") is None


def test_a_layout_file_with_a_model_twice_or_both_forms_is_refused(tmp_path):
    trace = _history(tmp_path, "0.05")
    for name, text, error in (
            ("twice.yaml", "homes:\n  summarizer: [6]\n  summarizer: [7]\n", "'summarizer' is given twice"),
            ("twice.json", '{"homes": {"summarizer": [6], "summarizer": [7]}}', "'summarizer' given twice"),
            ("both.yaml", "homes:\n  summarizer: [6]\nkept: null\n", "both `homes:` and `kept:`")):
        (tmp_path / name).write_text(text)
        res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(trace),
                                  "--policy", "statebudget-lease", "--layout", str(tmp_path / name)])
        assert res.exit_code == 2 and error in res.stderr and name in res.stderr, res.output


def test_a_layout_for_baselines_alone_is_refused_and_another_clusters_is_flagged(tmp_path):
    trace = _history(tmp_path, "0.05")
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"cluster": "hetero8", "catalog": "agent-team", "kept": [["summarizer", [6]]]}))
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(trace),
                              "--policy", "lru-keepwarm,sleep-swap", "--layout", str(path)])
    assert res.exit_code == 2 and "--layout: none of the policies takes a layout" in res.stderr, res.output
    res = runner.invoke(app, ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(trace),
                              "--policy", "statebudget-lease", "--layout", str(path)])
    assert res.exit_code == 0, res.output
    assert "a layout found on cluster hetero8, used on hetero16" in res.stderr


def test_a_holding_search_writes_holds_for_replay_and_serve(tmp_path, monkeypatch):
    from statebudget.sim import layouts

    lay = (("summarizer", (6,)),)
    asked = {}

    def search(cl, cat, jobs, name, budget, tolerance, workers, progress, against=(), holds=False):
        asked["holds"] = holds
        means = {m: 1.0 for m in layouts.METRICS}
        return layouts.Search(layouts.Scored(lay, means), layouts.Scored(None, means), [layouts.Scored(None, means),
                              layouts.Scored(lay, means)], holds=holds)

    monkeypatch.setattr(layouts, "search", search)
    out = tmp_path / "layout.json"
    res = runner.invoke(app, ["layout", "--cluster", "hetero16", "--catalog", "agent-team", "--history",
                              str(_history(tmp_path, "0.6")), "--warmup", "300", "--holds", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert asked["holds"] and "  summarizer: [6]\nholds: true\n" in res.stdout
    from statebudget.cli.common import load_layout_checked
    assert load_layout_checked(out, load_cluster("hetero16"), load_catalog("agent-team")) == (lay, True)
