"""`statebudget trace import`: real traces (Mooncake, Azure, ServeGen, TraceLab) into format v1."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.models.errors import InputError
from statebudget.models.load import check_compatible, load_catalog, load_cluster, load_trace, parse_trace
from statebudget.traces.importers import import_trace
from statebudget.traces.importers.common import MAX_OUTPUT, Builder, ModelChooser
from statebudget.traces.importers.mooncake import MIN_SHARED_BLOCKS

from tests.helpers import real_data_dir

REAL = real_data_dir()
CAT = load_catalog("agent-team")
runner = CliRunner()


A1 = list(range(14))                       # 6758 tokens: 13 whole blocks + a partial one (id 13)
A2 = list(range(13)) + [100, 101]           # reuses A1's 13 whole blocks, not its partial block
A3 = list(range(13)) + [100, 300, 301, 302]  # 7500 // 512 = 14: A2's whole blocks are 0..12, 100
B1 = [0, 42, 43, 44, 45]                    # 2290 tokens: whole blocks 0, 42, 43, 44
B2 = [0, 42, 43, 44, 200, 201]
MOONCAKE = "\n".join(json.dumps(r) for r in [
    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": A1},     # 1: A starts
    {"timestamp": 0, "input_length": 2290, "output_length": 316, "hash_ids": B1},     # 2: B starts
    {"timestamp": 3000, "input_length": 915, "output_length": 355, "hash_ids": [0, 462]},  # 3: only block 0 shared
    {"timestamp": 30000, "input_length": 7500, "output_length": 120, "hash_ids": A2},  # 4: A, 2nd
    {"timestamp": 33000, "input_length": 2900, "output_length": 80, "hash_ids": B2},   # 5: B, 2nd
    {"timestamp": 33000, "input_length": "many", "output_length": 80, "hash_ids": [7]},  # 6: bad field
    {"timestamp": 60000, "input_length": 8800, "output_length": 9000, "hash_ids": A3},  # 7: A, 3rd
]) + "\n"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def calls(p):
    return [n for n in p.nodes if n.kind == "call"]


def test_mooncake_chains_interleaved_sessions_and_a_request_that_extends_none(tmp_path):
    src = write(tmp_path, "mc.jsonl", MOONCAKE)
    tr, rep = import_trace("mooncake", [src], CAT)
    by = {p.program: p for p in tr.programs}
    assert sorted(by) == ["mc-000000", "mc-000001", "mc-000002"]
    a, b, c = by["mc-000000"], by["mc-000001"], by["mc-000002"]
    assert [n.context_tokens for n in calls(a)] == [6758, 7500, 8800]
    assert [n.context_tokens for n in calls(b)] == [2290, 2900]
    assert [n.context_tokens for n in calls(c)] == [915]  # shares block 0 only: a session of its own
    assert (a.start, b.start, c.start) == (0.0, 0.0, 3.0)
    assert rep.rows_bad == 1 and rep.first_bad[0].startswith(f"{src}:6: input_length 'many'")
    # the third call's output is clipped to what it asked for, and counted
    assert calls(a)[2].output_tokens == MAX_OUTPUT and rep.clips.output == 1
    assert tr.n_calls == 6
    # the role rule: first call plans, a middle call that uses a tool (a wait) codes, the last reviews
    assert [n.model for n in calls(a)] == ["planner", "coder", "reviewer"]
    assert [n.model for n in calls(b)] == ["planner", "reviewer"]


def test_mooncake_ties_go_to_the_latest_tail_then_the_oldest_chain(tmp_path):
    rows = [(0, 1100, [5, 6]), (0, 1100, [5, 6]),  # same time: two chains (one cannot follow the other)
            (5000, 1100, [5, 6, 9]),               # both tails qualify, both at 0 ms: the oldest chain
            (10000, 1500, [5, 6, 11])]             # both qualify: the latest tail (5000 ms, chain 0)
    text = "\n".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 5, "hash_ids": ids})
                     for t, n, ids in rows)
    tr, _ = import_trace("mooncake", [write(tmp_path, "t.jsonl", text)], CAT)
    assert {p.program: [n.context_tokens for n in calls(p)] for p in tr.programs} == {
        "t-000000": [1100, 1100, 1500], "t-000001": [1100]}


def test_mooncake_wait_is_the_gap_after_the_estimated_end(tmp_path):
    tr, _ = import_trace("mooncake", [write(tmp_path, "mc.jsonl", MOONCAKE)], CAT)
    a = next(p for p in tr.programs if p.program == "mc-000000")
    c1, wait, c2 = a.nodes[0], a.nodes[1], a.nodes[2]
    assert wait.kind == "tool" and wait.after == [c1.id] and c2.after == [wait.id]
    est = Builder(ModelChooser(CAT), "default").nominal_s(c1)
    assert 1 < est < 30  # 6758 tokens in, 500 out on the planner (8B) on the reference machine
    assert wait.duration == pytest.approx(30.0 - est, abs=1e-3)


def test_mooncake_strict_prefix_and_clipped_wait(tmp_path):
    # a whole-block request (1024 tokens, 2 ids) extended 100 ms later: the wait clips to 0, no tool node
    rows = [{"timestamp": 0, "input_length": 1024, "output_length": 400, "hash_ids": [5, 6]},
            {"timestamp": 100, "input_length": 1600, "output_length": 10, "hash_ids": [5, 6, 7, 8]},
            {"timestamp": 100, "input_length": 1600, "output_length": 10, "hash_ids": [5, 6, 7, 8]}]
    tr, _ = import_trace("mooncake", [write(tmp_path, "s.jsonl", "\n".join(map(json.dumps, rows)))], CAT)
    first = next(p for p in tr.programs if len(p.nodes) > 1)
    assert [n.kind for n in first.nodes] == ["call", "call"] and first.nodes[1].after == ["n1"]
    # the third arrives with the second, the chain's last request: it cannot follow it, a new chain
    assert len(tr.programs) == 2 and MIN_SHARED_BLOCKS == 2


def test_mooncake_refuse_names_file_and_line_and_writes_nothing(tmp_path):
    src = write(tmp_path, "mc.jsonl", MOONCAKE)
    with pytest.raises(InputError) as e:
        import_trace("mooncake", [src], CAT, on_bad="refuse")
    assert str(e.value).startswith(f"{src}:6: input_length 'many' is not an integer")
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["trace", "import", "--format", "mooncake", str(src), "--out", str(out),
                              "--on-bad", "refuse"])
    assert res.exit_code == 2 and f"{src}:6:" in res.stderr and not out.exists()


def test_mooncake_bad_rows_listed_on_stderr_when_skipped(tmp_path):
    text = MOONCAKE + "not json\n" + json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1}) + "\n"
    src = write(tmp_path, "mc.jsonl", text)
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["trace", "import", "--format", "mooncake", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "skipped 3 bad row(s)" in res.stderr
    assert f"{src}:6:" in res.stderr and f"{src}:8: malformed JSON" in res.stderr
    assert f"{src}:9: timestamp 1 ms is before" in res.stderr
    assert len(load_trace(out).programs) == 3


AZ_CODE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:05.9799600,3180,8
2023-11-16 18:17:07.9799600,70000,8
2023-11-16 18:17:08.0000000,-3,8
"""
AZ_CONV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:01.9799600,374,44
yesterday,396,109
2023-11-16 18:17:11.9799600,396,109
"""


def _azure(tmp_path, **kw):
    paths = [write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZ_CODE),
             write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZ_CONV)]
    return import_trace("azure", paths, CAT, **kw)


def test_azure_one_call_programs_at_their_offsets(tmp_path):
    tr, rep = _azure(tmp_path)
    assert [(p.program, p.start) for p in tr.programs] == [
        ("conv-000001", 0.0), ("code-000001", 2.0), ("code-000002", 4.0), ("code-000003", 6.0), ("conv-000002", 10.0)]
    assert all(len(p.nodes) == 1 for p in tr.programs)
    assert rep.rows_bad == 2 and rep.clips.context == 1
    assert next(p for p in tr.programs if p.program == "code-000003").nodes[0].context_tokens == 60_000
    assert any(":5: ContextTokens -3 must be" in b for b in rep.first_bad)
    assert any("AzureLLMInferenceTrace_conv.csv:3: TIMESTAMP 'yesterday'" in b for b in rep.first_bad)
    # the role rule: one-call classes in order of first appearance onto the catalog's models
    model = {p.program.split("-")[0]: p.nodes[0].model for p in tr.programs}
    assert model == {"code": "planner", "conv": "coder"}


def test_rate_scale_halves_the_gaps_and_hours_cut(tmp_path):
    base, _ = _azure(tmp_path)
    fast, _ = _azure(tmp_path, rate_scale=2.0)
    assert [p.start for p in fast.programs] == [p.start / 2 for p in base.programs]
    cut, _ = _azure(tmp_path, hours=5 / 3600)
    assert [p.start for p in cut.programs] == [0.0, 2.0, 4.0] and cut.header.hours == 5 / 3600
    slow_cut, _ = _azure(tmp_path, rate_scale=0.5, hours=5 / 3600)
    assert [p.start for p in slow_cut.programs] == [0.0, 4.0]


def test_map_model_and_their_errors(tmp_path):
    tr, _ = _azure(tmp_path, mapping="code=coder,*=reviewer")
    assert {p.program.split("-")[0]: p.nodes[0].model for p in tr.programs} == {"code": "coder", "conv": "reviewer"}
    tr, _ = _azure(tmp_path, model="vlm")
    assert {p.nodes[0].model for p in tr.programs} == {"vlm"}
    with pytest.raises(InputError, match="--map: no mapping for 'conv'"):
        _azure(tmp_path, mapping="code=coder")
    with pytest.raises(InputError, match="--map: unknown model 'gpt'"):
        _azure(tmp_path, mapping="code=gpt")
    with pytest.raises(InputError, match="give one of"):
        _azure(tmp_path, mapping="code=coder", model="vlm")
    with pytest.raises(InputError, match="expected KEY=MODEL"):
        _azure(tmp_path, mapping="code")


def test_azure_header_without_a_column_is_refused_even_when_skipping(tmp_path):
    src = write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,4\n")
    with pytest.raises(InputError, match=r"x.csv:1: header lacks column\(s\) GeneratedTokens"):
        import_trace("azure", [src], CAT)


def _round(sid, idx, model, prefix, append, out, tools, events):
    return {"session_id": sid, "round_index": idx, "model": model, "input_tokens_total": prefix + append,
            "prefix_tokens": prefix, "newly_append_tokens": append, "output_tokens": out, "tools": tools,
            "timing_events": [{"event_type": t, "timestamp": ts} for t, ts in events]}


ROUNDS = "\n".join(json.dumps(r) for r in [
    _round("claude:s1", 0, "opus", 0, 9000, 300,
           [{"tool_name": "Bash", "tool_wall_latency_ms": 860, "result_at": "2026-06-01T05:40:31.696Z"},
            {"tool_name": "WebSearch", "tool_wall_latency_ms": 19291, "result_at": "2026-06-01T05:40:50.938Z"}],
           [("user_message", "2026-06-01T05:40:20.151Z"), ("tool_call", "2026-06-01T05:40:30.836Z")]),
    _round("claude:s1", 1, "opus", 9300, 500, 200, [],
           [("tool_result", "2026-06-01T05:40:50.938Z"), ("text", "2026-06-01T05:41:00.000Z")]),
    _round("claude:s1", 2, "opus", 10000, 100, 50, [],
           [("user_message", "2026-06-01T05:41:20.500Z"), ("text", "2026-06-01T05:41:22.000Z")]),
    {"session_id": "codex:s2", "round_index": 0, "model": "gpt", "output_tokens": 10},  # 4: no tokens in
    _round("codex:s2", 0, "gpt", 0, 4000, 90, [{"tool_name": "exec_command", "tool_wall_latency_ms": 67}], []),
    _round("codex:s2", 1, "gpt", 4000, 100, 20, [], []),
]) + "\n"
SESSIONS_CSV = """session_id,arrival_time,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms
0,117,0,0,2318,200,300
0,117,1,2518,348,131,0
0,117,2,2997,812,104,0
1,393,0,0,861,107,273
1,393,1,1241,77,50,x
1,393,1,1241,77,50,10
"""


def test_tracelab_rounds_and_sessions(tmp_path):
    paths = [write(tmp_path, "round_trace.jsonl", ROUNDS), write(tmp_path, "multi_session_large.csv", SESSIONS_CSV)]
    tr, rep = import_trace("tracelab", paths, CAT)
    by = {p.program: p for p in tr.programs}
    s1 = by["round_trace-claude:s1"]
    assert [(n.kind, n.tool or n.model, n.duration, n.after) for n in s1.nodes] == [
        ("call", "planner", 0.0, []), ("tool", "shell", 0.86, ["n1"]), ("tool", "search", 19.291, ["n1"]),
        ("call", "reviewer", 0.0, ["n2", "n3"]),  # a middle round that uses no tool: review
        ("tool", "user", 20.5, ["n4"]),           # the human's wait before the user message of round 2
        ("call", "reviewer", 0.0, ["n5"])]
    assert [n.context_tokens for n in calls(s1)] == [9000, 9800, 10100]
    assert rep.rows_bad == 2 and rep.first_bad[0].startswith(f"{paths[0]}:4: no input_tokens_total (nor prefix_tokens")
    assert f"{paths[1]}:6: tool_wait_after_ms 'x'" in rep.first_bad[1]
    s0 = by["multi_session_large-s0"]
    assert s0.start == 0.117 and [n.context_tokens for n in calls(s0)] == [2318, 2866, 3809]
    assert [(n.kind, n.duration) for n in s0.nodes] == [("call", 0), ("tool", 0.3), ("call", 0), ("call", 0)]
    assert [n.model for n in calls(s0)] == ["planner", "reviewer", "reviewer"]
    s1csv = by["multi_session_large-s1"]
    assert s1csv.start == 0.393 and s1csv.nodes[1].duration == 0.273 and len(s1csv.nodes) == 3
    # --map by model name, session class and file class
    tr, _ = import_trace("tracelab", paths, CAT, mapping="opus=coder,codex=fast-coder,multi_session_large=vlm")
    models = {p.program: {n.model for n in calls(p)} for p in tr.programs}
    assert models == {"round_trace-claude:s1": {"coder"}, "round_trace-codex:s2": {"fast-coder"},
                      "multi_session_large-s0": {"vlm"}, "multi_session_large-s1": {"vlm"}}


SERVEGEN = """model,window_start_s,rate_rps,active_clients,rate_weighted_cv
language/m-large,0,0.5,3,1.2
language/m-large,600,0.05,3,1.2
language/m-large,1200,0.05,3,1.2
reason/r1,0,0.05,1,1.0
reason/r1,600,0.5,1,1.0
reason/r1,1200,-1,1,1.0
"""


def test_servegen_rates_drift_and_seed(tmp_path):
    src = write(tmp_path, "model_rates.csv", SERVEGEN)
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        res = runner.invoke(app, ["trace", "import", "--format", "servegen", str(src), "--seed", str(seed),
                                  "--map", "language/m-large=coder,reason/r1=reasoner",
                                  "--out", str(tmp_path / f"{name}.jsonl")])
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert outs[0] == outs[1]
    assert outs[0].split(b"\n", 1)[1] != outs[2].split(b"\n", 1)[1]  # other programs, not only the header's seed
    assert "model_rates.csv:7: rate_rps -1" in res.stderr
    tr = load_trace(tmp_path / "a.jsonl")
    first = [p.nodes[0].model for p in tr.programs if p.start < 600]
    second = [p.nodes[0].model for p in tr.programs if 600 <= p.start < 1200]
    # about 300 + 30 arrivals in the first window, 30 + 300 in the second: the shares swap
    assert first.count("coder") > 5 * first.count("reasoner") and second.count("reasoner") > 5 * second.count("coder")
    assert 250 < first.count("coder") < 350
    assert max(p.start for p in tr.programs if p.nodes[0].model == "reasoner") < 1200  # its bad window drew none
    scaled, _ = import_trace("servegen", [src], CAT, seed=3, rate_scale=2.0, hours=600 / 3600)
    assert 500 < len(scaled.programs) < 800 and max(p.start for p in scaled.programs) < 600
    with pytest.raises(InputError, match="--rate-scale: would draw about"):
        import_trace("servegen", [src], CAT, rate_scale=1e5)


def test_every_format_writes_a_trace_that_loads_and_fits_the_catalog(tmp_path):
    cases = {
        "mooncake": [write(tmp_path, "mc.jsonl", MOONCAKE)],
        "azure": [write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZ_CODE)],
        "servegen": [write(tmp_path, "model_rates.csv", SERVEGEN)],
        "tracelab": [write(tmp_path, "round_trace.jsonl", ROUNDS)],
    }
    for fmt, paths in cases.items():
        out = tmp_path / f"{fmt}.jsonl"
        res = runner.invoke(app, ["trace", "import", "--format", fmt, *map(str, paths), "--out", str(out),
                                  "--tenant", "lab", "--catalog", "toy"])
        assert res.exit_code == 0, (fmt, res.output)
        tr = parse_trace(out.read_text(), str(out))
        assert tr.header.imported["format"] == fmt and {p.tenant for p in tr.programs} == {"lab"}
        check_compatible(load_cluster("toy2"), load_catalog("toy"), tr, str(out))


@pytest.mark.parametrize("fmt,files,extra", [
    ("azure", ["azure-llm-2023/AzureLLMInferenceTrace_code.csv", "azure-llm-2023/AzureLLMInferenceTrace_conv.csv"],
     ["--map", "code=coder,conv=planner", "--hours", "0.1"]),
    ("tracelab", ["tracelab/round_trace.jsonl", "tracelab/multi_session_large.csv"], []),
    ("servegen", ["servegen/model_rates.csv"], ["--rate-scale", "0.002", "--hours", "0.25", "--map",
     "language/m-large=coder,language/m-mid=reviewer,language/m-small=planner,reason/deepseek-r1=reasoner,"
     "multimodal/mm-image=vlm"]),
])
def test_real_files(tmp_path, fmt, files, extra):
    paths = [REAL / f for f in files]
    if not all(p.is_file() for p in paths):
        pytest.skip(f"{REAL} lacks {files}")
    out = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["trace", "import", "--format", fmt, *map(str, paths), "--out", str(out), *extra])
    assert res.exit_code == 0, res.output
    assert "skipped" not in res.stderr  # the real files are clean
    tr = load_trace(out)
    check_compatible(load_cluster("hetero16"), CAT, tr, str(out))
    assert len(tr.programs) > 40
    if fmt == "tracelab":
        assert len(tr.programs) == 50 and tr.n_calls == 19 + 303
        assert {n.tool for p in tr.programs for n in p.nodes if n.kind == "tool"} >= {"search", "shell", "edit", "user"}
