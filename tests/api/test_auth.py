"""Bearer tokens: the token file keeps digests, every request sees its changes (a removed token is
refused at once), expiry, the scope of an entry, and an adapter token for a node the cluster lacks."""

import json
import os

import pytest
from fastapi.testclient import TestClient

from statebudget.api.app import create_app
from statebudget.api.auth import (Auth, TokenEntry, add_token, create_token_file, digest, find_token, read_tokens,
                                  remove_token)
from statebudget.models.errors import InputError
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.ledger import Store
from statebudget.service.live import LivePlanner


def app_client(tmp_path, auth):
    planner = LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"))
    return TestClient(create_app(planner, auth, planning_loop=False))


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "tokens.json"
    admin = create_token_file(path)
    runtime = add_token(path, "runtime", tenant="team-a")
    return path, admin, runtime


def test_a_removed_token_is_refused_on_the_very_next_request(tmp_path, token_file):
    path, admin, runtime = token_file
    with app_client(tmp_path, Auth.load(path)) as c:
        assert c.get("/v1/queue", headers=bearer(runtime)).status_code == 200
        remove_token(path, runtime)
        # no unknown token in between: the change is seen because the file changed, not on a miss
        r = c.get("/v1/queue", headers=bearer(runtime))
        assert r.status_code == 401 and r.json()["detail"] == "unknown bearer token"
        assert c.get("/v1/residency", headers=bearer(admin)).status_code == 200


def test_an_edit_in_place_of_the_same_size_is_seen_by_its_mtime(tmp_path):
    path = tmp_path / "tokens.json"
    secret = "runtime-secret-0123456789"
    entry = {"sha256": digest(secret), "role": "runtime", "tenant": "team-a"}
    path.write_text(json.dumps({"tokens": [entry]}))
    auth = Auth.load(path)
    assert auth.principal(secret).tenant == "team-a"
    st = path.stat()
    with open(path, "r+") as f:  # same inode, same size: only the mtime tells
        f.write(json.dumps({"tokens": [dict(entry, tenant="team-b")]}))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert path.stat().st_size == st.st_size and path.stat().st_ino == st.st_ino
    assert auth.principal(secret).tenant == "team-b"


def test_a_file_broken_mid_edit_keeps_the_tokens_read_last_until_it_parses_again(token_file):
    path, admin, runtime = token_file
    auth = Auth.load(path)
    good = path.read_text()
    path.write_text("{ broken")
    assert auth.principal(runtime).role == "runtime" and auth.principal(admin).role == "admin"
    path.write_text(good.replace(digest(runtime), digest("another-secret-0123456789")))
    assert auth.principal(runtime) is None and auth.principal(admin).role == "admin"


def test_the_file_holds_digests_and_no_secret(token_file):
    path, admin, runtime = token_file
    text = path.read_text()
    assert admin not in text and runtime not in text
    assert [e["sha256"] for e in json.loads(text)["tokens"]] == [digest(admin), digest(runtime)]
    assert all("token" not in e for e in json.loads(text)["tokens"])
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    auth = Auth.load(path)
    assert auth.principal(admin).role == "admin" and auth.principal(runtime).tenant == "team-a"


def test_a_file_with_clear_tokens_still_loads_and_is_rewritten_as_digests(tmp_path):
    path = tmp_path / "tokens.json"
    old = "old-style-admin-0123456789"
    path.write_text(json.dumps({"tokens": [{"token": old, "role": "admin"}]}))
    auth = Auth.load(path)
    assert auth.principal(old).role == "admin"
    new = add_token(path, "adapter", node="n0")
    assert old not in path.read_text() and new not in path.read_text()
    assert auth.principal(old).role == "admin" and auth.principal(new).node == "n0"


def test_an_expired_token_is_refused_with_401_token_expired(tmp_path):
    now = 1_700_000_000.0
    auth = Auth([TokenEntry(token="expired-runtime-0123456789", role="runtime", tenant="t", expires_s=now - 1),
                 TokenEntry(token="current-runtime-0123456789", role="runtime", tenant="t", expires_s=now + 60)],
                clock=lambda: now)
    with app_client(tmp_path, auth) as c:
        r = c.get("/v1/queue", headers=bearer("expired-runtime-0123456789"))
        assert r.status_code == 401 and r.json()["detail"] == "token expired"
        assert r.headers["www-authenticate"] == "Bearer"
        assert c.get("/v1/queue", headers=bearer("current-runtime-0123456789")).status_code == 200


def test_an_adapter_token_for_a_node_the_cluster_lacks_gets_403_naming_it(tmp_path):
    auth = Auth([TokenEntry(token="adapter-n9-0123456789", role="adapter", node="n9"),
                 TokenEntry(token="adapter-n0-0123456789", role="adapter", node="n0")])
    with app_client(tmp_path, auth) as c:
        r = c.get("/v1/plan", params={"node": "n9", "after": 0}, headers=bearer("adapter-n9-0123456789"))
        assert r.status_code == 403
        assert "'n9'" in r.json()["detail"] and "toy2" in r.json()["detail"] and "n0, n1" in r.json()["detail"]
        r = c.post("/v1/ops/op-1", json={"status": "done"}, headers=bearer("adapter-n9-0123456789"))
        assert r.status_code == 403 and "'n9'" in r.json()["detail"]
        assert c.get("/v1/plan", params={"node": "n0", "after": 0},
                     headers=bearer("adapter-n0-0123456789")).status_code == 200


@pytest.mark.parametrize("entry, msg", [
    ({"sha256": "ab" * 32, "role": "runtime", "tenant": "team#a"}, "tenant 'team#a'"),
    ({"sha256": "ab" * 32, "role": "runtime", "tenant": "team a"}, "tenant 'team a'"),
    ({"sha256": "ab" * 32, "role": "adapter", "node": "x" * 201}, "node 'xxx"),
    ({"sha256": "AB" * 32, "role": "admin"}, "64 lowercase hex digits"),
    ({"sha256": "ab" * 32, "token": "clear-and-hashed-0123", "role": "admin"}, "exactly one of sha256"),
    ({"role": "admin"}, "exactly one of sha256"),
    ({"sha256": "ab" * 32, "role": "runtime"}, "a runtime token needs a tenant"),
])
def test_an_entry_out_of_scope_is_refused_naming_the_field(tmp_path, entry, msg):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [entry]}))
    with pytest.raises(InputError) as e:
        Auth.load(path)
    assert str(path) in str(e.value) and msg in str(e.value)


def test_tenant_and_node_take_the_printable_id_pattern(tmp_path):
    e = TokenEntry(sha256="ab" * 32, role="runtime", tenant="org/team-a.dev@x:1+2_3")
    assert e.tenant == "org/team-a.dev@x:1+2_3"


def test_a_token_is_found_by_secret_id_or_digest_prefix_and_an_unknown_one_leaves_the_file(token_file):
    path, admin, runtime = token_file
    add_token(path, "admin", id="ops")
    entries = read_tokens(path)
    assert find_token(entries, runtime, "f").tenant == "team-a"
    assert find_token(entries, digest(runtime)[:12], "f").tenant == "team-a"
    assert find_token(entries, "ops", "f").id == "ops"
    with pytest.raises(InputError, match="no token here matches"):
        find_token(entries, digest(runtime)[:7], "f")  # under 8 hex digits is no prefix
    twins = [TokenEntry(sha256="ab" * 32, role="admin"), TokenEntry(sha256="ab" * 31 + "cd", role="admin")]
    with pytest.raises(InputError, match="names 2 tokens"):
        find_token(twins, "abababab", "f")
    assert find_token(twins, "ab" * 31 + "c", "f") is twins[1]
    before = path.read_bytes()
    with pytest.raises(InputError, match="no token here matches"):
        remove_token(path, "not-a-token-0123456789")
    assert path.read_bytes() == before
    assert remove_token(path, "ops").id == "ops" and remove_token(path, admin).role == "admin"
    with pytest.raises(InputError, match="last token"):
        remove_token(path, runtime)
    assert [e.tenant for e in read_tokens(path)] == ["team-a"]


def test_an_undecodable_token_file_is_named(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_bytes(b'{"tokens": [\n\xff\xfe]}')
    with pytest.raises(InputError) as e:
        Auth.load(path)
    assert str(e.value).startswith(f"{path}:2:") and "not UTF-8" in str(e.value)
