"""The service's loops: a planning step that keeps failing is logged without flooding the log."""

import logging

from fastapi.testclient import TestClient

from tests.helpers import make_live_planner, wait_until
from statebudget.api.app import RepeatedFailure, create_app
from statebudget.api.auth import Auth


def _fail(f: RepeatedFailure, message: str = "broken books", where: int = 0) -> None:
    """One failure of `f`, raised from one of two lines (`where`)."""
    try:
        if where == 0:
            raise ValueError(message)
        raise ValueError(message)
    except ValueError as e:
        f.failed(e)


def _lines(caplog) -> list[tuple[str, bool]]:
    return [(r.getMessage(), r.exc_info is not None) for r in caplog.records]


def test_a_repeated_failure_logs_its_traceback_then_at_each_doubling_then_every_64th(caplog):
    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        for _ in range(1 + 192):
            _fail(f)
    again = [m for m, tb in _lines(caplog)[1:]]
    assert _lines(caplog)[0] == ("step failed", True)
    assert [int(m.split("(repeat ")[1].split(" ")[0]) for m in again] == [1, 2, 4, 8, 16, 32, 64, 128, 192]
    assert all(m.endswith(": ValueError: broken books") for m in again)


def test_a_success_after_failures_says_so_and_the_same_failure_is_new_again(caplog):
    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        _fail(f)
        _fail(f)
        f.ok()
        f.ok()  # nothing failed since: nothing to say
        _fail(f)
    assert _lines(caplog) == [
        ("step failed", True),
        ("step failed again (repeat 1 since its traceback): ValueError: broken books", False),
        ("step works again after 2 failures", False),
        ("step failed", True),
    ]


def test_a_failure_is_known_by_where_it_was_raised_not_by_its_message(caplog):
    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        _fail(f, "no call c1")
        _fail(f, "no call c2")  # the same line: a repeat, though its message differs
        _fail(f, "no call c3", where=1)  # another line: a new failure, with its traceback
    assert [tb for _, tb in _lines(caplog)] == [True, False, True]
    assert _lines(caplog)[1][0].endswith("ValueError: no call c2")


def test_failures_that_alternate_are_counted_apart(caplog):
    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        for _ in range(3):
            _fail(f, where=0)
            _fail(f, where=1)
        f.ok()
    lines = _lines(caplog)
    assert [tb for _, tb in lines[:2]] == [True, True]  # one traceback for each kind
    assert [m.split(" since")[0] for m, tb in lines[2:-1]] == ["step failed again (repeat 1"] * 2 + \
        ["step failed again (repeat 2"] * 2
    assert lines[-1] == ("step works again after 6 failures", False)


def test_a_failure_whose_message_cannot_be_formatted_is_still_logged(caplog):
    class Opaque(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    f = RepeatedFailure("step")
    with caplog.at_level("WARNING", logger="statebudget.api"):
        for _ in range(2):
            try:
                raise Opaque()
            except Opaque as e:
                f.failed(e)
    assert _lines(caplog)[1] == ("step failed again (repeat 1 since its traceback): Opaque", False)


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
