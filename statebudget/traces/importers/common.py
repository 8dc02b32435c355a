"""What every importer shares: bad-row handling, the sessions the readers produce, the choice of
each call's model (`--models role`, `--map`, `--model`), and the build of v1 programs from them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ...models.catalog import Catalog
from ...models.errors import InputError
from ...models.trace import DEFAULT_MAX_TOKENS, Program, TraceNode
from ..generators import MAX_CONTEXT

# What an imported call may hold: the generators' context bound, and the output a runtime that
# does not say asks for (trace.py). Longer real values are clipped and counted.
MAX_OUTPUT = DEFAULT_MAX_TOKENS
FIRST_BAD = 5  # bad rows listed on stderr under --on-bad skip
WAIT_TOOL = "wait"  # a wait whose cause (tool or human) the source does not say
USER_TOOL = "user"  # a human's think time before the next round


class BadRows:
    """Bad rows of the input: refused at once (InputError `file:line: what`) or skipped and
    counted, the first few kept for the report."""

    def __init__(self, on_bad: str = "skip"):
        if on_bad not in ("skip", "refuse"):
            raise InputError("--on-bad", "", f"expected skip or refuse, got {on_bad!r}")
        self.on_bad = on_bad
        self.count = 0
        self.first: list[str] = []

    def __call__(self, source: str, line: int | str, what: str) -> None:
        if self.on_bad == "refuse":
            raise InputError(source, str(line), what)
        self.count += 1
        if len(self.first) < FIRST_BAD:
            self.first.append(f"{source}:{line}: {what}")


def open_input(path: Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise InputError(str(path), "", "no such input file")
    return path


def text_lines(path: Path, bad: BadRows):
    """(line number, text) of each non-empty line, read one at a time (a large file is never held
    whole); a line that is not UTF-8 is a bad row."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                bad(str(path), lineno, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            if text.strip():
                yield lineno, text


def json_rows(path: Path, bad: BadRows):
    """(line number, object) of each JSON-object line of a JSONL file; others are bad rows."""
    for lineno, text in text_lines(path, bad):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            bad(str(path), lineno, f"malformed JSON: {e.msg} at column {e.colno}")
            continue
        if not isinstance(obj, dict):
            bad(str(path), lineno, "expected a JSON object")
            continue
        yield lineno, obj


def csv_rows(path: Path, bad: BadRows, required: tuple[str, ...], optional: tuple[str, ...] = ()):
    """(line number, {column: text}) of each data row of a CSV file with a header line. A header
    without a `required` column is refused whatever --on-bad says (no row could be read)."""
    import csv

    header = None
    for lineno, text in text_lines(path, bad):
        cells = next(csv.reader([text]))
        if header is None:
            header = [c.strip() for c in cells]
            missing = [c for c in required if c not in header]
            if missing:
                raise InputError(str(path), str(lineno), f"header lacks column(s) {', '.join(missing)} "
                                 f"(expected {', '.join(required + optional)}; found {', '.join(header)})")
            continue
        if len(cells) != len(header):
            bad(str(path), lineno, f"{len(cells)} fields, the header has {len(header)}")
            continue
        yield lineno, dict(zip(header, (c.strip() for c in cells)))


def number(obj: dict, key: str, *, integer: bool = False, required: bool = True):
    """`obj[key]` as a finite number >= 0 (an int if `integer`); ValueError naming the field.
    Text (from a CSV) is parsed."""
    if key not in obj or obj[key] in (None, ""):
        if required:
            raise ValueError(f"no {key}")
        return None
    v = obj[key]
    if isinstance(v, str):
        try:
            v = int(v) if integer else float(v)
        except ValueError:
            raise ValueError(f"{key} {v!r} is not {'an integer' if integer else 'a number'}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise ValueError(f"{key} {v!r} is not {'an integer' if integer else 'a number'}")
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{key} {v!r} must be a finite number >= 0")
    return v


@dataclass
class Turn:
    """One LLM call of a session, as the source gives it. `keys`: the source names `--map` may
    match, most specific first (a model name, a session class, the file's class). `tools`:
    (tool, seconds) waits after the call, run in parallel; `user_s`: a human's wait after those.
    `arrival_s`: the call's real arrival (Mooncake), from which the wait before it is derived."""
    keys: tuple[str, ...]
    context: int
    output: int
    tools: list[tuple[str, float]] = field(default_factory=list)
    user_s: float = 0.0
    arrival_s: float | None = None

    @property
    def uses_tools(self) -> bool:
        return any(d > 0 for _, d in self.tools) or self.arrival_s is not None


@dataclass
class Session:
    pid: str
    start_s: float  # unscaled, from the source's time 0
    turns: list[Turn]


class ModelChooser:
    """Each call's catalog model: `role` (the rule in docs/traces.md), `map` (source key -> model,
    `*` for any other key) or one `model` for every call."""

    def __init__(self, catalog: Catalog, models: str | None = None, mapping: str | None = None,
                 model: str | None = None):
        given = [o for o, v in (("--models", models), ("--map", mapping), ("--model", model)) if v is not None]
        if len(given) > 1:
            raise InputError(" and ".join(given), "", "give one of --models role, --map or --model")
        self.catalog = catalog
        self.names = [m.name for m in catalog.models]
        self.mode, self.mapping, self.model = "role", {}, None
        if models is not None and models != "role":
            raise InputError("--models", "", f"expected 'role', got {models!r} (a fixed choice is --map or --model)")
        if mapping is not None:
            self.mode, self.mapping = "map", parse_map(mapping)
            for m in self.mapping.values():
                self._known("--map", m)
        if model is not None:
            self.mode, self.model = "model", model
            self._known("--model", model)
        self.classes: dict[str, int] = {}  # a one-call program's class -> index, in order of first appearance

    def _known(self, option: str, name: str) -> None:
        if name not in self.catalog.by_name:
            raise InputError(option, "", f"unknown model {name!r} (catalog {self.catalog.name} has: "
                                         f"{', '.join(self.names)})")

    def describe(self) -> str:
        if self.mode == "map":
            return "map " + ",".join(f"{k}={v}" for k, v in self.mapping.items())
        return f"model {self.model}" if self.mode == "model" else "role"

    def choose(self, session: Session) -> list[str]:
        turns = session.turns
        if self.mode == "model":
            return [self.model] * len(turns)
        if self.mode == "map":
            return [self._mapped(t) for t in turns]
        n = len(self.names)
        if len(turns) == 1:
            k = self.classes.setdefault(turns[0].keys[0], len(self.classes))
            return [self.names[k % n]]
        out = []
        for i, t in enumerate(turns):
            if i == 0:
                role = 0  # plan
            elif i == len(turns) - 1 or not t.uses_tools:
                role = 2  # review: the last call, and a middle call that uses no tool
            else:
                role = 1  # code: a middle call that uses a tool
            out.append(self.names[role % n])
        return out

    def _mapped(self, t: Turn) -> str:
        for k in t.keys + ("*",):
            if k in self.mapping:
                return self.mapping[k]
        raise InputError("--map", "", f"no mapping for {t.keys[0]!r} (this input's keys for a call: "
                         f"{', '.join(repr(k) for k in t.keys)}; add KEY=MODEL, or *=MODEL for the rest)")


def parse_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, model = part.partition("=")
        if not sep or not key.strip() or not model.strip():
            raise InputError("--map", "", f"{part!r}: expected KEY=MODEL")
        if key.strip() in out:
            raise InputError("--map", "", f"{key.strip()!r} mapped twice")
        out[key.strip()] = model.strip()
    if not out:
        raise InputError("--map", "", "empty mapping (expected KEY=MODEL,...)")
    return out


@dataclass
class Clips:
    context: int = 0
    output: int = 0


class Builder:
    """v1 programs from sessions: models chosen, tokens clipped, waits turned into tool nodes."""

    def __init__(self, chooser: ModelChooser, tenant: str, slo: str = "interactive"):
        from ...core.costs import CostModel
        from ..timeline import REFERENCE

        self.chooser, self.tenant, self.slo = chooser, tenant, slo
        self.cost = CostModel(REFERENCE, chooser.catalog)
        self.clips = Clips()

    def nominal_s(self, node: TraceNode) -> float:
        """The call alone on the reference machine (8 A100, `timeline.REFERENCE`), no queueing."""
        from ..timeline import _call_s

        return _call_s(self.cost, self.chooser.catalog, node)

    def program(self, s: Session, start: float) -> Program:
        models = self.chooser.choose(s)
        nodes: list[TraceNode] = []
        after: list[str] = []
        prev_end = None  # the previous call's estimated end, for arrival-timed turns

        def add(**kw) -> str:
            nid = f"n{len(nodes) + 1}"
            nodes.append(TraceNode(id=nid, **kw))
            return nid

        for t, model in zip(s.turns, models):
            if t.arrival_s is not None and prev_end is not None:
                wait = round(max(0.0, t.arrival_s - prev_end), 3)
                if wait > 0:
                    after = [add(kind="tool", tool=WAIT_TOOL, duration=wait, after=after)]
            ctx, out = min(t.context, MAX_CONTEXT), min(t.output, MAX_OUTPUT)
            self.clips.context += ctx < t.context
            self.clips.output += out < t.output
            cid = add(kind="call", model=model, context_tokens=ctx, output_tokens=out, max_tokens=MAX_OUTPUT,
                      after=after)
            if t.arrival_s is not None:
                prev_end = t.arrival_s + self.nominal_s(nodes[-1])
            after = [cid]
            tools = [add(kind="tool", tool=name, duration=round(d, 3), after=[cid]) for name, d in t.tools if d > 0]
            after = tools or after
            if t.user_s > 0:
                after = [add(kind="tool", tool=USER_TOOL, duration=round(t.user_s, 3), after=after)]
        while nodes[-1].kind == "tool":  # a wait after the last call delays nothing
            nodes.pop()
        return Program(program=s.pid, tenant=self.tenant, start=start, slo=self.slo, nodes=nodes)
