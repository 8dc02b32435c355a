"""What the API refuses, and how a refusal reads (issue 21 "Trust", input and docs): non-finite
numbers in any body or query, oversized bodies, ids that are not printable, empty lease windows,
and 422s that echo at most an excerpt; /docs off by default, and with it on nothing loaded from
another host and /openapi.json for admins only. Each test fails on the API before these checks."""

import asyncio
import json
import re
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from statebudget.api.app import create_app
from statebudget.api.auth import Auth, TokenEntry
from statebudget.api.schemas import OpReport
from statebudget.models import Cluster
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.live import LivePlanner

TOK = {"admin": "admin-token-0123456789", "a": "runtime-a-0123456789", "n0": "adapter-n0-0123456789"}
MIB = 1024 * 1024


def H(who):
    return {"Authorization": f"Bearer {TOK[who]}"}


def _app(docs=False):
    auth = Auth([TokenEntry(token=TOK["admin"], role="admin"), TokenEntry(token=TOK["a"], role="runtime", tenant="team-a"),
                 TokenEntry(token=TOK["n0"], role="adapter", node="n0")])
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"))
    return create_app(planner, auth, planning_loop=False, docs=docs)


@pytest.fixture
def client():
    with TestClient(_app(), raise_server_exceptions=False) as c:
        assert c.post("/v1/events", json={"type": "program_started", "program": "p1"}, headers=H("a")).status_code == 200
        yield c


@pytest.fixture
def docs_client():
    with TestClient(_app(docs=True), raise_server_exceptions=False) as c:
        yield c


def send(c, method, path, raw: str | bytes, who):
    return c.request(method, path, content=raw, headers={**H(who), "content-type": "application/json"})


def with_raw(body: dict, field: str, literal: str) -> str:
    """`body` as JSON with `field` set to the JSON text `literal` (NaN, Infinity: no encoder writes them)."""
    return json.dumps({**body, field: "@@"}).replace('"@@"', literal)


def only_error(r, loc):
    assert r.status_code == 422, (r.status_code, r.text[:300])
    errors = r.json()["detail"]
    assert [e["loc"] for e in errors] == [loc], errors
    return errors[0]


# ---- numbers ----------------------------------------------------------------------------------------------
CALL = {"type": "call_arrived", "program": "p1", "call": "c1", "model": "planner"}
LEASE = {"program": "p1", "model": "planner", "deadline_s": 30}
ORACLE = {"preset": "swe-team"}
NUMERIC = ([("POST", "/v1/events", "a", CALL, f) for f in
            ("context_tokens", "max_tokens", "tokens", "duration_s", "ttft_s", "epoch", "attempt")]
           + [("POST", "/v1/events", "a", {**CALL, "type": "call_finished"}, "output_tokens")]
           + [("POST", "/v1/leases", "a", LEASE, f) for f in ("deadline_s", "confidence", "earliest_s", "epoch")]
           + [("POST", "/v1/ops/op1", "n0", {"status": "done"}, f) for f in ("bytes", "seconds", "version", "epoch")]
           + [("POST", "/v1/oracle/runs", "admin", ORACLE, f) for f in
              ("seed", "hours", "time_limit_s", "window", "overlap", "replicas")])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("method,path,who,body,field", NUMERIC, ids=[f"{p}:{f}" for _, p, _, _, f in NUMERIC])
def test_a_non_finite_number_in_any_numeric_field_is_a_422_naming_it(client, method, path, who, body, field, literal):
    err = only_error(send(client, method, path, with_raw(body, field, literal), who), ["body", field])
    assert "finite" in err["msg"] and err["input"] in ("nan", "inf", "-inf")


@pytest.mark.parametrize("where", [("cluster", "gpu_kinds", "*", "hbm_gb"), ("cluster", "nodes", 0, "host_dram_gb"),
                                   ("cluster", "x-note"), ("catalog", "models", 0, "weights_gb")])
def test_a_non_finite_number_anywhere_in_a_cluster_is_a_422_with_its_path(client, where):
    body = client.get("/v1/cluster", headers=H("admin")).json()
    body.pop("catalog_epoch")
    where = tuple(next(iter(body["cluster"]["gpu_kinds"])) if w == "*" else w for w in where)  # its first GPU kind
    node = body
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = "@@"
    r = send(client, "PUT", "/v1/cluster", json.dumps(body).replace('"@@"', "NaN"), "admin")
    only_error(r, ["body", *where])
    assert client.get("/v1/cluster", headers=H("admin")).status_code == 200  # nothing of it was kept


def test_non_finite_and_out_of_range_numbers_in_queries_are_422s(client):
    for params in ({"wait": "nan"}, {"wait": "inf"}, {"wait": "-inf"}, {"after": "1e400"}, {"after": str(2**64)}):
        r = client.get("/v1/plan", params={"node": "n0", **params}, headers=H("n0"))
        only_error(r, ["query", next(iter(params))])
    only_error(client.get("/v1/oracle/runs/r1", params={"wait": "nan"}, headers=H("admin")), ["query", "wait"])


@pytest.mark.parametrize("raw,loc,what", [
    ('{"type": "program_started", "program": "p2", "x": ' + "9" * 5000 + "}", ["body"], "not JSON"),
    ('{"type": "program_started", "program": "p2", "epoch": ' + str(2**64) + "}", ["body", "epoch"], "64 bits"),
    ('{"type": "program_started", "program": "\\ud800"}', ["body", "program"], "surrogate"),
    ('{"type": "program_started", "program": "p2", "\\udfff": 1}', ["body"], "surrogate"),
    ("[" * 100_000 + "]" * 100_000, ["body"], "nested too deeply"),
    (b'{"type": "program_started", "program": "p\xff"}', ["body"], "not JSON"),
])
def test_json_that_cannot_be_stored_or_written_back_is_a_422_not_a_400_or_500(client, raw, loc, what):
    r = send(client, "POST", "/v1/events", raw, "a")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc and what in r.json()["detail"][0]["msg"], r.text


def test_finite_numbers_only_in_cluster_catalog_and_trace_models():
    good = load_cluster("toy2").model_dump()
    good["gpu_kinds"][next(iter(good["gpu_kinds"]))]["hbm_gb"] = float("inf")  # a YAML `.inf` reads as this
    with pytest.raises(ValidationError, match="finite number"):
        Cluster.model_validate(good)


# ---- sizes and echoes ---------------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_a_413_with_a_short_json_detail(client):
    big = json.dumps({"type": "program_started", "program": "p2", "result": "x" * (2 * MIB)})
    r = send(client, "POST", "/v1/events", big, "a")
    assert r.status_code == 413 and "1048576 bytes" in r.json()["detail"] and len(r.content) < 200

    def chunks():  # no Content-Length: counted as it comes
        for _ in range(40):
            yield b"x" * 65536
    r = client.post("/v1/events", content=chunks(), headers={**H("a"), "content-type": "application/json"})
    assert r.status_code == 413 and "bytes" in r.json()["detail"]


def test_the_trace_and_cluster_routes_take_larger_bodies(client):
    two_mib = "x" * (2 * MIB)
    r = send(client, "POST", "/v1/oracle/runs", json.dumps({"preset": "swe-team", "trace_jsonl": two_mib}), "admin")
    assert r.status_code == 422 and "exactly one" in r.text  # read and validated, not refused for its size
    r = send(client, "PUT", "/v1/cluster", json.dumps({"cluster": {"pad": two_mib}, "catalog": {}}), "admin")
    assert r.status_code == 422
    r = send(client, "PUT", "/v1/cluster", json.dumps({"cluster": {"pad": "x" * (9 * MIB)}, "catalog": {}}), "admin")
    assert r.status_code == 413
    r = send(client, "PUT", "/v1/inventory", json.dumps({"node": "n0", "copies": [], "pad": two_mib}), "n0")
    assert r.status_code == 422  # an inventory of many copies is more than 1 MiB


def _run_limit(headers, n_chunks=1000):
    """BodyLimit in front of an app that reads its whole body: (chunks the client was asked for, answer)."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from statebudget.api.inputs import BodyLimit

    async def app(scope, receive, send):
        await Request(scope, receive).body()
        await JSONResponse({"read": True})(scope, receive, send)

    reads, sent = 0, []

    async def receive():
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": reads < n_chunks}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/events", "headers": headers}
    asyncio.run(BodyLimit(app)(scope, receive, send))
    return reads, sent[0]["status"], json.loads(sent[1]["body"])


def test_the_limit_reads_nothing_of_a_declared_oversize_body_and_stops_a_stream_at_the_limit():
    reads, status, body = _run_limit([(b"content-length", str(1000 * 65536).encode())])
    assert (reads, status) == (0, 413) and "detail" in body
    reads, status, body = _run_limit([(b"transfer-encoding", b"chunked")])
    assert (reads, status) == (MIB // 65536 + 1, 413)  # the chunk that passed 1 MiB, and no further
    assert _run_limit([], n_chunks=4)[1:] == (200, {"read": True})


def test_a_422_never_echoes_more_than_an_excerpt(client):
    r = send(client, "POST", "/v1/events", json.dumps({"type": "program_started", "program": "x" * 900_000}), "a")
    err = only_error(r, ["body", "program"])
    assert len(r.content) < 1_000 and len(err["input"]) <= 201
    # a 2 MB body that fails as a whole: the body (the error's input) is not echoed at all
    r = send(client, "POST", "/v1/oracle/runs", json.dumps({"preset": "swe-team", "trace_jsonl": "y" * 2_000_000}), "admin")
    assert r.status_code == 422 and len(r.content) < 1_000 and "input" not in r.json()["detail"][0]
    # a message that quotes the request (a duplicate model name of 1 MB) is cut too
    cat = {"models": [{"name": "m" * (MIB // 2), "version": "v", "weights_gb": 1, "kv_bytes_per_token": 1,
                       "active_params_b": 1}] * 2}
    r = send(client, "PUT", "/v1/cluster", json.dumps({"cluster": load_cluster("toy2").model_dump(), "catalog": cat}),
             "admin")
    assert r.status_code == 422 and "duplicate" in r.text and len(r.content) < 1_000
    # many errors: the first 20 and a count of the rest
    r = send(client, "POST", "/v1/events", json.dumps({**CALL, "after": ["\u202e"] * 1000}), "a")
    detail = r.json()["detail"]
    assert r.status_code == 422 and len(detail) == 21 and "980 more" in detail[-1]["msg"] and len(r.content) < 10_000


# ---- ids and text -----------------------------------------------------------------------------------------
BAD_CHARS = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200f", "\x00", "\x1b", "\x7f", "\u200b", "\ufeff",
             "\u2028", "\U000e0001"]


@pytest.mark.parametrize("ch", BAD_CHARS, ids=[f"U+{ord(c):04X}" for c in BAD_CHARS])
def test_an_id_with_a_control_bidi_or_format_character_is_a_422_that_escapes_it(client, ch):
    cases = [("POST", "/v1/events", "a", {"type": "program_started", "program": f"p{ch}2"}, "program")]
    cases += [("POST", "/v1/events", "a", {**CALL, f: f"x{ch}"}, f) for f in ("call", "model")]
    cases += [("POST", "/v1/events", "a", {"type": "tool_started", "program": "p1", "tool": "t", "call": "k",
                                          f: f"x{ch}"}, f) for f in ("tool", "thread", "effect")]
    cases += [("POST", "/v1/leases", "a", {**LEASE, f: f"x{ch}"}, f) for f in ("model", "cancel_token", "for_call")]
    cases += [("POST", "/v1/ops/op1", "n0", {"status": "done", "checksum": f"x{ch}"}, "checksum")]
    for method, path, who, body, field in cases:
        r = send(client, method, path, json.dumps(body), who)
        err = only_error(r, ["body", field])
        assert ch not in r.text and f"\\u{ord(ch):04x}" in err["input"] or ord(ch) > 0xFFFF, (field, r.text)
    only_error(send(client, "POST", "/v1/events", json.dumps({**CALL, "after": ["ok", f"x{ch}"]}), "a"),
               ["body", "after", 1])
    for path, params, who, loc in (("/v1/plan", {"node": f"n0{ch}"}, "n0", ["query", "node"]),
                                   ("/v1/queue", {"model": f"m{ch}"}, "a", ["query", "model"]),
                                   (f"/v1/leases/L{quote(ch)}", {}, "a", ["path", "lease_id"]),
                                   (f"/v1/oracle/runs/r{quote(ch)}", {}, "admin", ["path", "run_id"])):
        only_error(client.get(path, params=params, headers=H(who)), loc)
    only_error(send(client, "POST", f"/v1/ops/op{quote(ch)}", '{"status": "done"}', "n0"), ["path", "op_id"])


def test_an_inventory_takes_printable_ids_and_64_bit_versions_only(client):
    def inventory(obj, **kw):
        body = {"node": "n0", "copies": [{"object": obj, "tier": "gpu:0", **kw}]}
        return send(client, "PUT", "/v1/inventory", json.dumps(body), "n0")
    only_error(inventory(["w", "plan\u202ener"]), ["body", "copies", 0, "object", 1])
    only_error(inventory(["w", "planner"], version=2**64), ["body", "copies", 0, "version"])


def test_ids_have_a_length_limit(client):
    only_error(send(client, "POST", "/v1/events", json.dumps({**CALL, "call": "c" * 201}), "a"), ["body", "call"])
    only_error(client.get("/v1/plan", params={"node": "n" * 201}, headers=H("n0")), ["query", "node"])
    only_error(client.get("/v1/queue", params={"model": "m" * 201}, headers=H("a")), ["query", "model"])
    only_error(client.get(f"/v1/leases/{'L' * 201}", headers=H("a")), ["path", "lease_id"])
    only_error(send(client, "POST", "/v1/oracle/runs", json.dumps({"preset": "p" * 201}), "admin"), ["body", "preset"])
    assert send(client, "POST", "/v1/events", json.dumps({**CALL, "call": "c" * 200}), "a").status_code == 200


def test_printable_ids_in_any_script_are_taken(client):
    r = send(client, "POST", "/v1/events", json.dumps({**CALL, "call": "appel étape 2 — 調査"}), "a")
    assert r.status_code == 200 and r.json()["call"] == "appel étape 2 — 調査"


def test_an_op_error_is_free_text_cleaned_and_cut_never_refused(client):
    text = "engine said: \x1b[31mboom\x1b[0m\u202e\nline 2\t" + "x" * 20_000
    assert OpReport(status="failed", error=text).error.startswith("engine said: [31mboom[0m\nline 2\t")
    assert len(OpReport(status="failed", error=text).error) == 2_000
    r = send(client, "POST", "/v1/ops/no-such-op", json.dumps({"status": "failed", "error": text}), "n0")
    assert r.status_code == 404  # validated, then looked up (the old 10,000-character limit refused it)


def test_a_lease_that_may_not_start_before_its_deadline_is_a_422(client):
    r = send(client, "POST", "/v1/leases", json.dumps({**LEASE, "deadline_s": 10, "earliest_s": 20}), "a")
    err = only_error(r, ["body"])
    assert "earliest_s (20) is after deadline_s (10)" in err["msg"]
    assert send(client, "POST", "/v1/leases", json.dumps({**LEASE, "deadline_s": 10, "earliest_s": 10}), "a").status_code == 200


# ---- docs -----------------------------------------------------------------------------------------------
def test_docs_are_off_by_default(client):
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert client.get(path).status_code == 404 and client.get(path, headers=H("admin")).status_code == 404


def _no_other_host(page: str):
    assert not re.search(r"https?:|//[\w.-]", page.replace("</", "")), re.findall(r".{40}(?:https?:|//).{40}", page)
    for attr in re.findall(r'(?:src|href|action)="([^"]*)"', page):
        assert attr.startswith(("#", "/")) and not attr.startswith("//"), attr


def test_with_docs_on_the_pages_load_nothing_from_another_host_and_need_an_admin_token(docs_client):
    c = docs_client
    form = c.get("/docs")
    assert form.status_code == 200 and "/v1/events" not in form.text and 'name="token"' in form.text
    page = c.get("/docs", headers=H("admin"))
    assert page.status_code == 200 and "/v1/events" in page.text and "EventCreate" in page.text
    assert c.post("/docs", data={"token": TOK["admin"]}).text == page.text
    for r in (form, page):
        _no_other_host(r.text)
        assert "default-src 'none'" in r.headers["content-security-policy"] and "<script" not in r.text
    assert c.post("/docs", data={"token": TOK["a"]}).status_code == 403
    assert c.post("/docs", data={"token": "not-a-token-at-all-0123"}).status_code == 401
    assert c.get("/docs", headers={"Authorization": "Bearer not-a-token-at-all-0123"}).status_code == 401
    assert c.get("/openapi.json").status_code == 401
    assert c.get("/openapi.json", headers=H("a")).status_code == 403
    r = c.get("/openapi.json", headers=H("admin"))
    assert r.status_code == 200 and "/v1/events" in r.json()["paths"] and "/docs" not in r.json()["paths"]
    assert c.get("/redoc", headers=H("admin")).status_code == 404


def test_serve_has_a_docs_flag():
    from typer.testing import CliRunner

    from statebudget.cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "--docs" in out.output
