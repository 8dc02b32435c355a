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
    """`tests.helpers.make_live_planner()`: the toy2 cluster, the toy catalog, a fake clock at 1000 s.
    Tests that need another ledger, queue, kv_rule or config build their own."""
    from tests.helpers import make_live_planner

    return make_live_planner()
