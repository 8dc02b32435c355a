"""The machine profile: every link of a cluster measured, the cost model reads it, bad files named."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from statebudget.cli import app
from statebudget.models.errors import InputError
from statebudget.models.load import load_catalog, load_cluster
from statebudget.engine_adapters.local.profile import load_profile, measure_profile, nominal_links
from statebudget.core.costs import CostModel


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    cl, cat = load_cluster("single-a100"), load_catalog("solo")
    steps = []
    prof = measure_profile(cl, size_mb=0.5, repeats=1, catalog=cat, workdir=tmp_path_factory.mktemp("probe"),
                           progress=lambda step, done, total: steps.append((step, done, total)))
    return cl, cat, prof, steps


def test_every_link_of_the_cluster_is_measured_and_positive(measured):
    cl, cat, prof, steps = measured
    assert prof["statebudget_profile"] == 1
    assert set(prof["links"]) == set(nominal_links(cl)) == {"nvme_r:n0", "nvme_w:n0", "root:n0", "h2d:n0/g0", "d2h:n0/g0"}
    assert all(v > 0 for v in prof["links"].values())
    m = prof["measured"]
    for k in ("file_to_host_Bps", "host_to_device_Bps", "device_to_host_Bps", "host_to_file_Bps", "prefill_tok_s_small"):
        assert m[k] > 0, k
    assert prof["links"]["nvme_r:n0"] == m["file_to_host_Bps"] and prof["links"]["nvme_w:n0"] == m["host_to_file_Bps"]
    assert prof["links"]["root:n0"] == max(m["host_to_device_Bps"], m["device_to_host_Bps"])  # one GPU on n0
    assert m["small_model_params"] > 1e6
    assert steps[-1][1] == steps[-1][2] and [s[1] for s in steps] == list(range(1, len(steps) + 1))


def test_prefill_estimates_scale_with_active_params(measured):
    cl, cat, prof, _ = measured
    m = prof["measured"]
    for model in cat.models:
        expect = m["prefill_tok_s_small"] * m["small_model_params"] / (model.active_params_b * 1e9) * model.tp
        assert prof["prefill_tok_s"][model.name] == pytest.approx(expect)
    a, b = cat.models
    assert (prof["prefill_tok_s"][a.name] > prof["prefill_tok_s"][b.name]) == (a.active_params_b < b.active_params_b)


def test_cost_model_reads_the_profile(measured, tmp_path):
    cl, cat, prof, _ = measured
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    loaded = load_profile(path, cl)
    cm = CostModel(cl, cat, profile=loaded)
    for name, bw in prof["links"].items():
        assert cm.link_bw[name] == pytest.approx(bw)
    model = cat.models[0]
    assert cm.prefill_s(model, 1000, (0,)) == pytest.approx(1000 / prof["prefill_tok_s"][model.name])
    nominal = CostModel(cl, cat)
    assert nominal.transfer_s(1e9, "host:n0", "gpu:0") != pytest.approx(cm.transfer_s(1e9, "host:n0", "gpu:0"))


def test_measure_profile_rejects_bad_sizes():
    with pytest.raises(ValueError, match="size_mb"):
        measure_profile(load_cluster("single-a100"), size_mb=0)


GOOD = {"statebudget_profile": 1, "links": {"h2d:n0/g0": 2e10}, "prefill_tok_s": {"planner": 900.0}}


@pytest.mark.parametrize("body, where, what", [
    ("{not json", ":1", "not JSON"),
    ("[1, 2]", "", "JSON object at the top level"),
    (json.dumps({"links": {}}), "", "missing key 'statebudget_profile'"),
    (json.dumps({"statebudget_profile": 2, "links": {}}), ":statebudget_profile", "unsupported profile format 2"),
    (json.dumps({"statebudget_profile": 1}), "", "missing key 'links'"),
    (json.dumps({**GOOD, "links": {"h2d:n0/g0": 0}}), ":links.h2d:n0/g0", "positive number of bytes/s, got 0"),
    (json.dumps({**GOOD, "links": {"root:n0": -5}}), ":links.root:n0", "got -5"),
    (json.dumps({**GOOD, "links": {"root:n0": "fast"}}), ":links.root:n0", "got 'fast'"),
    (json.dumps({**GOOD, "links": {"root:n0": True}}), ":links.root:n0", "got True"),
    (json.dumps({**GOOD, "links": [1]}), ":links", "expected a mapping"),
    (json.dumps({**GOOD, "prefill_tok_s": {"planner": 0}}), ":prefill_tok_s.planner", "tokens/s, got 0"),
    (json.dumps({**GOOD, "links": {"h2d:n7/g3": 1e9}}), ":links.h2d:n7/g3", "no such link in cluster 'single-a100'"),
])
def test_load_profile_errors_name_the_key(tmp_path, body, where, what):
    path = tmp_path / "p.json"
    path.write_text(body)
    with pytest.raises(InputError) as e:
        load_profile(path, load_cluster("single-a100"))
    assert str(e.value).startswith(f"{path}{where}: ")
    assert what in str(e.value)


def test_load_profile_missing_file_and_good_file(tmp_path):
    with pytest.raises(InputError, match="no such profile file"):
        load_profile(tmp_path / "nope.json")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"statebudget_profile": 1, "links": {"h2d:n0/g0": 2e10}}))
    assert load_profile(path)["prefill_tok_s"] == {}


def test_cli_profile_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "sub" / "prof.json"
    res = CliRunner().invoke(app, ["profile", "--cluster", "single-a100", "--catalog", "solo", "--out", str(out),
                                   "--size-mb", "0.25", "--repeats", "1"])
    assert res.exit_code == 0, res.output
    assert "h2d:n0/g0" in res.output and "prefill" in res.output
    prof = load_profile(out, load_cluster("single-a100"))
    assert set(prof["prefill_tok_s"]) == {m.name for m in load_catalog("solo").models}
    res = CliRunner().invoke(app, ["profile", "--cluster", "nope", "--out", str(out)])
    assert res.exit_code == 2 and "no such file" in res.output
