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
    again["nodes"][0].pop("context_tokens")
    again["nodes"][0]["contxt_tokens"] = 5
    again["nodes"][0]["vendor_tag"] = "kept"  # an extension field, far from every known name: no warning
    header = json.dumps({"trace_format": 1, "slo_clases": {"gold": 5}})
    warned = trace_warnings(parse_trace([header, json.dumps(typo), json.dumps(again)], "t"))
    assert len(warned) == 3, warned
    head, field, slo = warned
    assert "'slo_clases'" in head and "the header" in head and "'slo_classes'" in head
    assert "'contxt_tokens'" in field and "'context_tokens'" in field and "2 times, first at program p1, node a" in field
    assert "'gold'" in slo and "program p1" in slo and "interactive bound, 2 s" in slo
    assert trace_warnings(parse_trace([json.dumps(PROGRAM)], "t")) == []


def test_no_warning_where_the_field_it_is_close_to_is_set_or_the_class_is_the_default():
    p = _program("p1")
    p["nodes"][0]["context_tokenz"] = 7  # context_tokens is set: an extension, not a slip
    p["nodes"][0]["input_tokens"] = 7    # close to output_tokens, but not the same thing
    header = json.dumps({"trace_format": 1, "slo_classes": {"gold": 5.0}})  # p1 left at the default
    assert trace_warnings(parse_trace([header, json.dumps(p)], "t")) == []


def test_many_kinds_of_slip_are_capped_and_counted():
    progs = [json.dumps(_program(f"p{i}", slo=f"class{i}")) for i in range(25)]
    warned = trace_warnings(parse_trace(progs, "t"))
    assert len(warned) == 11 and warned[-1] == "... and 15 more kinds of likely slip", warned


def test_names_from_the_trace_are_printed_as_text_not_markup(tmp_path):
    write(tmp_path, lines=[json.dumps(_program("p1", slo="gold[/]"))])
    res = runner.invoke(app, ["trace", "stats", str(tmp_path / "t.jsonl"), "--catalog", str(tmp_path / "k.json")])
    assert res.exit_code == 0, res.output
    assert "slo class 'gold[/]'" in res.stderr


def test_replay_prints_the_warning_and_still_replays(tmp_path):
    typo = _program("p1")
    typo["nodes"][0]["contxt_tokens"] = typo["nodes"][0].pop("context_tokens")
    write(tmp_path, lines=[json.dumps(typo)])
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--seed", "7"])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.stderr and "did you mean 'context_tokens'?" in res.stderr
    assert "seed 7, start warm" in res.stdout


@pytest.mark.parametrize("option, value", [("--hours", "inf"), ("--hours", "nan"), ("--hours", "0"), ("--load", "inf")])
def test_trace_gen_refuses_a_trace_that_never_ends_or_holds_nothing(tmp_path, option, value):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", option, value, "--out", str(out)])
    assert_clean_error(res, f"{option[2:]} must be a positive, finite number, got {value}")
    assert not out.exists()


def test_trace_gen_writes_no_trace_without_programs(tmp_path):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", "0.0001", "--out", str(out)])
    assert_clean_error(res, "--hours 0.0001", "nothing written")
    assert not out.exists()


def test_replay_refuses_a_warmup_that_leaves_nothing(tmp_path):
    write(tmp_path)  # one program, at 0 s: a warm-up of 0 keeps it, any longer one leaves it out
    res = runner.invoke(app, ["replay", "--cluster", str(tmp_path / "c.yaml"), "--catalog", str(tmp_path / "k.json"),
                              "--trace", str(tmp_path / "t.jsonl"), "--warmup", "0.5"])
    assert_clean_error(res, "--warmup 0.5 s leaves nothing", "last program starts at 0 s")
    assert replay(tmp_path).exit_code == 0


@pytest.mark.parametrize("args, msg", [
    (["--seeds", ""], "--seeds: expected comma-separated seeds of 0 or more"),
    (["--seeds", "1,-2"], "--seeds: expected comma-separated seeds of 0 or more"),
    (["--traces", ","], "--traces names no trace preset"),
    (["--hours", "0"], "--hours: expected a positive, finite number of hours, got 0"),
    (["--hours", "inf"], "--hours: expected a positive, finite number of hours, got inf"),
    (["--workers", "0"], "--workers"),
])
def test_sweep_names_the_option_at_fault(args, msg):
    res = runner.invoke(app, ["sweep", "--policy", "ondemand", "--hours", "0.05", *args])
    assert res.exit_code == 2, res.output
    assert msg in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr


def test_sweep_says_when_its_replays_measured_nothing():
    res = runner.invoke(app, ["sweep", "--traces", "swe-team", "--seeds", "1", "--policy", "ondemand",
                              "--hours", "0.0001", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "1 of 1 replays measured no call" in res.stderr
