import os

import pytest
from hypothesis import settings

# CI replays the same generated examples every run, so a landing is never blocked by a new random
# draw. `HYPOTHESIS_PROFILE=explore make test` draws new examples each run instead.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def live_planner():
    """A `LivePlanner` on the toy2 cluster and toy catalog with an in-memory ledger and a fake
    clock (`live_planner.clock`, a `helpers.Clock` at t = 1000 s: set `.t` to move time). Tests
    that need another ledger, queue, kv_rule or config build their own."""
    from tests.helpers import Clock
    from statebudget.models.load import load_catalog, load_cluster
    from statebudget.service.live import LivePlanner

    return LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=Clock(1000.0))
