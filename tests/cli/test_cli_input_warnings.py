"""Input that is valid but most likely a mistake is named on stderr; option values that would hang
or measure nothing are refused naming the option; a replay says which seed it ran."""

import json

import pytest
from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.models.load import parse_trace, trace_warnings

from .test_cli_input_errors import PROGRAM, assert_clean_error, replay, write

runner = CliRunner()


def _program(name, **changes):
    p = json.loads(json.dumps(PROGRAM))
    p["program"] = name
    p.update(changes)
    return p


def test_a_misspelt_field_and_an_unknown_slo_class_are_named_once_each():
    typo = _program("p1", slo="gold")
    typo["nodes"][0]["contxt_tokens"] = typo["nodes"][0].pop("context_tokens")
    again = _program("p2")
    again["nodes"][0]["contxt_tokens"] = 5
    again["nodes"][0]["vendor_tag"] = "kept"  # an extension field, far from every known name: no warning
    warned = trace_warnings(parse_trace([json.dumps(typo), json.dumps(again)], "t"))
    assert len(warned) == 2, warned
    field, slo = warned
    assert "'contxt_tokens'" in field and "'context_tokens'" in field and "2 times, first at program p1, node a" in field
    assert "'gold'" in slo and "program p1" in slo and "interactive bound, 2 s" in slo
    assert trace_warnings(parse_trace([json.dumps(PROGRAM)], "t")) == []


def test_replay_prints_the_warning_and_still_replays(tmp_path):
    typo = _program("p1")
    typo["nodes"][0]["contxt_tokens"] = typo["nodes"][0].pop("context_tokens")
    write(tmp_path, lines=[json.dumps(typo)])
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--seed", "7"])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.stderr and "did you mean 'context_tokens'?" in res.stderr
    assert "seed 7, start warm" in res.stdout


@pytest.mark.parametrize("hours", ["inf", "nan", "0"])
def test_trace_gen_refuses_hours_that_never_end_or_hold_nothing(tmp_path, hours):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", hours, "--out", str(out)])
    assert_clean_error(res, "--hours: expected a positive number of hours")
    assert not out.exists()


def test_trace_gen_writes_no_trace_without_programs(tmp_path):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", "0.0001", "--out", str(out)])
    assert_clean_error(res, "--hours 0.0001", "nothing written")
    assert not out.exists()


def test_replay_refuses_a_warmup_that_leaves_nothing(tmp_path):
    write(tmp_path)
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--warmup", "10"])
    assert_clean_error(res, "--warmup 10 s leaves nothing", "last program starts at 0 s")
    assert replay(tmp_path).exit_code == 0


@pytest.mark.parametrize("args, msg", [
    (["--seeds", ""], "--seeds: expected comma-separated seeds of 0 or more"),
    (["--seeds", "1,-2"], "--seeds: expected comma-separated seeds of 0 or more"),
    (["--traces", ","], "--traces names no trace preset"),
    (["--hours", "0"], "--hours: expected a positive number of hours, got 0"),
    (["--workers", "0"], "--workers"),
])
def test_sweep_names_the_option_at_fault(args, msg):
    res = runner.invoke(app, ["sweep", "--policy", "ondemand", "--hours", "0.05", *args])
    assert res.exit_code == 2, res.output
    assert msg in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr
