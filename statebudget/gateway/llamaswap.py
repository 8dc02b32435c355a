"""Read an existing llama-swap `config.yaml` into a GatewayConfig (`gateway --from-llama-swap`).

As llama-swap's loader (proxy/config/config.go): `${env.NAME}` is replaced first; cmd and cmdStop
lose their `#` lines; macros (MODEL_ID, global `macros`, the model's `macros` replacing globals of
the same name) are substituted last-first, printed as Go's %v, in cmd, cmdStop, proxy,
checkEndpoint, filters.stripParams, name, description, aliases, setParamsByID keys, and (as newer
llama-swap does) env and useModelName; one left over is an error (`${PID}` may stay in cmdStop).
`${PORT}`: in sorted order of the model IDs, each model whose expanded cmd has it takes the next
port from `startPort` (5800), replaced in all those fields; others take none.
Each model becomes an EngineSpec: model=ID; cmd=one line, same argv (`#` lines dropped, trailing
`\\` joins lines, split as POSIX sh as llama-swap does, then shlex.join); port=its ${PORT} or None;
url=proxy (default http://localhost:${PORT}); aliases=aliases (names or {id, ...}) and setParamsByID
keys (llama-swap makes them aliases); env=the "K=V" list as a dict; ttl_s=ttl (-1/absent: globalTTL),
None for 0; check_path=checkEndpoint (/health), "" for "none": no health check; upstream_model=
useModelName; max_inflight=concurrencyLimit if > 0 (llama-swap's was 10); node=`node`; gpus by the first that answers:
  1. env's `CUDA_VISIBLE_DEVICES`, if a comma list of integers (if not: rule 3); when rule 2 too
     answers, its indices are taken within this list;
  2. exactly one device option in cmd: llama.cpp `--device`/`-dev` whose items are all CUDAn or
     ROCmn (-> the n's), or docker/podman `--gpus device=a,b` (-> a, b); `--tensor-split`,
     `--main-gpu`, `--gpus all` and the like are never read;
  3. [index of the model's group in the file's order of groups], or [0] for one in no group.
healthCheckTimeout (default 120, at least 15) becomes GatewayConfig.timeout_s. Accepted but not carried over
(`notes(raw)` lists them): groups/matrix (swap, exclusive, persistent: the planner decides who
shares the GPUs now), hooks, ttl/globalTTL (ttl_s is for reference), filters, cmdStop, timeouts,
unloadTimeout, /v1/models fields, sendLoadingState, compat, apiKeys, peers, profiles, selectors,
routing.scheduler, logging/UI. A key llama-swap lacks (top, model, filters, timeouts, group, hooks,
routing.router) is an InputError naming its path, e.g. `models.coder.cmdd: unknown key`. Files are
read with YAML 1.2 booleans (`on`, `yes` stay strings), as llama-swap's yaml.v3 reads them.
"""

from __future__ import annotations

import os
import re
import shlex
from decimal import Decimal
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..models.errors import InputError, pydantic_where
from .config import EngineSpec, GatewayConfig

_OWN, _NONE = "ignored: llama-swap's own logging, metrics or UI setting", "ignored: no such setting here"
_TOP = {k: v for ks, v in {
    "models macros startPort healthCheckTimeout groups routing hooks matrix": None,
    "logLevel logRequests logTimeFormat logToStdout metricsMaxInMemory captureBuffer store ui performance": _OWN,
    "unloadTimeout sendLoadingState includeAliasesInList upstream tailcat": _NONE,
    "globalTTL": "kept as each model's ttl_s for reference; the planner decides when a model is unloaded",
    "apiKeys": "not carried over: the gateway config has no API keys, so guard its port yourself",
    "peers": "not carried over: remote peers and their models are not served",
    "profiles selectors": "not carried over: clients name a model or one of its aliases"}.items()
    for k in ks.split()}
_MODEL = {k: v for ks, v in {
    "cmd proxy aliases env checkEndpoint useModelName concurrencyLimit macros": None,
    "unlisted name description metadata capabilities": "ignored: it only changed llama-swap's /v1/models",
    "unloadTimeout sendLoadingState timeouts compat": _NONE,
    "ttl": "kept as ttl_s for reference; the planner decides when it is unloaded",
    "cmdStop": "ignored: the supervisor stops the server its own way",
    "filters": "ignored: request parameters are not rewritten (its setParamsByID keys became aliases)"}.items()
    for k in ks.split()}
_FILTERS, _TIMEOUTS = set("stripParams strip_params setParams setParamsByID".split()), set(
    "connect keepalive responseHeader tlsHandshake expectContinue idleConn".split())
_MACRO_NAME, _MACRO_USE, _DEVICE = map(re.compile, (r"^[a-zA-Z0-9_-]{1,63}$", r"\$\{([a-zA-Z0-9_-]+)\}",
                                                   r"^(?:CUDA|ROCm)(\d+)$"))
_ENV_USE, _BOOL = re.compile(r"\$\{env\.([a-zA-Z_][a-zA-Z0-9_]*)\}"), "tag:yaml.org,2002:bool"


class _Yaml12Loader(yaml.SafeLoader):
    yaml_implicit_resolvers = {  # YAML 1.2 booleans only: `on`, `yes`, `off` stay strings, as in yaml.v3
        k: [(t, r) for t, r in v if t != _BOOL] + [(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"))]
        * (k in ("t", "T", "f", "F")) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def read_llama_swap(path: str | Path):
    """The raw mapping of a llama-swap file; a missing file or bad YAML is an InputError."""
    try:
        raw = yaml.load(Path(path).read_text(), Loader=_Yaml12Loader)  # noqa: S506 (a SafeLoader)
    except OSError as e:
        raise InputError(str(path), "", f"cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise InputError(str(path), "", f"not YAML: {e}") from None
    return raw  # not a mapping: convert_llama_swap says so


def from_llama_swap(path: str | Path, node: str = "n0") -> GatewayConfig:
    """The GatewayConfig of a llama-swap file; `notes(read_llama_swap(path))` says what it leaves out."""
    return convert_llama_swap(read_llama_swap(path), str(path), node)


def _go(v) -> str:
    """A scalar as Go's fmt %v prints it, which is what llama-swap puts in place of a macro."""
    if isinstance(v, bool) or not isinstance(v, float):
        return {True: "true", False: "false"}[v] if isinstance(v, bool) else str(v)
    t = Decimal(repr(v)).normalize()  # strconv's 'g' format with the shortest precision
    nd, e = len(t.as_tuple().digits), t.adjusted()
    return format(v, f".{nd - 1}e") if not -4 <= e < 6 else format(v, f".{max(nd, e + 1)}g")


def _of(kind: type, obj, src: str, where: str, allowed=None):
    """`obj` (None: empty) checked to be a dict or list, and a dict's keys to be in `allowed`."""
    if obj is not None and not isinstance(obj, kind):
        raise InputError(src, where, f"expected a {'mapping' if kind is dict else 'list'}, got {type(obj).__name__}")
    for k in obj if obj and allowed is not None else ():
        if k not in allowed:
            raise InputError(src, f"{where}.{k}" if where else str(k), "unknown key")
    return obj or kind()


def _int(obj, default, lo: int, src: str, where: str):
    if obj is not None and (not isinstance(obj, int) or isinstance(obj, bool) or obj < lo):
        raise InputError(src, where, f"expected a whole number >= {lo}, got {obj!r}")
    return default if obj is None else obj


def _env_sub(obj, src: str, where: str):
    if isinstance(obj, dict):
        return {_env_sub(k, src, where): _env_sub(v, src, f"{where}.{k}".lstrip(".")) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_env_sub(v, src, f"{where}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, str) and (unset := [n for n in _ENV_USE.findall(obj) if n not in os.environ]):
        raise InputError(src, where, f"environment variable {unset[0]} is not set")
    return _ENV_USE.sub(lambda m: os.environ[m.group(1)], obj) if isinstance(obj, str) else obj


def _macros(obj, src: str, where: str) -> dict:
    out = {}
    for k, v in _of(dict, obj, src, where).items():
        name, at = _go(k), f"{where}.{k}"
        why = ("a macro name is 1-63 of the characters a-z A-Z 0-9 _ -" if not _MACRO_NAME.match(name) else
               "reserved name" if name in ("PORT", "MODEL_ID", "PID") else
               f"a macro is a string, number or bool, not {type(v).__name__}" if not isinstance(v, (str, int, float))
               else "longer than 1023 characters" if isinstance(v, str) and len(v) >= 1024 else
               "refers to itself" if isinstance(v, str) and f"${{{name}}}" in v else None)
        if why:
            raise InputError(src, at, why)
        out[name] = v
    return out


def _strip(cmd: str) -> str:
    return "\n".join(ln for ln in cmd.split("\n") if not ln.strip().startswith("#"))


def _argv(cmd: str, src: str, where: str) -> list[str]:
    lines = [ln.strip()[:-1] + " " if ln.strip().endswith("\\") else ln for ln in _strip(cmd).split("\n")]
    try:
        if args := shlex.split("\n".join(lines)):
            return args
    except ValueError as e:
        raise InputError(src, where, f"cannot be split into arguments ({e})") from None
    raise InputError(src, where, "empty command")


def _gpus(env: dict[str, str], args: list[str]) -> list[int] | None:
    """Rules 1 and 2 of the module docstring; None when neither answers."""
    def ints(text: str) -> list[int] | None:
        parts = [p.strip() for p in text.split(",")]
        return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if (visible := None if vis is None else ints(vis)) is None and vis is not None:
        return None
    opts = [(flag, val if eq else (args[i + 1] if i + 1 < len(args) else "")) for i, (flag, eq, val)
            in enumerate(a.partition("=") for a in args) if flag in ("--device", "-dev", "--gpus")]
    flag, val = (opts[0][0], opts[0][1].strip("'\"")) if len(opts) == 1 else ("", "")
    items = [_DEVICE.match(x.strip()) for x in val.split(",")]
    dev = (ints(val[len("device="):]) if flag == "--gpus" and val.startswith("device=") else
           [int(x[1]) for x in items] if flag in ("--device", "-dev") and all(items) else None)
    if not (visible and dev):
        return visible or dev
    return [visible[d] for d in dev] if all(d < len(visible) for d in dev) else visible


def _groups(raw: dict, models: dict, src: str) -> dict:
    """{group: its mapping} in file order, from `groups` or routing.router.settings.groups, checked."""
    routing = _of(dict, raw.get("routing"), src, "routing", {"scheduler", "router"})
    router = _of(dict, routing.get("router"), src, "routing.router", {"use", "settings"})
    settings = _of(dict, router.get("settings"), src, "routing.router.settings", {"groups", "matrix"})
    where = "routing.router.settings.groups" if settings.get("groups") else "groups"
    if raw.get("groups") and settings.get("groups"):
        raise InputError(src, where, "groups are given at the top too; keep one of the two")
    groups = _of(dict, settings.get("groups") or raw.get("groups"), src, where)
    if groups and (raw.get("matrix") or settings.get("matrix")):
        raise InputError(src, where, "a config uses either groups or a matrix, not both")
    seen: dict[str, str] = {}
    for g, body in groups.items():
        body = _of(dict, body, src, f"{where}.{g}", {"swap", "exclusive", "persistent", "members"})
        for i, m in enumerate(_of(list, body.get("members"), src, f"{where}.{g}.members")):
            if (m := _go(m)) not in models or m in seen:
                raise InputError(src, f"{where}.{g}.members.{i}", f"{m!r} is not a model in `models`"
                                 if m not in models else f"{m!r} is already a member of group {seen[m]!r}")
            seen[m] = g
    return groups


def _engine(name: str, m, macros: dict, next_port: int, ctx: dict) -> EngineSpec:
    src, at = ctx["src"], f"models.{name}"
    m = {k: v for k, v in _of(dict, m, src, at, _MODEL).items() if v is not None}  # null: unset, as in yaml.v3
    for key in ("cmd", "cmdStop", "proxy", "checkEndpoint", "name", "description", "useModelName"):
        if not isinstance(v := m.get(key, ""), str) or (key == "cmd" and not v.strip()):
            raise InputError(src, f"{at}.{key}", "missing: a model needs the command that starts its server"
                             if isinstance(v, str) else f"expected a string, got {type(v).__name__}")
    macros = {**macros, **_macros(m.get("macros"), src, f"{at}.macros")}  # a global keeps its place

    def expand(s: str) -> str:
        for k, v in reversed(macros.items()):
            s = s.replace(f"${{{k}}}", _go(v))
        return s
    filters = _of(dict, m.get("filters"), src, f"{at}.filters", _FILTERS)
    _of(dict, m.get("timeouts"), src, f"{at}.timeouts", _TIMEOUTS)
    env = _of(list, m.get("env"), src, f"{at}.env")
    if bad := [i for i, e in enumerate(env) if not isinstance(e, str) or "=" not in e.lstrip("=")]:
        raise InputError(src, f"{at}.env.{bad[0]}", f'expected "NAME=value", got {env[bad[0]]!r}')
    f = {"cmd": expand(_strip(m["cmd"])), "cmdStop": expand(_strip(m.get("cmdStop", ""))),
         "proxy": expand(m.get("proxy", "http://localhost:${PORT}")),
         "checkEndpoint": expand(m.get("checkEndpoint", "/health")),
         "filters.stripParams": expand(str(filters.get("stripParams") or filters.get("strip_params") or "")),
         "name": expand(m.get("name", "")), "description": expand(m.get("description", "")),
         "useModelName": expand(m.get("useModelName", "")), **{f"env.{i}": expand(e) for i, e in enumerate(env)}}
    port = next_port if "${PORT}" in f["cmd"] else None
    if port is None and "${PORT}" in f["proxy"]:
        raise InputError(src, f"{at}.proxy", "uses ${PORT} but cmd does not; only a cmd with ${PORT} gets one")
    for key in f if port else ():
        f[key] = f[key].replace("${PORT}", str(port))
    aliases = [a if isinstance(a, str) else _of(dict, a, src, f"{at}.aliases.{i}", {"id", "name", "unlisted"}).get("id")
               for i, a in enumerate(_of(list, m.get("aliases"), src, f"{at}.aliases"))]
    if bad := [i for i, a in enumerate(aliases) if not isinstance(a, str) or not a]:
        raise InputError(src, f"{at}.aliases.{bad[0]}", "expected a model name")
    by_id = [_go(k) for k in _of(dict, filters.get("setParamsByID"), src, f"{at}.filters.setParamsByID")]
    aliases = [a for a in dict.fromkeys(map(expand, aliases + by_id)) if a != name]
    for key, value in [*f.items(), *(("aliases", a) for a in aliases)]:
        for hit in _MACRO_USE.finditer(value):
            if not (hit.group(1) == "PID" and key == "cmdStop"):
                raise InputError(src, f"{at}.{key}", f"unknown macro ${{{hit.group(1)}}}")
    env = dict(f[f"env.{i}"].split("=", 1) for i in range(len(env)))
    ttl = ctx["global_ttl"] if (ttl := _int(m.get("ttl"), -1, -1, src, f"{at}.ttl")) == -1 else ttl
    limit = _int(m.get("concurrencyLimit"), 0, 0, src, f"{at}.concurrencyLimit")
    check, args = f["checkEndpoint"].strip(), _argv(f["cmd"], src, f"{at}.cmd")
    try:
        return EngineSpec(model=name, cmd=shlex.join(args), port=port, url=f["proxy"], node=ctx["node"],
                          gpus=_gpus(env, args) or [ctx["gpu"].get(name, 0)], env=env, aliases=aliases,
                          upstream_model=f["useModelName"] or None, ttl_s=float(ttl) if ttl else None,
                          check_path="" if check == "none" else (check or "/health"),
                          **({"max_inflight": limit} if limit else {}))
    except ValidationError as e:
        raise InputError(src, at, ": ".join(filter(None, pydantic_where(e)))) from None


def convert_llama_swap(raw: dict, source: str = "config.yaml", node: str = "n0") -> GatewayConfig:
    """The GatewayConfig of a parsed llama-swap config, mapped as the module docstring says."""
    raw = _env_sub(_of(dict, raw, source, "", _TOP), source, "")
    if not (models := {_go(k): v for k, v in _of(dict, raw.get("models"), source, "models").items()}):
        raise InputError(source, "models", "missing or empty: llama-swap's config lists its models here")
    hooks = _of(dict, raw.get("hooks"), source, "hooks", {"on_startup"})
    _of(dict, hooks.get("on_startup"), source, "hooks.on_startup", {"preload", "profile"})
    gpu = {_go(member): i for i, body in enumerate(_groups(raw, models, source).values())
           for member in (body or {}).get("members") or []}
    ctx = dict(src=source, node=node, gpu=gpu, global_ttl=_int(raw.get("globalTTL"), 0, 0, source, "globalTTL"))
    macros = _macros(raw.get("macros"), source, "macros")
    next_port, engines, owner = _int(raw.get("startPort"), 5800, 1, source, "startPort"), {}, {}
    for name in sorted(models):  # llama-swap hands out ports in sorted order of the model IDs
        e = engines[name] = _engine(name, models[name], {"MODEL_ID": name, **macros}, next_port, ctx)
        next_port += e.port is not None
        for a in e.aliases:
            if owner.setdefault(a, name) != name:
                raise InputError(source, f"models.{name}.aliases", f"alias {a!r} is taken by model {owner[a]!r}")
    hct = _int(raw.get("healthCheckTimeout"), 120, 0, source, "healthCheckTimeout")  # llama-swap's default
    try:
        return GatewayConfig(engines=[engines[n] for n in models], timeout_s=float(max(15, hct)))
    except ValidationError as e:
        raise InputError(source, "models", pydantic_where(e)[1]) from None


def notes(raw) -> list[str]:
    """One plain sentence for each setting in `raw` that is kept only for reference or ignored."""
    def d(obj) -> dict:
        return obj if isinstance(obj, dict) else {}

    def shown(v) -> str:
        return f"={_go(v)}" if isinstance(v, (str, int, float)) else ""
    raw = d(raw)
    out = [f"{k}{shown(v)}: {_TOP[k]}" for k, v in raw.items() if _TOP.get(k)]
    settings = d(d((routing := d(raw.get("routing"))).get("router")).get("settings"))
    for i, (g, body) in enumerate(d(settings.get("groups") or raw.get("groups")).items()):
        flags = ", ".join(f"{k}={_go(d(body).get(k, v))}"
                          for k, v in (("swap", True), ("exclusive", True), ("persistent", False)))
        out.append(f"group {g!r}: {flags} is the planner's job now; its members get gpus [{i}] "
                   "unless their env or cmd names their devices")
    if raw.get("matrix") or settings.get("matrix"):
        out.append("matrix: which models run together is the planner's job now")
    if routing.get("scheduler"):
        out.append("routing.scheduler: request priorities are not carried over")
    for k, v in d(d(raw.get("hooks")).get("on_startup")).items():
        out.append(f"hooks.on_startup.{k} {v}: ignored; the planner decides what is resident"
                   if k == "preload" else f"hooks.on_startup.{k}{shown(v)}: ignored, there are no profiles")
    for name, m in d(raw.get("models")).items():
        out += [f"model {_go(name)!r}: {k}{shown(v)}: {_MODEL[k]}" for k, v in d(m).items() if _MODEL.get(k)]
    return out
