"""The gateway in front of a live planner past capacity: the planner's own lease answer (the
admission queue of calls waiting for a model's weights) becomes a 503 with its Retry-After."""

from __future__ import annotations

import math

import httpx
import pytest
from fastapi.testclient import TestClient

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from tests.gateway.stack import ready_refusal
from tests.helpers import Clock, make_live_planner

TOKEN = "runtime-gw-0123456789"


def test_a_request_onto_a_group_past_capacity_is_a_503_with_the_planners_retry_after():
    p = make_live_planner(clock=Clock(1000.0))
    # coder's weights are nowhere yet: eight calls have waited 100 s for them, about 150 s of work
    for i in range(8):
        p.event("team", {"type": "program_started", "program": f"q{i}"})
        p.event("team", {"type": "call_arrived", "program": f"q{i}", "call": "c", "model": "coder",
                         "context_tokens": 8000, "max_tokens": 16000})
    p.clock.t += 100.0
    work = sum(run for _, _, run, _ in p.admission_queue())
    assert work >= 90.0
    p.event("team", {"type": "program_started", "program": "px"})
    p.event("team", {"type": "call_arrived", "program": "px", "call": "cx", "model": "coder"})
    with TestClient(create_app(p, Auth([TokenEntry(token=TOKEN, role="runtime", tenant="team")]),
                               planning_loop=False)) as planner_api:

        def forward(request: httpx.Request) -> httpx.Response:
            r = planner_api.request(request.method, request.url.path, content=request.content,
                                    headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
            return httpx.Response(r.status_code, content=r.content, headers={"content-type": "application/json"})

        err = ready_refusal(forward, "px", "cx", 5.0)
    (lease,) = p.ledger.leases.values()
    assert lease.decision == "rejected" and lease.retry_after_s == pytest.approx(work + p.admission_queue()[-1][2])
    assert err.status == 503 and err.code == "not_ready" and "overloaded: 9 calls wait for HBM on gpu:0" in str(err)
    assert err.retry_after_s == lease.retry_after_s
    assert err.response().headers["retry-after"] == str(math.ceil(lease.retry_after_s))
