"""Read cluster, catalog and trace files (YAML or JSON) or preset names, with errors that name the
file, the line or field, and what is wrong."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from .catalog import Catalog
from .cluster import GB, Cluster
from .errors import InputError, pydantic_where
from .trace import Cancel, Hint, Program, Trace, TraceHeader, TraceNode, ttft_bound

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def preset_names(kind: str) -> list[str]:
    d = EXAMPLES / kind
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _resolve(name_or_path: str, kind: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    preset = EXAMPLES / kind / f"{name_or_path}.yaml"
    if preset.is_file():
        return preset
    raise InputError(str(name_or_path), "",
                     f"no such file and no {kind[:-1]} preset of that name (presets: {', '.join(preset_names(kind))})")


def read_utf8(path: Path, what: str = "file") -> str:
    """The text of `path`; InputError naming the file (and the line) if it cannot be read or is
    not UTF-8, as a binary file given by mistake is not."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InputError(str(path), "", f"cannot read: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(str(path), f"{line}", f"not UTF-8 text (byte 0x{raw[e.start]:02x}): is this a {what}?") from None


def _yaml_error(e: yaml.YAMLError, text: str) -> tuple[str, str]:
    """(line, one-line message) of a YAML error: PyYAML's own message spans up to eight lines,
    with marks into "<unicode string>" that name no file."""
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (a binary file)
        line = text.count("\n", 0, e.position) + 1
        return f"{line}", f"malformed YAML: character U+{e.character:04X} is not allowed (a binary file?)"
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None) if getattr(e, "problem", None) else None
    ctx_mark = getattr(e, "context_mark", None)
    if context and ctx_mark is not None and mark is not None and ctx_mark.line != mark.line:
        context += f" from line {ctx_mark.line + 1}"
    msg = f"malformed YAML: {problem}" + (f" ({context})" if context else "")
    return (f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""), msg


class _UniqueKeys(yaml.SafeLoader):
    """YAML that refuses a key written twice in one mapping (plain YAML keeps the last, silently);
    keys a merge (`<<:`) brings in may be overridden, as YAML means them to be."""

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise yaml.composer.ComposerError(None, None, f"{key.value!r} is given twice", key.start_mark)
                seen.add((key.tag, key.value))
        return node


class _KeyTwice(ValueError):
    """A JSON object with a key written twice (`_unique_pairs`)."""


def _unique_pairs(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise _KeyTwice(f"{', '.join(map(repr, twice))} given twice in one object")
    return dict(pairs)


def _read_mapping(path: Path) -> dict:
    text = read_utf8(path, "YAML or JSON file")
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs) if path.suffix == ".json" \
            else yaml.load(text, Loader=_UniqueKeys)
    except json.JSONDecodeError as e:
        raise InputError(str(path), f"{e.lineno}", f"malformed JSON: {e.msg}") from None
    except _KeyTwice as e:
        raise InputError(str(path), "", f"malformed JSON: {e}") from None
    except yaml.YAMLError as e:
        raise InputError(str(path), *_yaml_error(e, text)) from None
    if not isinstance(data, dict):
        raise InputError(str(path), "", "expected a mapping at the top level")
    return data


def _validate(model_cls, data: dict, source: str):
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        where, msg = pydantic_where(e)
        raise InputError(source, where, msg.removeprefix("Value error, ")) from None


def load_cluster(name_or_path: str) -> Cluster:
    path = _resolve(name_or_path, "clusters")
    return _validate(Cluster, _read_mapping(path), str(path))


def load_catalog(name_or_path: str) -> Catalog:
    path = _resolve(name_or_path, "catalogs")
    data = _read_mapping(path)
    data.setdefault("name", path.stem)
    return _validate(Catalog, data, str(path))


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise InputError(str(path), "", "no such trace file")
    with open(path, "rb") as f:
        return parse_trace(_utf8_lines(f, str(path)), str(path))


def _utf8_lines(f, source: str):
    for lineno, raw in enumerate(f, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(source, f"{lineno}", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                                                  f"{e.start + 1}): a trace is JSON lines") from None


def parse_trace(lines, source: str) -> Trace:
    """A v1 trace from its JSONL lines (an open file, a list, or one string); errors name `source`
    and the line."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    header = TraceHeader()
    programs: list[Program] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as e:
            raise InputError(source, f"{lineno}", f"malformed JSON line: {e.msg} at column {e.colno}") from None
        if not isinstance(obj, dict):
            raise InputError(source, f"{lineno}", "expected a JSON object")
        if "trace_format" in obj:
            if obj["trace_format"] != 1:
                raise InputError(source, f"{lineno}", f"unsupported trace_format {obj['trace_format']!r} (this reads 1)")
            header = _validate(TraceHeader, obj, f"{source}:{lineno}")
            continue
        prog = _validate(Program, obj, f"{source}:{lineno}")
        if prog.program in seen:
            raise InputError(source, f"{lineno}", f"program {prog.program!r} already defined on line {seen[prog.program]}")
        seen[prog.program] = lineno
        programs.append(prog)
    if not programs:
        raise InputError(source, "", "trace holds no programs")
    return Trace(header=header, programs=programs)


WARN_KINDS = 10  # kinds of slip listed before the rest is counted


def trace_warnings(trace: Trace) -> list[str]:
    """What in a valid trace is most likely a mistake, one line per kind: an unknown field whose
    name is close to a known field left unset (unknown fields are kept, DESIGN.md §5, so
    `contxt_tokens` would leave a call at 0 context tokens without a word), and a program's `slo`
    class the header does not define (its calls get the interactive bound). Each names the first
    place it occurs; past `WARN_KINDS` kinds the rest are counted."""
    classes = (Program, TraceNode, Hint, Cancel, TraceHeader)
    known = {cls: set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias} for cls in classes}
    alias = {cls: {f.alias: name for name, f in cls.model_fields.items() if f.alias} for cls in classes}
    close_to: dict[tuple, str | None] = {}  # (class, unknown key) -> the known field it is close to
    seen: dict[tuple, list] = {}  # what -> [count, first place]

    def near(obj, where: str) -> None:
        cls = type(obj)
        for key in obj.model_extra or {}:
            if (cls, key) not in close_to:
                # 0.85: `contxt_tokens` (0.96) is a slip, `input_tokens` (0.8 to output_tokens) is not
                hit = difflib.get_close_matches(key, known[cls], n=1, cutoff=0.85)
                close_to[(cls, key)] = hit[0] if hit else None
            field = close_to[(cls, key)]
            # a field that is set is not what the unknown key meant (`tenant_id` beside `tenant`)
            if field is not None and alias[cls].get(field, field) not in obj.model_fields_set:
                seen.setdefault(("field", key, field), [0, where])[0] += 1

    near(trace.header, "the header")
    slo = trace.header.slo_classes
    for p in trace.programs:
        near(p, f"program {p.program}")
        for n in p.nodes:
            near(n, f"program {p.program}, node {n.id}")
        for i, h in enumerate(p.hints):
            near(h, f"program {p.program}, hint {i + 1}")
        for i, c in enumerate(p.cancel):
            near(c, f"program {p.program}, cancel {i + 1}")
        if p.slo not in slo and "slo" in p.model_fields_set:  # the default class is no one's slip
            seen.setdefault(("slo", p.slo), [0, f"program {p.program}"])[0] += 1
    out = []
    for what, (n, where) in list(seen.items())[:WARN_KINDS]:
        times = f"{n} times, first at {where}" if n > 1 else where
        if what[0] == "field":
            out.append(f"unknown field {what[1]!r} ({times}) is kept and not read: did you mean {what[2]!r}?")
        else:
            out.append(f"slo class {what[1]!r} ({times}) is not in the header's slo_classes ({', '.join(sorted(slo))}): "
                       f"its calls get the interactive bound, {ttft_bound(slo, what[1]):g} s")
    if len(seen) > WARN_KINDS:
        out.append(f"... and {len(seen) - WARN_KINDS} more kinds of likely slip")
    return out


def write_trace(trace: Trace, path: str | Path) -> None:
    with open(path, "w") as f:
        header = trace.header.model_dump(exclude_none=True)
        if not header.get("tenant_weights"):
            header.pop("tenant_weights", None)  # the default, left out: older traces stay byte-identical
        f.write(json.dumps(header, sort_keys=True) + "\n")
        for p in trace.programs:
            f.write(json.dumps(p.model_dump(by_alias=True, exclude_none=True)) + "\n")


def check_compatible(cluster: Cluster, catalog: Catalog, trace: Trace | None = None, trace_source: str = "trace") -> None:
    """Cross-file checks: every model fits some GPU group (its dense part, split over tp), every
    model a trace names is in the catalog."""
    for m in catalog.models:
        per_gpu = m.dense_bytes / m.tp
        unknown = sorted(set(m.gpus or ()) - {g.id for g in cluster.gpus})
        if unknown:
            raise InputError(f"catalog {catalog.name}", f"models.{m.name}.gpus",
                             f"no GPU {', '.join(unknown)} in cluster {cluster.name} (ids: "
                             f"{', '.join(g.id for g in cluster.gpus[:8])}{' …' if len(cluster.gpus) > 8 else ''})")
        groups = cluster.model_groups(m)
        if not groups:
            raise InputError(f"catalog {catalog.name}", f"models.{m.name}.tp",
                             f"tp={m.tp} but no node of cluster {cluster.name} has {m.tp} GPUs of one kind"
                             + (" among its gpus" if m.gpus else ""))
        best = max(min(cluster.usable_hbm_bytes(cluster.gpus[i]) for i in g) for g in groups)
        if per_gpu > best:
            raise InputError(f"catalog {catalog.name}", f"models.{m.name}",
                             f"too big for every GPU group of cluster {cluster.name}: needs {per_gpu / GB:.1f} GB per GPU "
                             f"(weights {m.weights_gb} GB / tp {m.tp}), the largest group offers {best / GB:.1f} GB usable per GPU")
    if trace is not None:
        known = catalog.by_name
        for p in trace.programs:
            for n in p.nodes:
                if n.kind == "call" and n.model not in known:
                    raise InputError(trace_source, f"program {p.program} node {n.id}",
                                     f"unknown model {n.model!r} (catalog {catalog.name} has: {', '.join(known)})")


def load_layout(path: str | Path) -> tuple[tuple | None, dict]:
    """An operator's layout (`PlannerConfig.homes`) from a YAML or JSON file: either a `homes`
    mapping, model: [GPU index, ...], or what `statebudget layout --json` wrote (its `kept`
    layout; None when it kept none); and what else the file says: the `cluster` and `catalog`
    names, if any, and `holds` (`PlannerConfig.layout_holds`), if given. The shape is checked
    here; whether each model and group fits the cluster and catalog is `planner.homes.layout`'s
    to say."""
    path = Path(path)
    return layout_entries(_read_mapping(path), str(path))


def found_elsewhere(names: dict, cluster: str | None, catalog: str | None) -> list[tuple[str, str, str]]:
    """(what, the name the layout file gives, the one it is used on) for the cluster and the
    catalog a layout file (`load_layout`'s `names`) says it was found on, where they differ: GPU
    indices mean something on their own cluster only."""
    return [(what, names[what], want) for what, want in (("cluster", cluster), ("catalog", catalog))
            if want is not None and names.get(what, want) != want]


def layout_entries(data: dict, source: str) -> tuple[tuple | None, dict]:
    """`load_layout` of a mapping already read (a file's, or a PUT /v1/layout body); `source`
    names it in errors."""
    if "homes" in data and "kept" in data:
        raise InputError(source, "", "both `homes:` and `kept:`: keep the one you mean")
    names = {k: data[k] for k in ("cluster", "catalog") if isinstance(data.get(k), str)}
    if "holds" in data:
        if not isinstance(data["holds"], bool):
            raise InputError(source, "holds", f"expected true or false, got {data['holds']!r}")
        names["holds"] = data["holds"]
    if "homes" in data:
        homes, where = data["homes"], "homes"
        if not isinstance(homes, dict):
            raise InputError(source, where, "expected a mapping, model: [GPU index, ...]")
        entries = list(homes.items())
    elif "kept" in data:
        homes, where = data["kept"], "kept"
        if homes is None:
            return None, names
        if not isinstance(homes, list) or not all(isinstance(e, list) and len(e) == 2 for e in homes):
            raise InputError(source, where, "expected a list of [model, [GPU index, ...]] pairs")
        entries = [tuple(e) for e in homes]
    else:
        raise InputError(source, "", "expected `homes:` (model: [GPU index, ...]) or the output of "
                                        "`statebudget layout --json` (its `kept` layout)")
    out = []
    for model, group in entries:
        if not isinstance(group, list) or not group or not all(type(g) is int for g in group):
            raise InputError(source, f"{where}.{model}", f"expected a list of GPU indices, got {group!r}")
        out.append((model, tuple(group)))
    return tuple(out), names
