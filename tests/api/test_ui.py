"""The live view at /ui, opened in headless Chromium as an operator would: the bars, the engines,
the lease table and the stall histogram show the books' numbers; a runtime token sees its tenant
only; a screenshot is kept (out/test-artifacts/)."""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser

import httpx
import pytest

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.api.driver import Driver
from statebudget.models.load import load_catalog, load_cluster, parse_trace
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner

from tests.browser import rendered_dom, screenshot
from tests.fake_engines import serve
from tests.helpers import report_op, toy_trace_jsonl

pytestmark = pytest.mark.xdist_group("e2e")
TOK = {"admin": "ui-admin-0123456789", "a": "ui-runtime-a-0123456789", "b": "ui-runtime-b-0123456789",
       "n0": "ui-adapter-n0-0123456789"}


class Elements(HTMLParser):
    """Every element's tag, attributes and own text, in document order."""

    def __init__(self):
        super().__init__()
        self.items, self._stack = [], []

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.items.append(el)
        if tag not in ("br", "img", "input", "meta", "link", "rect"):
            self._stack.append(el)

    def handle_endtag(self, tag):
        while self._stack and self._stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        if self._stack:
            self._stack[-1]["text"] += data


def parse(html: str) -> list[dict]:
    p = Elements()
    p.feed(html)
    return p.items


def _lease_rows(page: list[dict]) -> dict[str, list[str]]:
    """Lease id -> the texts of its row's cells (id, program, model, state, deadline, confidence, reason)."""
    rows = {}
    for i, e in enumerate(page):
        if "data-lease" in e["attrs"]:
            rows[e["attrs"]["data-lease"]] = [c["text"] for c in page[i:i + 7] if c["tag"] == "td"]
    return rows


@pytest.fixture
def live(tmp_path):
    auth = Auth([TokenEntry(token=TOK["admin"], role="admin"), TokenEntry(token=TOK["a"], role="runtime", tenant="a"),
                 TokenEntry(token=TOK["b"], role="runtime", tenant="b"),
                 TokenEntry(token=TOK["n0"], role="adapter", node="n0")])
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))
    with serve(create_app(p, auth, planning_loop=False), lifespan="on") as url:
        yield p, url


def drive(p, url):
    """Tenant a: a toy trace replayed by the runtime driver (its events and hinted leases), the
    coder ready on a GPU (its lease done), a reviewer lease still moving, a call started; tenant
    b: a planner lease."""
    trace = parse_trace(toy_trace_jsonl(seed=3, hours=0.02), "toy")
    asyncio.run(Driver(url, TOK["a"], speed=200.0, call_s=0.0).replay(trace))
    p.event("a", {"type": "program_started", "program": "task"})
    p.submit_lease("a", {"program": "task", "model": "coder", "deadline_s": 60.0, "confidence": 0.9, "with_kv": False})
    for rec in list(p.ops.values()):
        report_op(p, rec.op)
    p.submit_lease("a", {"program": "task", "model": "reviewer", "deadline_s": 90.0, "confidence": 0.6,
                         "with_kv": False})
    p.event("a", {"type": "call_arrived", "program": "task", "call": "c1", "model": "coder", "context_tokens": 50})
    p.event("a", {"type": "call_started", "program": "task", "call": "c1"})
    p.event("b", {"type": "program_started", "program": "other"})
    p.submit_lease("b", {"program": "other", "model": "planner", "deadline_s": 30.0, "confidence": 1.0,
                         "with_kv": False})


def test_the_live_view_shows_the_books_as_an_operator_sees_them(live):
    p, url = live
    drive(p, url)
    assert httpx.get(url + "/ui").status_code == 200
    page = parse(rendered_dom(f"{url}/ui#token={TOK['admin']}"))
    gpus = {int(e["attrs"]["data-gpu"]): e["attrs"] for e in page if "data-gpu" in e["attrs"]}
    assert sorted(gpus) == [g.index for g in p.cluster.gpus]
    for g in p.cluster.gpus:
        ready = {"weights": 0.0, "kv": 0.0}
        for (key, _), c in p.tiers.on_gpu[g.index].items():
            if c.ready and key[0] in ("w", "kv"):
                ready["weights" if key[0] == "w" else "kv"] += c.nbytes
        assert float(gpus[g.index]["data-weights"]) == pytest.approx(ready["weights"])
        assert float(gpus[g.index]["data-capacity"]) == pytest.approx(p.tiers.hbm_cap[g.index])
    assert any(float(a["data-weights"]) > 0 for a in gpus.values())  # the coder's weights are drawn
    text = " ".join(e["text"] for e in page)
    assert "coder awake" in text
    leases = {e["attrs"]["data-lease"]: e for e in page if "data-lease" in e["attrs"]}
    assert set(leases) == set(p.ledger.leases)  # the operator sees every tenant's leases
    states = [e["text"] for e in page if e["attrs"].get("class") == "state"]
    assert sorted(states) == sorted(l.state.name.lower() for l in p.ledger.leases.values())
    # each lease row: its deadline from now (the books' clock is wall time: within the seconds since
    # the page was drawn), its confidence
    for lid, cells in _lease_rows(page).items():
        req = p.ledger.leases[lid].request
        assert 0 <= float(cells[4]) - (req.deadline_s - p.now) < 10 and float(cells[5]) == req.confidence
    dram = [float(e["attrs"]["data-used"]) for e in page if "dram" in e["attrs"].get("class", "").split()]
    assert dram == [p.tiers.host_used[n.name] for n in p.cluster.nodes]  # host DRAM per node
    bins = [e for e in page if e["attrs"].get("class") == "bin"]
    started = sum(1 for r in p.programs.values() for c in r.calls.values() if c.get("started_s") is not None)
    assert started > 1 and sum(int(b["attrs"]["data-count"]) for b in bins) == started
    assert re.search(r"op\d+", text)  # the reviewer's transfer in flight is listed
    shot = screenshot(f"{url}/ui#token={TOK['admin']}", "ui-operator.png")
    assert shot.stat().st_size > 10_000


def test_a_runtime_token_sees_its_tenant_only_and_a_bad_token_is_told(live):
    p, url = live
    drive(p, url)
    page = parse(rendered_dom(f"{url}/ui#token={TOK['b']}"))
    leases = {e["attrs"]["data-lease"] for e in page if "data-lease" in e["attrs"]}
    assert leases == {lid for lid, l in p.ledger.leases.items() if l.request.tenant == "b"} and leases
    assert sum(int(e["attrs"]["data-count"]) for e in page if e["attrs"].get("class") == "bin") == 0
    page = parse(rendered_dom(f"{url}/ui#token=not-a-token-0123456789"))
    status = next(e["text"] for e in page if e["attrs"].get("id") == "status")
    assert status.startswith("token refused")
    assert httpx.get(url + "/v1/ui/state", headers={"Authorization": f"Bearer {TOK['n0']}"}).status_code == 403


def test_a_runtime_sees_no_other_tenants_kv_and_its_own_ids_unscoped():
    from statebudget.service.ui import ui_state
    from tests.helpers import make_live_planner

    p = make_live_planner(kv_rule="swap")  # a tool wait swaps the program's KV out: a KV transfer
    for tenant in ("a", "b"):  # both call their program "task": b's is `b#task` in the books
        p.event(tenant, {"type": "program_started", "program": "task"})
        p.submit_lease(tenant, {"program": "task", "model": "coder", "deadline_s": 60.0, "confidence": 1.0,
                                "with_kv": False})
        for rec in [r for r in p.ops.values() if r.op.object[0] == "w"]:  # the KV swaps stay in flight
            report_op(p, rec.op)
        p.event(tenant, {"type": "call_arrived", "program": "task", "call": "c1", "model": "coder",
                         "context_tokens": 500})
        p.event(tenant, {"type": "call_started", "program": "task", "call": "c1"})
        p.event(tenant, {"type": "call_finished", "program": "task", "call": "c1", "tokens": 600, "output_tokens": 100})
        p.event(tenant, {"type": "tool_started", "program": "task", "tool": "shell", "call": "t1"})
        p.tick()
    kv = {tuple(t["object"]) for t in ui_state(p)["transfers"] if t["object"][0] == "kv"}
    assert kv == {("kv", "task", "coder"), ("kv", "b#task", "coder")}  # the operator sees both, as booked
    for tenant in ("a", "b"):
        mine = [t for t in ui_state(p, tenant)["transfers"] if t["object"][0] == "kv"]
        own = {r.op.op_id for r in p.ops.values() if r.op.object[0] == "kv" and
               p.programs[r.op.object[1]].tenant == tenant}
        assert {t["op"] for t in mine} == own and own  # its own only ...
        assert {tuple(t["object"]) for t in mine} == {("kv", "task", "coder")}  # ... under its own id
        assert {le["program"] for le in ui_state(p, tenant)["leases"]} == {"task"}
