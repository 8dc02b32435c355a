"""Trace generators: deterministic, well-formed, shaped as their docstrings say."""

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.models.load import load_catalog, load_trace, write_trace
from statebudget.traces.generators import DRIFT_PERIOD_S, generate
from statebudget.traces.graph import handoff_calls
from statebudget.traces.stats import trace_stats
from statebudget.traces.timeline import nominal_timeline

from tests.helpers import presets_here


@pytest.mark.parametrize("preset", presets_here())
def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, preset):
    runner = CliRunner()
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        res = runner.invoke(app, ["trace", "gen", "--preset", preset, "--seed", str(seed), "--hours", "0.25",
                                  "--out", str(tmp_path / f"{name}.jsonl")])
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]
    tr = load_trace(tmp_path / "a.jsonl")  # and it reads back valid
    assert tr.programs and tr.header.preset == preset


def test_roundtrip_keeps_every_field(tmp_path):
    tr = generate("mapreduce", 1, 0.2)
    write_trace(tr, tmp_path / "t.jsonl")
    back = load_trace(tmp_path / "t.jsonl")
    assert back.programs == tr.programs


def test_fractional_hours_scale_the_trace():
    short, long = generate("swe-team", 2, 0.25), generate("swe-team", 2, 1.0)
    assert max(p.start for p in short.programs) < 0.25 * 3600
    assert max(p.start for p in long.programs) > 0.5 * 3600
    assert 2 * len(short.programs) < len(long.programs)


def test_swe_team_has_ten_developers_handoffs_hints_and_cancels():
    tr = generate("swe-team", 1, 1.0)
    assert len({p.tenant for p in tr.programs}) == 10
    models = Counter(n.model for p in tr.programs for n in p.nodes if n.kind == "call")
    assert set(models) == {"planner", "coder", "fast-coder", "reviewer", "reasoner", "vlm", "summarizer"}
    assert sum(len(handoff_calls(p)) for p in tr.programs) > 0.5 * tr.n_calls
    by_node = {(p.program, n.id): n for p in tr.programs for n in p.nodes}
    hints = [(p, h) for p in tr.programs for h in p.hints]
    wrong = sum(1 for p, h in hints if by_node[(p.program, h.for_)].model != h.model)
    assert 0 < wrong < 0.3 * len(hints)
    assert sum(len(p.cancel) for p in tr.programs) > 0
    tools = Counter(n.tool for p in tr.programs for n in p.nodes if n.kind == "tool")
    assert {"search", "edit", "test", "build", "approval"} <= set(tools)


def test_swe_team_hotness_reverses_over_the_day():
    tr = generate("swe-team", 1, DRIFT_PERIOD_S / 3600)
    early, peak = Counter(), Counter()
    for p in tr.programs:
        bucket = early if p.start < DRIFT_PERIOD_S * 0.2 else peak if abs(p.start - DRIFT_PERIOD_S / 2) < DRIFT_PERIOD_S * 0.15 else None
        if bucket is not None:
            bucket.update(n.model for n in p.nodes if n.kind == "call")
    assert early["coder"] > early["fast-coder"]
    assert peak["fast-coder"] > peak["coder"]


def test_shuffled_keeps_per_program_model_counts_and_breaks_the_order():
    a, b = generate("swe-team", 5, 0.5), generate("swe-team-shuffled", 5, 0.5)
    assert [p.program for p in a.programs] == [p.program for p in b.programs]
    changed = 0
    for pa, pb in zip(a.programs, b.programs):
        ma = [n.model for n in pa.nodes if n.kind == "call"]
        mb = [n.model for n in pb.nodes if n.kind == "call"]
        assert Counter(ma) == Counter(mb)
        changed += ma != mb
    assert changed > len(a.programs) / 3


def test_mixed_tenants_batch_programs_send_no_hints():
    tr = generate("mixed-tenants", 1, 0.5)
    batch = [p for p in tr.programs if p.slo == "batch"]
    assert batch and all(not p.hints for p in batch)
    assert any(p.hints for p in tr.programs if p.slo == "interactive")


def test_mapreduce_forks_joins_and_cancels_backups():
    tr = generate("mapreduce", 1, 0.5)
    joins = [n for p in tr.programs for n in p.nodes if len(n.after) >= 3]
    assert joins
    assert sum(len(p.cancel) for p in tr.programs) > 0


def test_stats_match_a_hand_count():
    tr = generate("swe-team", 1, 0.5)
    s = trace_stats(tr, load_catalog("agent-team"))
    assert s["calls"] == tr.n_calls
    assert sum(s["call_share"].values()) == pytest.approx(1.0, abs=1e-3)
    total_switches = sum(sum(row.values()) for row in s["switch_matrix"].values())
    assert total_switches == sum(1 for p in tr.programs for n in p.nodes if n.kind == "call") - len(tr.programs)
    diagonal = sum(s["switch_matrix"][m][m] for m in s["switch_matrix"])
    assert total_switches - diagonal == s["handoffs"]
    assert sum(s["active_models"]["time_share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert set(s["tool_wait_s"]) >= {"search", "test"}


def test_stats_cli_prints_and_writes_json(tmp_path):
    tr = generate("swe-team", 1, 0.25)
    write_trace(tr, tmp_path / "t.jsonl")
    res = CliRunner().invoke(app, ["trace", "stats", str(tmp_path / "t.jsonl"), "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "switch matrix" in res.output
    assert json.loads((tmp_path / "s.json").read_text())["calls"] == tr.n_calls


def test_catalog_plus_kv_does_not_fit_hetero16():
    """Contention is the point: agent-team's weights plus the KV the swe-team programs hold at their
    peak exceed the HBM hetero16 has for state (each GPU keeps `hbm_reserve_frac` for activations,
    as vLLM's gpu_memory_utilization=0.9 does)."""
    from statebudget.models.load import load_cluster

    cat, cl = load_catalog("agent-team"), load_cluster("hetero16")
    tr = generate("swe-team", 1, 2.0)
    tl = nominal_timeline(tr, cat)
    events = []
    for p in tr.programs:
        per_model = {}
        for n in p.nodes:
            if n.kind == "call" and (p.program, n.id) in tl:
                per_model[n.model] = max(per_model.get(n.model, 0), n.context_tokens + n.output_tokens)
        kv = sum(t * cat.by_name[m].kv_bytes_per_token for m, t in per_model.items())
        span = [tl[(p.program, n.id)] for n in p.nodes if (p.program, n.id) in tl]
        events += [(min(s for s, _ in span), kv), (max(e for _, e in span), -kv)]
    peak = cur = 0.0
    for _, d in sorted(events):
        cur += d
        peak = max(peak, cur)
    weights = sum(m.total_bytes for m in cat.models)
    usable = sum(cl.usable_hbm_bytes(g) for g in cl.gpus)
    assert weights + peak > usable


def test_a_preset_trace_for_a_small_catalog_replays_there(tmp_path):
    # `trace gen --catalog toy`: the models toy lacks become toy's at the same rank by size, in
    # calls and hints; the ones it has keep their names. Without it, toy2 + toy refuse the trace.
    runner = CliRunner()
    plain, toy = tmp_path / "plain.jsonl", tmp_path / "toy.jsonl"
    for path, extra in ((plain, []), (toy, ["--catalog", "toy"])):
        res = runner.invoke(app, ["trace", "gen", "--preset", "mapreduce", "--hours", "0.1", "--out", str(path), *extra])
        assert res.exit_code == 0, res.output
    assert "reasoner -> coder" in res.output and "summarizer -> reviewer" in res.output  # largest, smallest
    a, b = load_trace(plain), load_trace(toy)
    names = {m.name for m in load_catalog("toy").models}
    for pa, pb in zip(a.programs, b.programs, strict=True):
        for na, nb in zip(pa.nodes, pb.nodes, strict=True):
            assert (na.id, na.kind, na.after) == (nb.id, nb.kind, nb.after)
            if na.model:
                assert nb.model in names and (na.model not in names or nb.model == na.model)
        assert all(h.model in names for h in pb.hints) and len(pa.hints) == len(pb.hints)
    base = ["replay", "--cluster", "toy2", "--catalog", "toy", "--policy", "statebudget-lease"]
    assert runner.invoke(app, base + ["--trace", str(plain)]).exit_code == 2  # unknown models, one line
    res = runner.invoke(app, base + ["--trace", str(toy)])
    assert res.exit_code == 0, res.output


def _two_call_programs(n, every_s, pick):
    """`n` programs a -> x, one every `every_s` seconds, x = pick(i)."""
    from tests.helpers import call, program, trace
    return trace(*[program(f"p{i}", [call("c0", "a"), call("c1", pick(i), after=["c0"])], start=i * every_s)
                   for i in range(n)])


def test_switch_drift_tells_a_changed_matrix_from_sampling_noise():
    import random

    from statebudget.traces.stats import switch_drift

    rng = random.Random(0)
    steady = _two_call_programs(400, 9.0, lambda i: rng.choice("bc"))
    flip = _two_call_programs(400, 9.0, lambda i: "b" if (i * 9.0 // 900) % 2 == 0 else "c")  # flips each window
    s, f = switch_drift(steady), switch_drift(flip)
    assert s["windows"] == f["windows"] == 4 and len(s["tv"]) == 3
    assert all(v <= s["null_q95"] for v in s["tv"])  # one matrix throughout: within the noise
    assert f["tv"] == [1.0, 1.0, 1.0] and all(v > f["null_q95"] for v in f["tv"])  # a -> b, then a -> c
    assert switch_drift(steady, min_row=1000)["tv"] == [None] * 3  # too few switches to call it either way
