"""Bad input: schemathesis generates requests from the published OpenAPI schema, each sent with a
token of the role its route needs; none may get a 5xx."""

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.live import LivePlanner

TOKENS = {"runtime": "fuzz-runtime-0123456789", "adapter": "fuzz-adapter-0123456789", "admin": "fuzz-admin-0123456789"}


def _app():
    auth = Auth([TokenEntry(token=TOKENS["runtime"], role="runtime", tenant="t"),
                 TokenEntry(token=TOKENS["adapter"], role="adapter", node="n0"),
                 TokenEntry(token=TOKENS["admin"], role="admin")])
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"))
    # state for the generated requests to hit: a running program with a lease and open ops
    planner.event("t", {"type": "program_started", "program": "p1"})
    planner.submit_lease("t", {"program": "p1", "model": "planner", "deadline_s": 30})
    return create_app(planner, auth, planning_loop=False)


app = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


def _role(path: str) -> str:
    if path.startswith(("/v1/events", "/v1/leases")):
        return "runtime"
    if path.startswith(("/v1/plan", "/v1/ops")):
        return "adapter"
    return "admin"


@schema.exclude(path="/v1/oracle/runs", method="POST").parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    if case.path == "/v1/plan" and isinstance(case.query, dict):
        case.query["wait"] = 0  # no long polls in a fuzz run
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKENS[_role(case.path)]}"}, checks=[not_a_server_error])
