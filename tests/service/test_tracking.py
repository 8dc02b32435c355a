"""The live planner tracking the forecast MILP: the problem is built from the books, solved
anywhere, and its target adopted unless the catalog changed meanwhile; the service's tracking
loop solves off its event loop and the next planning step prepares the target."""

from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from tests.helpers import make_live_planner, wait_until
from statebudget.api.app import create_app
from statebudget.api.auth import Auth
from statebudget.planner.target import TrackConfig
from statebudget.solvers.target import solve_target


def _calls(p, model: str, n: int) -> None:
    p.event("a", {"type": "program_started", "program": "p1"})
    for i in range(n):
        p.event("a", {"type": "call_arrived", "program": "p1", "call": f"c{i}", "model": model})
        p.event("a", {"type": "call_started", "program": "p1", "call": f"c{i}"})
        p.event("a", {"type": "call_finished", "program": "p1", "call": f"c{i}", "tokens": 100})
    p.event("a", {"type": "program_finished", "program": "p1"})


def test_an_adopted_target_is_prepared_by_the_next_step():
    p = make_live_planner(track=TrackConfig(replan_s=60.0))
    _calls(p, "reviewer", 5)
    policy, prob = p.target_problem()
    sol = solve_target(prob)
    assert sol.status == "optimal"
    assert p.adopt_target(policy, prob, sol)
    p.tick()
    assert "reviewer" in p.core.target
    want = [g for (key, g), c in p.tiers.gpu.items() if key == ("w", "reviewer")]
    assert want == [p.core.target["reviewer"]]  # on its target group: resident or on its way


def test_a_target_solved_for_a_replaced_catalog_is_dropped():
    p = make_live_planner(track=TrackConfig(replan_s=60.0))
    policy, prob = p.target_problem()
    p.set_cluster(p.cluster.model_dump(mode="json"), p.catalog.model_dump(mode="json"))
    assert not p.adopt_target(policy, prob, solve_target(prob))
    assert p.core.target == {}


def test_without_tracking_there_is_no_problem_to_solve():
    assert make_live_planner().target_problem() is None


def test_the_service_solves_off_its_loop_and_counts_the_solves():
    p = make_live_planner(track=TrackConfig(replan_s=3600.0))
    _calls(p, "coder", 5)
    app = create_app(p, Auth([]), planning_loop=True)
    with TestClient(app):
        wait_until(lambda: p.policy.tracker is not None and p.policy.tracker.solves, 20.0, "the first tracking solve")
        body = generate_latest(app.state.service.metrics.registry).decode()
    assert 'statebudget_target_solve_seconds_count{status="optimal"} 1.0' in body


def test_a_tracking_failure_logs_its_traceback_once_then_a_line_at_each_doubling(caplog):
    p = make_live_planner(track=TrackConfig(replan_s=0.01))

    def broken():
        raise RuntimeError("no books")

    p.target_problem = broken
    app = create_app(p, Auth([]), planning_loop=True)
    with caplog.at_level("WARNING", logger="statebudget.api"), TestClient(app):
        wait_until(lambda: sum("tracking solve failed" in r.getMessage() for r in caplog.records) >= 4, 20.0,
                   "four lines (five failed tracking solves)")
    failed = [r for r in caplog.records if "tracking solve failed" in r.getMessage()]
    assert failed[0].exc_info is not None
    assert all(r.exc_info is None and "no books" in r.getMessage() for r in failed[1:])
    assert "(repeat 1 since" in failed[1].getMessage()
    assert "(repeat 2 since" in failed[2].getMessage()
    assert "(repeat 4 since" in failed[3].getMessage()
