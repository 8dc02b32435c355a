"""GET and PUT /v1/layout: the operator's layout, for admin tokens, in the shapes a `--layout`
file takes; a bad one is named and changes nothing."""

from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner
from tests.api import test_api

client = test_api.client  # the fixture: a service with admin, runtime and adapter tokens
H = test_api.H


def test_an_admin_puts_a_layout_in_either_file_shape_and_reads_it_back(client):
    assert client.get("/v1/layout", headers=H("admin")).json() == {"homes": {}, "holds": False}
    r = client.put("/v1/layout", json={"homes": {"reviewer": [1]}, "holds": True}, headers=H("admin"))
    assert r.status_code == 200 and r.json() == {"homes": {"reviewer": [1]}, "holds": True}
    searched = {"cluster": "toy2", "catalog": "toy", "kept": [["planner", [0]]],
                "tried": [{"layout": None, "acceptable": True}]}
    r = client.put("/v1/layout", json=searched, headers=H("admin"))  # what `statebudget layout --json` wrote
    assert r.json() == {"homes": {"planner": [0]}, "holds": False}
    assert client.get("/v1/layout", headers=H("admin")).json() == {"homes": {"planner": [0]}, "holds": False}
    assert client.put("/v1/layout", json={"homes": {}}, headers=H("admin")).json() == {"homes": {}, "holds": False}
    assert client.put("/v1/layout", json={"kept": None}, headers=H("admin")).json() == {"homes": {}, "holds": False}
    r = client.put("/v1/layout", json={"kept": None, "holds": True}, headers=H("admin"))
    assert r.json() == {"homes": {}, "holds": False}, "no layout holds nothing"


def test_a_layout_put_is_kept_by_the_ledger(client, tmp_path):
    client.put("/v1/layout", json={"homes": {"reviewer": [1]}}, headers=H("admin"))
    again = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))  # a restart
    assert again.layout == (("reviewer", (1,)),)


def test_a_bad_layout_is_named_and_nothing_changes(client):
    client.put("/v1/layout", json={"homes": {"reviewer": [1]}}, headers=H("admin"))
    for body, detail in [({"homes": {"reviewer": [9]}}, "homes[0]: reviewer (tp 1) cannot run on GPUs (9,)"),
                         ({"homes": {"reviewer": "1"}}, "body:homes.reviewer: expected a list of GPU indices"),
                         ({"homes": {}, "kept": None}, "both `homes:` and `kept:`"),
                         ({"layout": {}}, "expected `homes:`"),
                         ({"homes": {"nope": [0]}}, "no model 'nope'"),
                         ({"kept": [["reviewer", [1]]], "cluster": "hetero16"},
                          "body:cluster: a layout found on 'hetero16'; the planner runs cluster 'toy2'"),
                         ({"kept": [["reviewer", [1]]], "catalog": "agent-team"}, "body:catalog:"),
                         ({"homes": {"reviewer": [1]}, "holds": "yes"}, '"loc":["body","holds"]')]:
        r = client.put("/v1/layout", json=body, headers=H("admin"))
        assert r.status_code == 422 and (detail in r.text or detail in r.text.replace(" ", "")), (body, r.text)
    assert client.get("/v1/layout", headers=H("admin")).json() == {"homes": {"reviewer": [1]}, "holds": False}


def test_only_admins_see_or_change_the_layout(client):
    for who in ("a", "n0"):
        assert client.get("/v1/layout", headers=H(who)).status_code == 403
        assert client.put("/v1/layout", json={"homes": {}}, headers=H(who)).status_code == 403
