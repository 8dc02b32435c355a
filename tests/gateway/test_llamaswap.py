"""Reading a llama-swap config.yaml into a GatewayConfig (statebudget/gateway/llamaswap.py)."""

from __future__ import annotations

import shlex
import textwrap

import pytest
import yaml

from statebudget.gateway.config import EngineSpec, GatewayConfig
from statebudget.gateway.llamaswap import convert_llama_swap, from_llama_swap, notes, read_llama_swap
from statebudget.models.errors import InputError

# A config as a llama-swap user writes it (shapes from llama-swap's config.example.yaml).
CONFIG = textwrap.dedent("""\
    healthCheckTimeout: 500
    logLevel: info
    startPort: 10001
    globalTTL: 300
    includeAliasesInList: true
    macros:
      "latest-llama": >
        /opt/llama.cpp/llama-server --port ${PORT}
      "default_ctx": 4096
      "default_args": "--ctx-size ${default_ctx}"
      "fa": on
    models:
      "qwen-coder":
        macros:
          "default_ctx": 32768
          "temp": 1.0
        cmd: |
          # ${latest-llama} is a macro defined above
          ${latest-llama}
          --model /models/Qwen3-Coder-30B.gguf
          ${default_args} -fa ${fa}
          # --temp 0.7   (a comment inside the command)
          --temp ${temp} \\
          --alias "${MODEL_ID}"
        env:
          - "CUDA_VISIBLE_DEVICES=2,3"
          - "LLAMA_ARG_THREADS=8"
        aliases:
          - "gpt-4o-mini"
          - {id: "coder", name: "Coder", unlisted: true}
        ttl: 0
        concurrencyLimit: 4
        filters:
          stripParams: "temperature, top_p"
          setParamsByID:
            "${MODEL_ID}:low": {chat_template_kwargs: {reasoning_effort: low}}
      "docker-vllm":
        name: "Qwen3 8B on vLLM"
        proxy: "http://127.0.0.1:${PORT}"
        cmd: |
          docker run --init --rm --name ${MODEL_ID}
            --gpus '"device=1"' -p ${PORT}:8000
            vllm/vllm-openai --model Qwen/Qwen3-8B
        cmdStop: docker stop ${MODEL_ID}
        useModelName: "Qwen/Qwen3-8B"
        checkEndpoint: none
      "embed":
        cmd: llama-server --port 9090 -m /models/bge-m3.gguf --embeddings
        proxy: http://127.0.0.1:9090
        checkEndpoint: /v1/models
        ttl: 60
      "assistant":
        cmd: ${latest-llama} -m /models/llama-3.2-3b.gguf ${default_args}
        unlisted: true
    groups:
      "coding":
        swap: true
        members: ["qwen-coder"]
      "helpers":
        swap: false
        exclusive: false
        members: ["docker-vllm", "embed", "assistant"]
    hooks:
      on_startup:
        preload: ["coder"]
    """)


@pytest.fixture
def cfg(tmp_path) -> GatewayConfig:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return from_llama_swap(path, node="n1")


def by_model(config: GatewayConfig) -> dict:
    return {e.model: e for e in config.engines}


def one(text: str, **kw):
    """The only engine of an inline config, in the same dedented shape as CONFIG."""
    return convert_llama_swap(yaml.safe_load(textwrap.dedent(text)), **kw).engines[0]


def test_ports_are_handed_out_in_sorted_order_of_model_ids_to_models_whose_cmd_uses_port(cfg):
    e = by_model(cfg)
    # sorted: assistant, docker-vllm, embed (no ${PORT}: no port), qwen-coder
    assert (e["assistant"].port, e["docker-vllm"].port, e["embed"].port, e["qwen-coder"].port) == \
        (10001, 10002, None, 10003)
    assert e["assistant"].url == "http://localhost:10001"  # llama-swap's default proxy
    assert e["docker-vllm"].url == "http://127.0.0.1:10002"
    assert e["embed"].url == "http://127.0.0.1:9090"
    assert [x.model for x in cfg.engines] == ["qwen-coder", "docker-vllm", "embed", "assistant"]  # file order


def test_multiline_cmd_loses_comments_and_gets_macros_and_port(cfg):
    coder = by_model(cfg)["qwen-coder"]
    argv = ["/opt/llama.cpp/llama-server", "--port", "10003", "--model", "/models/Qwen3-Coder-30B.gguf",
            "--ctx-size", "32768", "-fa", "on", "--temp", "1", "--alias", "qwen-coder"]
    assert shlex.split(coder.cmd) == argv and coder.cmd == shlex.join(argv)
    # the model's default_ctx replaced the global one inside the global default_args; 1.0 prints as Go's
    # %v prints it; `on` stays a string (YAML 1.2 as llama-swap reads it); MODEL_ID is the model's ID
    docker = by_model(cfg)["docker-vllm"]
    assert shlex.split(docker.cmd) == ["docker", "run", "--init", "--rm", "--name", "docker-vllm", "--gpus",
                                       '"device=1"', "-p", "10002:8000", "vllm/vllm-openai", "--model",
                                       "Qwen/Qwen3-8B"]
    assert "${" not in by_model(cfg)["assistant"].cmd


def test_each_model_maps_onto_an_engine_spec(cfg):
    e = by_model(cfg)
    coder, docker, embed, assistant = e["qwen-coder"], e["docker-vllm"], e["embed"], e["assistant"]
    assert coder.aliases == ["gpt-4o-mini", "coder", "qwen-coder:low"]  # setParamsByID keys become aliases
    assert coder.env == {"CUDA_VISIBLE_DEVICES": "2,3", "LLAMA_ARG_THREADS": "8"}
    assert coder.gpus == [2, 3]  # from CUDA_VISIBLE_DEVICES
    assert docker.gpus == [1]  # from docker's --gpus device=1
    assert embed.gpus == [1] and assistant.gpus == [1]  # the index of their group, "helpers"
    assert coder.ttl_s is None  # ttl 0: never unloaded
    assert embed.ttl_s == 60 and assistant.ttl_s == 300 and docker.ttl_s == 300  # absent: globalTTL
    assert coder.max_inflight == 4 and assistant.max_inflight == EngineSpec.model_fields["max_inflight"].default
    assert docker.upstream_model == "Qwen/Qwen3-8B" and coder.upstream_model is None
    assert docker.check_path == "" and embed.check_path == "/v1/models" and coder.check_path == "/health"
    assert {x.node for x in cfg.engines} == {"n1"}
    assert cfg.timeout_s == 500
    assert cfg.resolve("coder") == "qwen-coder" and cfg.resolve("qwen-coder:low") == "qwen-coder"


def test_notes_name_each_setting_kept_for_reference_or_ignored():
    got = notes(yaml.safe_load(CONFIG))
    assert "logLevel=info: ignored: llama-swap's own logging, metrics or UI setting" in got
    assert any(n.startswith("globalTTL=300: kept as each model's ttl_s") for n in got)
    assert any(n.startswith("includeAliasesInList=true: ignored") for n in got)
    assert ("group 'coding': swap=true, exclusive=true, persistent=false is the planner's job now; "
            "its members get gpus [0] unless their env or cmd names their devices") in got
    assert any(n.startswith("group 'helpers': swap=false, exclusive=false, persistent=false") for n in got)
    assert any(n.startswith("hooks.on_startup.preload ['coder']: ignored") for n in got)
    assert any(n.startswith("model 'qwen-coder': ttl=0: kept as ttl_s") for n in got)
    assert any(n.startswith("model 'qwen-coder': filters: ignored") for n in got)
    assert any(n.startswith("model 'docker-vllm': cmdStop=docker stop ${MODEL_ID}: ignored") for n in got)
    assert any(n.startswith("model 'docker-vllm': name=Qwen3 8B on vLLM: ignored") for n in got)
    assert any(n.startswith("model 'assistant': unlisted=true: ignored") for n in got)
    assert not any(n.startswith(("healthCheckTimeout", "startPort", "macros", "model 'embed': proxy")) for n in got)
    assert notes({"apiKeys": ["sk-secret"], "peers": {}})[0].startswith("apiKeys: not carried over")
    assert "sk-secret" not in " ".join(notes({"apiKeys": ["sk-secret"]}))


def test_minimal_config_uses_llama_swaps_defaults():
    raw = yaml.safe_load("models:\n  b: {cmd: 'srv --port ${PORT}'}\n  a: {cmd: 'srv --port ${PORT}'}\n")
    cfg = convert_llama_swap(raw)
    a, b = by_model(cfg)["a"], by_model(cfg)["b"]
    assert (a.port, b.port) == (5800, 5801)
    assert a.url == "http://localhost:5800" and a.cmd == "srv --port 5800"
    assert a.check_path == "/health" and a.ttl_s is None and a.gpus == [0] and a.aliases == []
    assert cfg.timeout_s == 120.0  # no healthCheckTimeout given: llama-swap waits 120 s for a model


def test_null_settings_are_unset_as_in_llama_swap():
    e = one("""
        models:
          m: {cmd: "srv --port ${PORT}", proxy: null, ttl: null, env: null, aliases: null, checkEndpoint: ~}
        """)
    assert (e.url, e.ttl_s, e.env, e.aliases, e.check_path) == ("http://localhost:5800", None, {}, [], "/health")


def test_a_port_in_a_comment_line_takes_no_port():
    e = one("""
        models:
          m:
            cmd: |
              # was: --port ${PORT}
              srv --port 7000
            proxy: http://127.0.0.1:7000
        """)
    assert e.port is None and e.cmd == "srv --port 7000"


def test_go_formatting_of_macro_values():
    e = one("""
        macros: {big: 1000000.0, small: 0.00001, whole: 100000.0, t: 0.7, flag: true, n: 16384}
        models:
          m: {cmd: "srv --port ${PORT} ${big} ${small} ${whole} ${t} ${flag} ${n}"}
        """)
    assert shlex.split(e.cmd)[3:] == ["1e+06", "1e-05", "100000", "0.7", "true", "16384"]


def test_macros_and_port_reach_env_and_use_model_name_as_in_newer_llama_swap():
    e = one("""
        macros: {gpus: "1,2", repo: Qwen}
        models:
          m:
            cmd: "srv --port ${PORT}"
            env: ["CUDA_VISIBLE_DEVICES=${gpus}", "SELF=http://localhost:${PORT}/${MODEL_ID}"]
            useModelName: "${repo}/${MODEL_ID}"
        """)
    assert e.env == {"CUDA_VISIBLE_DEVICES": "1,2", "SELF": "http://localhost:5800/m"} and e.gpus == [1, 2]
    assert e.upstream_model == "Qwen/m"


def test_env_macros_are_replaced_first(monkeypatch):
    monkeypatch.setenv("LS_MODELS", "/srv/models")
    e = one("""
        macros: {dir: "${env.LS_MODELS}/gguf"}
        models:
          m: {cmd: "srv --port ${PORT} -m ${dir}/a.gguf", env: ["HF_HOME=${env.LS_MODELS}"]}
        """)
    assert e.cmd == "srv --port 5800 -m /srv/models/gguf/a.gguf" and e.env == {"HF_HOME": "/srv/models"}


@pytest.mark.parametrize(("env", "cmd", "gpus"), [
    (["CUDA_VISIBLE_DEVICES=4,5"], "srv --port ${PORT} --device CUDA1", [5]),  # --device within visible
    ([], "srv --port ${PORT} --device CUDA0,CUDA2", [0, 2]),
    ([], "srv --port ${PORT} -dev=ROCm1", [1]),
    ([], "docker run --gpus device=2,3 -p ${PORT}:80 img", [2, 3]),
    (["CUDA_VISIBLE_DEVICES=GPU-8a1f"], "srv --port ${PORT} --device CUDA0", [1]),  # not integers: group
    ([], "srv --port ${PORT} --device CUDA0 --device-draft CUDA1 --device CUDA1", [1]),  # two: group
    ([], "docker run --gpus all -p ${PORT}:80 img", [1]),
    ([], "srv --port ${PORT} --tensor-split 1,1 --main-gpu 0", [1]),
])
def test_gpu_rules(env, cmd, gpus):
    raw = yaml.safe_load(textwrap.dedent("""
        models: {other: {cmd: "x --port ${PORT}"}}
        groups: {first: {members: [other]}, second: {members: [m]}}
        """))
    raw["models"]["m"] = {"cmd": cmd, "env": env}
    assert by_model(convert_llama_swap(raw))["m"].gpus == gpus


def test_groups_under_routing_are_read_too():
    raw = yaml.safe_load(textwrap.dedent("""
        models: {a: {cmd: "x --port ${PORT}"}, b: {cmd: "y --port ${PORT}"}}
        routing:
          router:
            use: group
            settings:
              groups: {one: {members: [a]}, two: {members: [b]}}
        """))
    assert by_model(convert_llama_swap(raw))["b"].gpus == [1]
    assert any(n.startswith("group 'two':") for n in notes(raw))


def test_health_check_timeout_has_llama_swaps_minimum():
    raw = yaml.safe_load("healthCheckTimeout: 5\nmodels: {m: {cmd: 'x --port ${PORT}'}}")
    assert convert_llama_swap(raw).timeout_s == 15


BASE = {"models": {"coder": {"cmd": "srv --port ${PORT}"}}}


def with_(top=None, **model):
    return {**BASE, **(top or {}), "models": {"coder": {"cmd": "srv --port ${PORT}", **model}}}


@pytest.mark.parametrize(("raw", "where", "what"), [
    ({**BASE, "startPrt": 9000}, "startPrt", "unknown key"),
    (with_(cmdd="x"), "models.coder.cmdd", "unknown key"),
    (with_(filters={"stripParam": "x"}), "models.coder.filters.stripParam", "unknown key"),
    (with_(timeouts={"conect": 3}), "models.coder.timeouts.conect", "unknown key"),
    (with_({"groups": {"g": {"member": ["coder"]}}}), "groups.g.member", "unknown key"),
    (with_({"hooks": {"on_start": {}}}), "hooks.on_start", "unknown key"),
    (with_({"routing": {"router": {"setings": {}}}}), "routing.router.setings", "unknown key"),
    ({"models": {"coder": {"proxy": "http://h:1"}}}, "models.coder.cmd", "missing"),
    ({"models": {"coder": None}}, "models.coder.cmd", "missing"),
    (with_(cmd="srv --port ${PORT} ${foo}"), "models.coder.cmd", "unknown macro ${foo}"),
    (with_(checkEndpoint="/h/${nope}"), "models.coder.checkEndpoint", "unknown macro ${nope}"),
    (with_({"macros": {"b": "${a}", "a": "1"}}, cmd="srv ${PORT} ${b}"), "models.coder.cmd", "unknown macro ${a}"),
    (with_({"macros": {"a": "x${a}"}}), "macros.a", "refers to itself"),
    (with_({"macros": {"PORT": 1}}), "macros.PORT", "reserved name"),
    (with_({"macros": {"bad name": 1}}), "macros.bad name", "a macro name"),
    (with_(macros={"l": [1]}), "models.coder.macros.l", "a macro is a string, number or bool, not list"),
    (with_(cmd="srv --port 80"), "models.coder.proxy", "uses ${PORT} but cmd does not"),
    (with_(env=["NOEQUALS"]), "models.coder.env.0", 'expected "NAME=value"'),
    (with_(env=["A=${nope}"]), "models.coder.env.0", "unknown macro ${nope}"),
    (with_(env={"A": "1"}), "models.coder.env", "expected a list, got dict"),
    (with_(ttl=-5), "models.coder.ttl", "expected a whole number >= -1"),
    (with_(concurrencyLimit="4"), "models.coder.concurrencyLimit", "expected a whole number >= 0"),
    (with_(aliases=[{"name": "x"}]), "models.coder.aliases.0", "expected a model name"),
    (with_(cmd='srv --port ${PORT} "unclosed'), "models.coder.cmd", "cannot be split"),
    (with_({"groups": {"g": {"members": ["codr"]}}}), "groups.g.members.0", "'codr' is not a model"),
    (with_({"groups": {"g": {"members": ["coder"]}, "h": {"members": ["coder"]}}}), "groups.h.members.0",
     "already a member of group 'g'"),
    (with_({"groups": {"g": {"members": ["coder"]}}, "matrix": {"vars": {}}}), "groups", "not both"),
    (with_({"groups": {"g": {}}, "routing": {"router": {"settings": {"groups": {"h": {}}}}}}),
     "routing.router.settings.groups", "given at the top too"),
    ({"models": {"a": {"cmd": "x ${PORT}", "aliases": ["z"]}, "b": {"cmd": "y ${PORT}", "aliases": ["z"]}}},
     "models.b.aliases", "alias 'z' is taken by model 'a'"),
    ({"models": {"a": {"cmd": "x ${PORT}", "aliases": ["b"]}, "b": {"cmd": "y ${PORT}"}}},
     "models", "name 'b' is both model 'a' and model 'b'"),
    ({"models": {}}, "models", "missing or empty"),
    ({"engines": []}, "engines", "unknown key"),
    (with_({"startPort": 0}), "startPort", "expected a whole number >= 1"),
])
def test_errors_name_the_path(raw, where, what):
    with pytest.raises(InputError) as err:
        convert_llama_swap(raw, source="ls.yaml")
    assert err.value.source == "ls.yaml" and err.value.where == where and what in err.value.what
    assert str(err.value).startswith(f"ls.yaml:{where}: ")


def test_an_unset_environment_variable_is_an_error(monkeypatch):
    monkeypatch.delenv("LS_NOT_SET", raising=False)
    with pytest.raises(InputError, match=r"macros\.d: environment variable LS_NOT_SET is not set"):
        convert_llama_swap(with_({"macros": {"d": "${env.LS_NOT_SET}"}}))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(InputError) as err:
        from_llama_swap(tmp_path / "nope.yaml")
    assert (err.value.source, err.value.where) == (str(tmp_path / "nope.yaml"), "")
    assert "cannot read" in err.value.what
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  a: [unclosed\n")
    with pytest.raises(InputError) as err:
        from_llama_swap(bad)
    assert (err.value.source, err.value.where) == (str(bad), "") and err.value.what.startswith("not YAML")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(InputError, match="expected a mapping, got list"):
        from_llama_swap(tmp_path / "list.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(InputError, match="models: missing or empty"):
        from_llama_swap(tmp_path / "empty.yaml")


def test_read_keeps_yaml_1_2_booleans(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("macros: {fa: on, y: yes, t: true}\nmodels: {m: {cmd: x}}\n")
    assert read_llama_swap(p)["macros"] == {"fa": "on", "y": "yes", "t": True}
    assert yaml.safe_load("a: on") == {"a": True}  # PyYAML's own loader is left as it was
