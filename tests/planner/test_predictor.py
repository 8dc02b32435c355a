"""What the predictor has learnt, saved and taken up again (`Predictor.state_dict`): a restart
keeps the switch counts, the start rate and the tool waits, undecayed over the time it was down."""

import json

import numpy as np
import pytest

from statebudget.planner.predictor import Predictor


def learnt(models=("a", "b", "c")) -> Predictor:
    p = Predictor(list(models), half_life_s=600.0)
    for i in range(12):
        tenant = "alice" if i % 3 else "bob"
        p.program_started(f"p{i}", tenant, 10.0 * i)
        p.call_arrived(f"p{i}", "a", 10.0 * i + 1)
        p.call_finished(f"p{i}", 10.0 * i + 2)
        p.tool_started(f"p{i}", "shell", 10.0 * i + 2)
        p.tool_finished(f"p{i}", "shell", 4.0 + i, 10.0 * i + 6 + i)
        p.call_arrived(f"p{i}", "b" if tenant == "alice" else "c", 10.0 * i + 7)
        p.program_finished(f"p{i}", 10.0 * i + 9)
    return p


def test_a_saved_state_taken_up_later_predicts_as_the_predictor_did_when_saved():
    p, saved_at, later = learnt(), 130.0, 130.0 + 7 * 86400.0  # a week down
    state = json.loads(json.dumps(p.state_dict(saved_at)))  # what the ledger stores
    q = Predictor(["a", "b", "c"], half_life_s=600.0)
    q.load_state_dict(state, later)
    for tenant in (None, "alice", "bob"):
        assert np.allclose(q.switch_matrix(later, tenant), p.switch_matrix(saved_at, tenant))
    assert np.allclose(q.model_need_within(later, 30.0), p.model_need_within(saved_at, 30.0))
    assert q.model_need_within(later, 30.0)[0] > 0.2  # programs start with `a`, at a learnt rate
    assert q.tools.params("shell") == p.tools.params("shell") != Predictor(["a"]).tools.params("shell")
    assert q.called == {"a", "b", "c"} and q.cycle_s == p.cycle_s
    assert later - q.first_call_s == saved_at - p.first_call_s
    fresh = Predictor(["a", "b", "c"], half_life_s=600.0)
    assert not fresh.model_need_within(later, 30.0).any()  # what it replaces: no start rate, nothing needed


def test_rows_are_taken_up_by_model_name_when_the_catalog_changed():
    p = learnt()
    q = Predictor(["c", "a", "new"], half_life_s=600.0)  # b dropped, the order changed, one added
    q.load_state_dict(p.state_dict(130.0), 200.0)
    m, old = q.switch_matrix(200.0, "bob"), p.switch_matrix(130.0, "bob")
    # bob's programs: start -> a -> c -> end
    assert m[3, 1] == pytest.approx(m[3].max()) and m[1, 0] == pytest.approx(m[1].max())
    assert m[1, 0] > 0.5 and old[0, 2] > 0.5
    assert np.allclose(m[2], 0.25)  # the new model has no counts: the uniform prior's row
    assert q.called == {"a", "c"}


GOOD = {"format": "statebudget.predictor/1", "models": ["a", "<start|end>"], "switch": [[0.0, 0.0], [5.0, 0.0]],
        "program_starts": 3.0}


@pytest.mark.parametrize("bad, says", [
    ({"format": "statebudget.predictor/0"}, "format"),
    ("not a dict", "format"),
    ({"format": "statebudget.predictor/1", "models": ["a"], "switch": [[0.0]]}, "program_starts"),
    ({"format": "statebudget.predictor/1", "models": ["a", "b"], "switch": [[0.0]], "program_starts": 0.0},
     "must end with"),
    ({"format": "statebudget.predictor/1", "models": ["a", "<start|end>"], "switch": [[0.0]],
      "program_starts": 0.0}, "shape"),
    ({**GOOD, "tenants": {"t": [[0.0]]}}, "shape"),  # a good global part is not taken alone
    ({**GOOD, "tenants": [[0.0]]}, "'tenants' must map"),
    ({**GOOD, "tools": None}, "'tools' must map"),
    ({**GOOD, "tools": {"shell": [1.0]}}, "'tools' must map"),
    ({**GOOD, "tools": {"shell": [1.0, "x", 0.0]}}, "not a number"),
    ({**GOOD, "program_starts": float("nan")}, "program_starts is not finite"),
    ({**GOOD, "switch": [[0.0, -1.0], [5.0, 0.0]]}, "negative"),
    ({**GOOD, "half_life_s": 0}, "half_life_s must be > 0"),
    ({**GOOD, "half_life_s": 1e-320}, "not within 1e6x"),
    ({**GOOD, "switch": [[0.0, 1e300], [5.0, 0.0]]}, "huge count"),
    ({**GOOD, "program_starts": 10 ** 400}, "not a number"),
    ({**GOOD, "models": {"a": 0, "<start|end>": 1}}, "list of model names"),
])
def test_a_state_that_is_not_a_saved_one_is_refused_saying_why(bad, says):
    q = Predictor(["a", "b"])
    with pytest.raises(ValueError, match=says):
        q.load_state_dict(bad, 0.0)
    with pytest.raises(ValueError, match=says):
        Predictor.check_state(bad)
    assert not q.model_need_within(0.0, 30.0).any()  # nothing half taken up
    assert np.allclose(q.switch_matrix(0.0), 1 / 3) and q.tools.stats == {}


def test_counts_saved_under_another_half_life_keep_their_rates():
    p = learnt()
    q = Predictor(["a", "b", "c"], half_life_s=1200.0)  # twice as long: twice the counts, the same rate
    q.load_state_dict(p.state_dict(130.0), 130.0)
    def starts_per_s(x):
        return x.program_starts.rows(130.0)[0, 0] * np.log(2) / x.half_life_s
    assert starts_per_s(p) > 0 and starts_per_s(q) == pytest.approx(starts_per_s(p))
    assert q.global_switch.rows(130.0).sum() == pytest.approx(2 * p.global_switch.rows(130.0).sum())


def test_a_tenant_whose_counts_have_decayed_away_is_not_saved():
    p = learnt()
    p.program_started("late", "carol", 130.0)  # carol: a row, no counts
    p.p_next_within(130.0, 30.0)
    assert set(p.state_dict(130.0)["tenants"]) == {"alice", "bob"}
    assert set(p.state_dict(130.0 + 20 * 600.0)["tenants"]) == set()  # twenty half-lives later
