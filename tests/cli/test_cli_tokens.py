"""The token commands (add, list, remove) and how the commands that need a token get it: from a
file or the environment, never only from the command line."""

import json
import time

import pytest
from typer.testing import CliRunner

from statebudget.api.auth import Auth, digest
from statebudget.cli import app

from tests.cli.test_cli_input_errors import assert_clean_error

runner = CliRunner()  # click 8.2 keeps stdout and stderr apart (output: both)


def add(path, *args, **kw):
    return runner.invoke(app, ["token", "add", "--tokens", str(path), *args], **kw)


def test_token_add_prints_the_secret_once_and_the_file_keeps_its_digest(tmp_path):
    path = tmp_path / "t.json"
    res = add(path, "--role", "runtime", "--tenant", "team-a")
    assert res.exit_code == 0, res.output
    secret = res.stdout.strip()
    assert len(secret) >= 40 and "\n" not in secret  # stdout is the secret alone, for $(...)
    assert secret not in res.stderr and digest(secret)[:12] in res.stderr
    assert secret not in path.read_text()
    assert json.loads(path.read_text())["tokens"] == [{"sha256": digest(secret), "role": "runtime", "tenant": "team-a"}]
    assert Auth.load(path).principal(secret).tenant == "team-a"


def test_token_add_out_writes_the_secret_to_a_private_file_and_prints_none(tmp_path):
    path, out = tmp_path / "t.json", tmp_path / "n0.token"
    res = add(path, "--role", "adapter", "--node", "n0", "--out", str(out))
    assert res.exit_code == 0, res.output
    secret = out.read_text().strip()
    assert res.stdout == "" and secret not in res.stderr and str(out) in res.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert Auth.load(path).principal(secret).node == "n0"


def test_token_list_shows_scope_and_expiry_but_no_secret(tmp_path):
    path = tmp_path / "t.json"
    runtime = add(path, "--role", "runtime", "--tenant", "team-a").stdout.strip()
    adapter = add(path, "--role", "adapter", "--node", "n1", "--id", "gpu-host-1", "--expires-in", "30d").stdout.strip()
    res = runner.invoke(app, ["token", "list", "--tokens", str(path)])
    assert res.exit_code == 0, res.output
    assert runtime not in res.stdout and adapter not in res.stdout
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if line.count("│") > 3}
    assert set(rows) == {digest(runtime)[:12], "gpu-host-1"}
    assert "runtime" in rows[digest(runtime)[:12]] and "team-a" in rows[digest(runtime)[:12]]
    expiry = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 30 * 86400))
    assert "n1" in rows["gpu-host-1"] and expiry in rows["gpu-host-1"] and "never" in rows[digest(runtime)[:12]]


@pytest.mark.parametrize("value, seconds", [("30d", 30 * 86400), ("12h", 43200), ("3600s", 3600), ("90", 90)])
def test_expires_in_stores_unix_time(tmp_path, value, seconds):
    path = tmp_path / "t.json"
    before = time.time()
    assert add(path, "--role", "admin", "--expires-in", value).exit_code == 0
    expires_s = json.loads(path.read_text())["tokens"][0]["expires_s"]
    assert before + seconds - 1 <= expires_s <= time.time() + seconds + 1


def test_bad_expiry_and_bad_names_are_refused_before_the_file_is_touched(tmp_path):
    path = tmp_path / "t.json"
    assert_clean_error(add(path, "--role", "admin", "--expires-in", "soon"), "--expires-in 'soon'", "30d")
    assert_clean_error(add(path, "--role", "admin", "--expires-in", "0"), "--expires-in '0'")
    assert_clean_error(add(path, "--role", "runtime", "--tenant", "team#a"), "--tenant: tenant 'team#a'")
    assert_clean_error(add(path, "--role", "king"), "--role: Input should be 'runtime', 'adapter' or 'admin'")
    assert_clean_error(add(path, "--role", "adapter", "--node", "bad node"), "node 'bad node'")
    assert_clean_error(add(path, "--role", "adapter"), "an adapter token needs a node")
    assert not path.exists()


def test_token_add_with_cluster_refuses_a_node_the_cluster_lacks(tmp_path):
    path = tmp_path / "t.json"
    res = add(path, "--role", "adapter", "--node", "n9", "--cluster", "toy2")
    assert_clean_error(res, "--node 'n9'", "toy2", "n0, n1")
    assert not path.exists()
    assert add(path, "--role", "adapter", "--node", "n1", "--cluster", "toy2").exit_code == 0


def test_token_remove_by_secret_or_by_listed_id_and_an_unknown_one_changes_nothing(tmp_path):
    path = tmp_path / "t.json"
    admin = add(path, "--role", "admin").stdout.strip()
    runtime = add(path, "--role", "runtime", "--tenant", "a").stdout.strip()
    other = add(path, "--role", "runtime", "--tenant", "b").stdout.strip()
    before = path.read_bytes()
    res = runner.invoke(app, ["token", "remove", "--tokens", str(path), "not-a-token-0123456789"])
    assert_clean_error(res, str(path), "no token here matches")
    assert path.read_bytes() == before
    res = runner.invoke(app, ["token", "remove", "--tokens", str(path), runtime])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["token", "remove", "--tokens", str(path), digest(other)[:12]])
    assert res.exit_code == 0 and digest(other)[:12] in res.stdout, res.output
    auth = Auth.load(path)
    assert auth.principal(runtime) is None and auth.principal(other) is None and auth.principal(admin).role == "admin"
    assert_clean_error(runner.invoke(app, ["token", "remove", "--tokens", str(tmp_path / "none.json"), admin]),
                       "none.json", "no such token file")


def test_an_old_file_with_clear_tokens_is_listed_without_them(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"tokens": [{"token": "old-clear-admin-0123456789", "role": "admin"}]}))
    res = runner.invoke(app, ["token", "list", "--tokens", str(path)])
    assert res.exit_code == 0 and "old-clear-admin" not in res.stdout and "clear" in res.stdout
    assert "stored in clear" in res.stderr


@pytest.mark.parametrize("cmd", [
    ["residency", "--planner", "http://127.0.0.1:9"],
    ["adapter", "local", "--planner", "http://127.0.0.1:9", "--node", "n0"],
    ["drive", "--planner", "http://127.0.0.1:9", "--trace", "t.jsonl"],
])
def test_a_command_without_a_token_says_where_one_comes_from(cmd):
    res = runner.invoke(app, cmd, env={"STATEBUDGET_TOKEN": "", "STATEBUDGET_TOKEN_FILE": ""})
    assert_clean_error(res, "no token", "--token-file", "STATEBUDGET_TOKEN")


def test_the_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    import httpx

    seen = []

    def get(url, headers=None, **kw):
        seen.append(headers["Authorization"])
        return httpx.Response(401, json={"detail": "unknown bearer token"}, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", get)
    (tmp_path / "admin.token").write_text("from-the-file-0123456789\n")
    base = ["residency", "--planner", "http://127.0.0.1:9"]
    runner.invoke(app, base + ["--token-file", str(tmp_path / "admin.token")])
    runner.invoke(app, base, env={"STATEBUDGET_TOKEN": "from-the-env-0123456789"})
    runner.invoke(app, base, env={"STATEBUDGET_TOKEN": "", "STATEBUDGET_TOKEN_FILE": str(tmp_path / "admin.token")})
    assert seen == ["Bearer from-the-file-0123456789", "Bearer from-the-env-0123456789",
                    "Bearer from-the-file-0123456789"]
    res = runner.invoke(app, base + ["--token", "x", "--token-file", str(tmp_path / "admin.token")])
    assert_clean_error(res, "not both")


def test_a_token_file_that_is_not_one_token_is_named(tmp_path):
    path = tmp_path / "t.json"
    add(path, "--role", "admin")
    base = ["residency", "--planner", "http://127.0.0.1:9", "--token-file"]
    assert_clean_error(runner.invoke(app, base + [str(path)]), str(path), "JSON token list", "--out")
    (tmp_path / "two").write_text("a\nb\n")
    assert_clean_error(runner.invoke(app, base + [str(tmp_path / "two")]), "two", "found 2 lines")
    (tmp_path / "bin").write_bytes(b"\x89PNG\r\n\xff")
    assert_clean_error(runner.invoke(app, base + [str(tmp_path / "bin")]), "bin:1", "not UTF-8")
    assert_clean_error(runner.invoke(app, base + [str(tmp_path / "none")]), "none", "no such token file")
