import os
import sys
from pathlib import Path

from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# CI replays the same generated examples every run, so a landing is never blocked by a new random
# draw. `HYPOTHESIS_PROFILE=explore make test` draws new examples each run instead.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
