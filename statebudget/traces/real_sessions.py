"""`real-sessions`: a seeded multi-model agent trace resampled from TraceLab's real sessions.

Source: `tracelab/round_trace.jsonl` of the real workload data (`shared/data/real`, CC BY 4.0),
two real coding-agent sessions (Claude Code, 10 rounds; Codex, 9 rounds), read by the TraceLab
importer (`importers/tracelab.py`), so the preset and `trace import --format tracelab` agree on
what a round is. `multi_session_large.csv` is not used: it is TraceLab's replay example, and its
columns look drawn, not recorded (outputs spread evenly over 60-320 tokens, every tool wait under
0.6 s, where the recorded rounds wait 8 ms to 21 s).

Real, copied unchanged from the rounds: each call's context and output tokens, each round's tool
waits (one tool node a tool, a round's tools in parallel, named search/edit/shell by
`fit.TOOL_CLASSES`), the human's think time before a new request (a `user` node), the order of
the rounds. A session splits into episodes, each one human request and the rounds that answer
it (a new episode at the first round and after each `user` wait).

Synthetic, because the data cannot give it:
- Which rounds make a program. A program is a real session's run of consecutive episodes (the
  session drawn uniformly, then one of its runs uniformly), so it starts at a real request and
  every context is the real one at that round; the two sessions hold 9 such runs.
- Arrivals. Ten developers (tenants), each starting programs as a Poisson process with a mean
  gap of `MEAN_GAP_S`, chosen so that the nominal call time per hour (each call alone on the
  reference machine, agent-team catalog) matches swe-team's; see docs/traces.md. The sessions'
  real starts are months apart and say nothing about concurrency.
- Models. TraceLab's sessions are single-model; a round goes to an agent-team model by the role
  its recorded actions show (`ROLE_MODELS`): a round opening a request plans (planner); else one
  that edits codes (the program's coder: the dense `coder` or the MoE `fast-coder`, a coin per
  program); else one that searches researches (reasoner); else one that only runs commands checks
  (reviewer); one that calls no tool answers the human (summarizer).
- `max_tokens`: 4096 for every call, the trace format's default (the importers' choice too).

Hints, held to the other presets' rule (DESIGN.md §5, `generators.py`): when a round's tools start,
the runtime announces the next call. It knows the role of the round just run and, once one of
its coding rounds has run, the program's coder (before, only the coin's odds, `P_DENSE_CODER`, as
swe-team's runtime), not the program's future: it names a model drawn from the next role's distribution given
the current role, the frequencies of those transitions over every program the preset can draw
(weighted by how likely each is drawn; `_hint_table`), with that probability as the confidence,
so confidences are calibrated. No hint is issued during a human's think time: whether the human
comes back is not known then.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..models.errors import InputError
from ..models.trace import DEFAULT_MAX_TOKENS, Hint, Program, TraceNode
from .generators import MAX_CONTEXT  # the real rounds stay under it (largest: 48,305 tokens)
from .importers.common import USER_TOOL, BadRows

DATA_ENV = "STATEBUDGET_REAL_DATA"  # a folder holding tracelab/round_trace.jsonl, instead of the search
ROUNDS_FILE = Path("tracelab") / "round_trace.jsonl"
DEVELOPERS = 10
# Per developer: the gap that makes the calls' nominal time an hour swe-team's (docs/traces.md).
# First derived from figures of seeds 100-109 (10 x 3600 x 67.4 / 5632 = 431 s); on tuning seeds
# 1-10 this preset's nominal work is 1.005x swe-team's with it, so it stands (1.056x on 100-109).
MEAN_GAP_S = 430.0
P_DENSE_CODER = 0.5
ROLE_MODELS = {"plan": "planner", "research": "reasoner", "check": "reviewer", "answer": "summarizer"}
CODE = "code"  # the program's coder: coder or fast-coder


def data_dirs() -> list[Path]:
    """Where the real data is looked for: `$STATEBUDGET_REAL_DATA` alone where set (a folder named on
    purpose is not silently replaced by another), else `shared/data/real` beside this checkout (as
    CI places it next to the clone), then `../shared/data/real` from the working directory (the
    default of the CLI's `--data`)."""
    if os.environ.get(DATA_ENV):
        return [Path(os.environ[DATA_ENV])]
    return [Path(__file__).resolve().parents[3] / "shared" / "data" / "real", Path("..") / "shared" / "data" / "real"]


def rounds_path() -> Path:
    tried = data_dirs()
    for d in tried:
        if (d / ROUNDS_FILE).is_file():
            return d / ROUNDS_FILE
    raise InputError("real-sessions", "", f"TraceLab's {ROUNDS_FILE.as_posix()} is missing: looked in "
                     + ", ".join(str(d) for d in tried) + f" (put the real workload data, shared/data/real, "
                     f"beside this checkout, or set {DATA_ENV} to the folder holding tracelab/)")


@dataclass(frozen=True)
class Round:
    context: int
    output: int
    tools: tuple[tuple[str, float], ...]  # (tool class, seconds), run in parallel after the call
    user_s: float  # a human's think time after this round (0: the next round is the agent's)
    role: str
    index: int  # in the session


@dataclass(frozen=True)
class Source:
    sessions: tuple[tuple[str, tuple[tuple[Round, ...], ...]], ...]  # (session id, its episodes)
    sha256: str


def _role(turn, opens_request: bool) -> str:
    classes = {c for c, d in turn.tools}
    if opens_request:
        return "plan"
    if "edit" in classes:
        return CODE
    if "search" in classes:
        return "research"
    return "check" if classes else "answer"


def load_source(path: Path | None = None) -> Source:
    """The real sessions, split into episodes; any bad row is refused (a resample of a partly read
    file would differ from machine to machine without saying so)."""
    from .importers.tracelab import read_tracelab

    path = path or rounds_path()
    sessions = []
    for s in read_tracelab([path], BadRows("refuse")):
        episodes: list[list[Round]] = []
        for i, t in enumerate(s.turns):
            opens = i == 0 or s.turns[i - 1].user_s > 0
            if opens:
                episodes.append([])
            tools = tuple((c, round(d, 3)) for c, d in t.tools if d > 0)
            episodes[-1].append(Round(t.context, t.output, tools, round(t.user_s, 3), _role(t, opens), i))
        sid = s.pid.removeprefix(f"{path.stem}-")
        sessions.append((sid, tuple(tuple(e) for e in episodes)))
    if not sessions:
        raise InputError(str(path), "", "no session to resample")
    return Source(tuple(sessions), hashlib.sha256(path.read_bytes()).hexdigest())


def runs(episodes) -> list[tuple[int, int]]:
    """Every run of consecutive episodes (first, last), in order."""
    return [(a, b) for a in range(len(episodes)) for b in range(a, len(episodes))]


def _hint_table(src: Source) -> dict[str, dict[str, float]]:
    """Current role -> distribution of the next role, over the transitions after a round with tools
    of every program the preset may draw, each weighted by the probability it is drawn."""
    acc: dict[str, dict[str, float]] = {}
    for _, episodes in src.sessions:
        rs = runs(episodes)
        w = 1.0 / (len(src.sessions) * len(rs))
        for a, b in rs:
            rounds = [r for e in episodes[a:b + 1] for r in e]
            for cur, nxt in zip(rounds, rounds[1:]):
                if cur.tools:
                    row = acc.setdefault(cur.role, {})
                    row[nxt.role] = row.get(nxt.role, 0.0) + w
    return {r: {n: v / sum(row.values()) for n, v in sorted(row.items())} for r, row in sorted(acc.items())}


def _model(role: str, coder: str) -> str:
    return coder if role == CODE else ROLE_MODELS[role]


def _program(g, src: Source, table, pid: str, tenant: str, start: float) -> Program:
    rng = g.rng
    sid, episodes = src.sessions[int(rng.integers(len(src.sessions)))]
    rs = runs(episodes)
    a, b = rs[int(rng.integers(len(rs)))]
    coder = "coder" if rng.random() < P_DENSE_CODER else "fast-coder"
    rounds = [r for e in episodes[a:b + 1] for r in e]
    nodes: list[TraceNode] = []
    hints: list[Hint] = []
    after: list[str] = []
    pending: dict[str, float] | None = None  # the runtime's distribution for the next call
    issued_at = ""  # the node it was announced at
    coded = False   # a round of the program's coder has run

    def add(**kw) -> str:
        nid = f"n{len(nodes) + 1}"
        nodes.append(TraceNode(id=nid, **kw))
        return nid

    for k, r in enumerate(rounds):
        out = min(r.output, DEFAULT_MAX_TOKENS)
        cid = add(kind="call", model=_model(r.role, coder), context_tokens=min(r.context, MAX_CONTEXT),
                  output_tokens=out, max_tokens=DEFAULT_MAX_TOKENS, after=after)
        coded = coded or r.role == CODE
        if pending is not None:
            model = g.hint_model(pending)
            hints.append(Hint.model_validate({"issued_at": issued_at, "for": cid, "model": model,
                                              "confidence": round(pending.get(model, 0.0), 3)}))
            pending = None
        if k == len(rounds) - 1:
            break  # a wait after the last call delays nothing
        after = [cid]
        tools = [add(kind="tool", tool=name, duration=d, after=[cid]) for name, d in r.tools]
        if tools:
            after = tools
            # Which coder the program has is known once a coding round has run; before, the runtime
            # knows only the coin's odds (as swe-team's runtime, `generators.py`).
            odds = {coder: 1.0} if coded else {"coder": P_DENSE_CODER, "fast-coder": 1.0 - P_DENSE_CODER}
            probs: dict[str, float] = {}
            for role, p in table[r.role].items():
                for m, q in (odds.items() if role == CODE else ((ROLE_MODELS[role], 1.0),)):
                    probs[m] = probs.get(m, 0.0) + p * q
            pending, issued_at = probs, tools[0]
        if r.user_s > 0:
            after = [add(kind="tool", tool=USER_TOOL, duration=r.user_s, after=after)]
    return Program.model_validate({"program": pid, "tenant": tenant, "start": round(start, 3), "slo": "interactive",
                                   "nodes": nodes, "hints": hints,
                                   "source": {"session": sid, "rounds": [rounds[0].index, rounds[-1].index]}})


def gen_real_sessions(g, src: Source | None = None) -> list[Program]:
    """`g`: the generators' `_Gen` (its program and hint streams, its Poisson starts)."""
    src = src or load_source()
    table = _hint_table(src)
    progs = []
    for d in range(DEVELOPERS):
        for k, start in enumerate(g.starts(MEAN_GAP_S)):
            progs.append(_program(g, src, table, f"dev{d:02d}-p{k:03d}", f"dev{d:02d}", start))
    return progs
