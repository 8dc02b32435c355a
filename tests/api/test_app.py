"""The service's loops: a planning step that keeps failing is logged without flooding the log."""

import logging

from fastapi.testclient import TestClient

from tests.helpers import make_live_planner, wait_until
from statebudget.api.app import RepeatedFailure, create_app
from statebudget.api.auth import Auth


def test_a_repeated_failure_logs_its_traceback_then_at_each_doubling(caplog):
    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        for i in range(9):
            try:
                raise ValueError("broken books")
            except ValueError as e:
                f.failed(e)
        f.ok()  # a success: the same failure is new again
        try:
            raise ValueError("broken books")
        except ValueError as e:
            f.failed(e)
        try:
            raise KeyError("other")
        except KeyError as e:
            f.failed(e)
    msgs = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert msgs == [("step failed", True)] + [
        (f"step failed again ({n} in a row since its traceback): ValueError: broken books", False) for n in (1, 2, 4, 8)
    ] + [("step failed", True), ("step failed", True)]


def test_a_planning_step_that_keeps_failing_logs_a_few_lines(caplog):
    p = make_live_planner()
    steps = []

    def broken():
        steps.append(1)
        raise RuntimeError("no books")

    p.tick = broken
    app = create_app(p, Auth([]), tick_s=0.01, planning_loop=True)
    with caplog.at_level(logging.WARNING, logger="statebudget.api"), TestClient(app):
        wait_until(lambda: len(steps) >= 20, 20.0, "twenty failed planning steps")
    failed = [r for r in caplog.records if "planning step failed" in r.getMessage()]
    assert failed[0].exc_info is not None and "no books" in str(failed[0].exc_info[1])
    assert all(r.exc_info is None and "no books" in r.getMessage() for r in failed[1:])
    assert 5 <= len(failed) <= 1 + len(steps).bit_length()  # traceback, then 1, 2, 4, 8, 16 ...
