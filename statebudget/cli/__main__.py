"""`python -m statebudget.cli`, as the service tests and benchmarks start the planner."""

from . import app

app()
