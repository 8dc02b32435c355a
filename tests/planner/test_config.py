import pytest

from statebudget.planner.config import PlannerConfig, check_fields, lease_config
from statebudget.sim.sweep import jobs


def test_the_slowdown_that_keeps_weights_must_be_a_positive_number():
    for bad in (0, -1.3, 0.0, float("nan"), float("inf"), "1.3", None):
        with pytest.raises(ValueError, match="place_keeps_weights.*k > 0"):
            PlannerConfig(place_keeps_weights=bad)
    k = PlannerConfig(place_keeps_weights=1).place_keeps_weights
    assert k == 1 and k is not True  # the number 1.0, which `StateBudget.place` reads as k, not True
    with pytest.raises(ValueError, match="place_keeps_weights"):  # a sweep's bad setting fails before any replay
        jobs(["toy2"], ["swe-team"], [1], ["statebudget"], "toy", 0.1, planner={"place_keeps_weights": -1})


def test_the_lease_planner_prepares_only_the_pages_nearly_every_call_touches():
    assert lease_config().lease_page_min_touch == 0.99
    assert PlannerConfig().lease_page_min_touch < 0.99
    assert lease_config(promote_min_p=0.9).promote_min_p == 0.9  # overrides ride on the lease defaults
    with pytest.raises(TypeError):
        lease_config(no_such_knob=1)


def test_an_override_s_slip_is_named_with_the_nearest_field():
    with pytest.raises(ValueError, match="no field 'place_keeps_weight' .did you mean 'place_keeps_weights'"):
        check_fields({"place_keeps_weight": 1})
    with pytest.raises(ValueError, match="no field 'zzz'; the fields: horizon_s, "):
        check_fields({"zzz": 1})
    with pytest.raises(ValueError, match="k > 0"):
        check_fields({"place_keeps_weights": 0})
    check_fields({"place_keeps_weights": 1.3})


def test_a_switch_takes_true_or_false_only():
    with pytest.raises(ValueError, match="scale_out_fits_typical: True or False, got 'false'"):
        check_fields({"scale_out_fits_typical": "false"})  # a non-empty string would be true
    with pytest.raises(ValueError, match="stage_host: True or False, got 0"):
        check_fields({"stage_host": 0})
    check_fields({"scale_out_fits_typical": False, "place_keeps_weights": True})
