"""Honest hints (DESIGN.md §5): drawn without looking at the program's future, with calibrated
confidences: the share of hints that name the right model is their mean confidence."""

from __future__ import annotations

import pytest

from statebudget.traces.generators import generate

from tests.helpers import presets_here

SEEDS = (1, 2, 3)
HOURS = 1.0
NO_HINTS = {"long-tail"}  # batch chains only: a batch program announces nothing


def _hints(preset: str, noise: float = 0.0) -> list[tuple[float, bool]]:
    """(confidence, named the right model) of every hint, pooled over `SEEDS`."""
    out = []
    for seed in SEEDS:
        for p in generate(preset, seed, HOURS, hint_noise=noise).programs:
            model = {n.id: n.model for n in p.nodes}
            out += [(h.confidence, model[h.for_] == h.model) for h in p.hints]
    return out


def _share_right(hints) -> float:
    return sum(ok for _, ok in hints) / len(hints)


def _mean_conf(hints) -> float:
    return sum(c for c, _ in hints) / len(hints)


@pytest.mark.parametrize("preset", presets_here(exclude=NO_HINTS))
def test_confidences_are_calibrated(preset):
    hints = _hints(preset)
    assert len(hints) >= 200
    assert abs(_share_right(hints) - _mean_conf(hints)) <= 0.05
    bins: dict[int, list] = {}
    for c, ok in hints:
        bins.setdefault(min(int(c / 0.2), 4), []).append((c, ok))
    checked = [b for b in bins.values() if len(b) >= 50]
    assert len(checked) >= 2
    for b in checked:
        assert abs(_share_right(b) - _mean_conf(b)) <= 0.1, (preset, len(b), _share_right(b), _mean_conf(b))
    assert 0.3 < _share_right(hints) < 0.95  # hints are neither all right nor useless


@pytest.mark.parametrize("preset", sorted(NO_HINTS))
def test_batch_presets_send_no_hints(preset):
    assert not _hints(preset)


@pytest.mark.parametrize("preset", ["swe-team", "mapreduce"])
def test_hint_noise_lowers_the_share_right_and_keeps_calibration(preset):
    clean, noisy = _hints(preset), _hints(preset, noise=0.4)
    assert len(clean) == len(noisy)  # the programs and where hints are issued do not change
    assert _share_right(noisy) < _share_right(clean) - 0.1
    assert abs(_share_right(noisy) - _mean_conf(noisy)) <= 0.05


def test_hint_noise_leaves_the_programs_alone():
    a, b = generate("swe-team", 4, 0.5), generate("swe-team", 4, 0.5, hint_noise=0.5)
    assert [p.nodes for p in a.programs] == [p.nodes for p in b.programs]
    assert [[(h.issued_at, h.for_) for h in p.hints] for p in a.programs] == \
        [[(h.issued_at, h.for_) for h in p.hints] for p in b.programs]
    assert b.header.model_extra.get("hint_noise") == 0.5
    with pytest.raises(ValueError):
        generate("swe-team", 4, 0.5, hint_noise=1.5)


def test_hints_do_not_depend_on_what_follows():
    """Whether a hint is issued, and at which node, is decided before the next call is drawn: every
    tool node of the same kind at the same place of the loop announces, whatever comes next."""
    tr = generate("swe-team", 2, HOURS)
    for p in tr.programs:
        at = {h.issued_at for h in p.hints}
        kinds = {n.id: (n.tool if n.kind == "tool" else "call") for n in p.nodes}
        # every test or build node announces the next call (a review, or the coder again)
        assert all(nid in at for nid, k in kinds.items() if k in ("test", "build"))
        # ... and every search
        assert all(nid in at for nid, k in kinds.items() if k == "search")


@pytest.mark.parametrize("preset", presets_here())
def test_every_call_asks_for_max_tokens_and_writes_no_more(preset):
    for p in generate(preset, 1, 0.3).programs:
        for n in p.nodes:
            if n.kind == "call":
                assert n.max_tokens is not None and 0 < n.output_tokens <= n.max_tokens
                assert n.max_tokens & (n.max_tokens - 1) == 0  # a power of two


def test_max_tokens_is_validated_and_optional():
    from statebudget.models.trace import DEFAULT_MAX_TOKENS, TraceNode
    with pytest.raises(ValueError, match="'n3'.*output_tokens 900 > max_tokens 512"):
        TraceNode(id="n3", kind="call", model="coder", output_tokens=900, max_tokens=512)
    legacy = TraceNode(id="n1", kind="call", model="coder", output_tokens=300)
    assert legacy.max_tokens is None and legacy.requested_tokens == DEFAULT_MAX_TOKENS
    assert TraceNode(id="n2", kind="call", model="coder", output_tokens=300, max_tokens=1024).requested_tokens == 1024


def test_cli_hint_noise(tmp_path):
    from typer.testing import CliRunner
    from statebudget.cli import app
    from statebudget.models.load import load_trace
    out = tmp_path / "t.jsonl"
    res = CliRunner().invoke(app, ["trace", "gen", "--preset", "swe-team", "--hours", "0.3", "--hint-noise", "0.5",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    tr = load_trace(out)
    assert tr.header.model_extra.get("hint_noise") == 0.5
    assert all(n.max_tokens for p in tr.programs for n in p.nodes if n.kind == "call")
