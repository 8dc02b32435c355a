"""Bad input never gets a 5xx: schemathesis generates requests from the published OpenAPI schema,
each sent with a token of the role its route needs, and hypothesis sends JSON junk (NaN,
infinities, huge integers, lone surrogates, control and bidi characters, deep nesting) and raw
bytes to every route that takes a body."""

import json
import math

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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
    return create_app(planner, auth, planning_loop=False, docs=True)


def H(role: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


app = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=H("admin"))


def _role(path: str) -> str:
    if path.startswith(("/v1/events", "/v1/leases")):
        return "runtime"
    if path.startswith(("/v1/plan", "/v1/ops", "/v1/inventory")):
        return "adapter"
    return "admin"


@schema.exclude(path="/v1/oracle/runs", method="POST").parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case):
    if case.path == "/v1/plan" and isinstance(case.query, dict):
        case.query["wait"] = 0  # no long polls in a fuzz run
    case.call_and_validate(headers=H(_role(case.path)), checks=[not_a_server_error])


# ---- JSON junk -----------------------------------------------------------------------------------------
_chars = (st.characters(codec=None, exclude_categories=()) | st.characters(categories=["Cs"])
          | st.sampled_from("\x00\x1b\n\u202e\u2066\u200f\ufeff"))
_specials = st.sampled_from([math.nan, math.inf, -math.inf, 2**63, -2**63 - 1, 2**64, 10**30, 1e308, -0.0,
                             "\ud800", "\udfff", "\u202e", "\x00", "", " "])
_scalars = (_specials | st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
            | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(_chars, max_size=12))
_junk = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(_chars, max_size=8), inner, max_size=4),
                     max_leaves=12)

# each route's fields, so junk values land on real fields (and the rest of a valid body around them)
_ROUTES = {
    ("POST", "/v1/events", "runtime"): {"type": "call_arrived", "program": "p1", "call": "c1", "model": "planner"},
    ("POST", "/v1/leases", "runtime"): {"program": "p1", "model": "planner", "deadline_s": 30},
    ("POST", "/v1/ops/op1", "adapter"): {"status": "failed", "version": 0, "epoch": 0},
    ("PUT", "/v1/cluster", "admin"): {"cluster": {"name": "x", "gpu_kinds": {}, "nodes": []}, "catalog": {"models": []}},
    ("POST", "/v1/oracle/runs", "admin"): {"preset": "not-a-preset"},
    ("PUT", "/v1/inventory", "adapter"): {"node": "n0", "copies": [{"object": ["w", "planner"], "tier": "gpu:0"}]},
    ("PUT", "/v1/layout", "admin"): {"homes": {"planner": [0]}},
}
_FIELDS = {"type", "program", "call", "model", "tool", "thread", "after", "effect", "result", "ttft_s", "duration_s",
           "context_tokens", "tokens", "epoch", "attempt", "deadline_s", "earliest_s", "confidence", "cancel_token",
           "for_call", "status", "bytes", "seconds", "checksum", "version", "error", "cluster", "catalog", "hours",
           "seed", "window", "overlap", "time_limit_s", "node", "reason", "copies", "homes", "kept", "holds"}
_client = TestClient(app, raise_server_exceptions=False)
_body = st.one_of(
    _junk,
    st.dictionaries(st.sampled_from(sorted(_FIELDS)), _junk, max_size=5),
    st.tuples(st.sampled_from(sorted(_FIELDS)), _junk),  # one junk field in an otherwise valid body
)


@given(route=st.sampled_from(sorted(_ROUTES)), body=_body,
       raw=st.sampled_from([None, None, None, b""]) | st.binary(max_size=64),  # mostly JSON
       nested=st.sampled_from([0, 0, 0, 1, 2, 3]), infinity=st.sampled_from(["Infinity", "1e400"]))
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_json_junk_never_gets_a_server_error(route, body, raw, nested, infinity):
    method, path, role = route
    if isinstance(body, tuple):
        body = {**_ROUTES[route], body[0]: body[1]}
    if raw is not None:
        content = raw
    elif nested:  # deep nesting, past Python's recursion limit at 3
        depth = (10, 500, 100_000)[nested - 1]
        content = ("[" * depth + json.dumps(body, allow_nan=True) + "]" * depth).encode()
    else:
        content = json.dumps(body, allow_nan=True).replace("Infinity", infinity).encode()  # \ud800 stays an escape
    r = _client.request(method, path, content=content, headers={**H(role), "content-type": "application/json"})
    assert r.status_code < 500, (method, path, content[:300], r.status_code, r.text[:300])
    if r.status_code == 422:
        assert len(r.content) < 12_000  # a refusal names the field; it does not echo the body
