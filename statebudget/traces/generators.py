"""Deterministic trace generators (trace format v1). Same preset, seed and hours: same bytes.

Shapes come from real data (`fitted.json`, made by `statebudget trace fit`): token lengths from the
Azure LLM inference trace, tool latencies from TraceLab's coding-agent sessions (see `fit.py` for
which tool classes are measured and which are assumed). The program structure (who calls whom)
is ours: no public multi-model agent trace exists (seed 001).

Presets:
- `swe-team`: 10 developers running SWE-style programs: planner -> (coder <-> test <-> reviewer)*,
  the reasoner on hard tasks, the VLM on screenshots, the summarizer at the end. The day drifts
  (phase 0 -> 1 -> 0 over `drift_period_s`): early on the dense coder and the reasoner are hot, at the
  peak the MoE fast-coder and the reviewer are, so model hotness reverses.
- `swe-team-shuffled`: swe-team with the models of each program's calls shuffled among its calls:
  per-model call counts (per program, so globally and over time) are unchanged, the call-graph order
  is gone. Hints follow their call's new model (a wrong hint stays wrong).
- `mapreduce`: fork/join programs; speculative backup branches cancelled when the primary ends.
- `mixed-tenants`: interactive agents (hints) plus background batch programs (no hints, slo batch).
- `long-tail`: a synthetic control for program-level scheduling. Three batch tenants whose programs
  are chains of `LONG_TAIL_ALPHA`-Pareto many calls (1 to 60; CV of the calls per program about 2),
  the heavy-tailed regime in which least-attained-service ordering (PLAS) pays off. The other
  presets' programs, like TraceLab's real sessions, are light-tailed (CV 0.3-0.5). No real data
  is behind this tail. Batch programs (here and in mixed-tenants) send no hints.
- `real-sessions`: TraceLab's real coding-agent rounds (tokens, tool waits, human think times)
  resampled into programs with Poisson arrivals and role-mapped models; read from the real data
  at generation time, unlike the others (`real_sessions.py` says what is real and what is not).

Every call carries `max_tokens`, what a careful runtime asks for by role (`role_max_tokens`: the
next power of two at or above twice the role's 90th-percentile output); its output is clipped to it.

Hints are honest (DESIGN.md §5). Where the runtime announces the next call (a fixed set of nodes
per preset, each always followed by a call), it knows the preset's structure and the program's past
(what ran, the test results it saw, the time of day), not its future: it has a distribution over
the next call's model, the very probabilities the generator draws that call's model with, names a
model drawn from that distribution on a stream of its own (independent of what the program does),
and gives it the probability it assigns that model as the confidence. The hint's `for` is the next
call node, whatever model it runs, and it may be cancelled. So confidences are calibrated: given
what the runtime knows, the named model is right with probability its confidence. `hint_noise` P
degrades hints for sweeps: with probability P the named model is replaced by a uniformly random
other model of the preset; the confidence stays the probability the runtime's distribution gives
the model named, so hints stay calibrated (they name unlikely models more often, with low
confidence) and fewer are right.
"""

from __future__ import annotations

import math

import numpy as np

from ..models.catalog import Catalog
from ..models.trace import Cancel, Hint, Program, Trace, TraceHeader, TraceNode
from .fit import QUANTILES, load_fitted

PRESETS = ("swe-team", "swe-team-shuffled", "mapreduce", "mixed-tenants", "long-tail", "real-sessions")
LONG_TAIL_ALPHA = 1.2  # Pareto shape of the calls per long-tail program (below 2: infinite variance before the cap)
MAX_CONTEXT = 60_000
DRIFT_PERIOD_S = 7200.0
# A tool result appends tokens shaped like TraceLab's per-round appends, scaled per tool class
# (assumed: search results and test logs are long, an approval is a line).
TOOL_RESULT_SCALE = {"search": 1.5, "edit": 0.5, "test": 1.5, "build": 1.0, "approval": 0.1, "shell": 0.7}
SYSTEM_PROMPT_TOKENS = 6000  # an agent's system prompt and tool schemas (Claude Code's is ~10k)
# The models hints may name (agent-team's): `hint_noise` names a uniformly random other one.
HINT_MODELS = ("coder", "fast-coder", "planner", "reasoner", "reviewer", "summarizer", "vlm")


class _Builder:
    """Accumulates one program's nodes, hints and cancels, and its growing context."""

    def __init__(self, gen: "_Gen", pid: str, tenant: str, start: float, slo: str, context: int):
        self.g, self.pid, self.tenant, self.start, self.slo = gen, pid, tenant, start, slo
        self.nodes: list[TraceNode] = []
        self.hints: list[Hint] = []
        self.cancels: list[Cancel] = []
        self.context = context
        self.pending: list[tuple[str, dict[str, float]]] = []  # announced, for the next call made

    def _id(self) -> str:
        return f"n{len(self.nodes) + 1}"

    def call(self, model: str, after: list[str], out_scale: float = 1.0) -> str:
        """A call node; the hints announced since the last call (`expect`) are for it."""
        cap = self.g.role_max_tokens(out_scale)
        out = min(self.g.output_tokens(out_scale), cap)
        nid = self._id()
        self.nodes.append(TraceNode(id=nid, kind="call", model=model, context_tokens=min(self.context, MAX_CONTEXT),
                                    output_tokens=out, max_tokens=cap, after=after))
        self.context += out
        for at, probs in self.pending:
            self.hint(at, nid, probs)
        self.pending = []
        return nid

    def tool(self, tool: str, after: list[str]) -> str:
        nid = self._id()
        self.nodes.append(TraceNode(id=nid, kind="tool", tool=tool, duration=self.g.tool_s(tool), after=after))
        self.context += int(self.g.quantile_sample(self.g.appends) * TOOL_RESULT_SCALE.get(tool, 1.0))
        return nid

    def expect(self, issued_at: str, probs: dict[str, float]) -> None:
        """At `issued_at` the runtime announces the next call, its model distributed as `probs`
        (given what it knows then: the generator must draw that call's model with these very
        probabilities). The hint is written when that call is made (`call`)."""
        self.pending.append((issued_at, probs))

    def hint(self, issued_at: str, for_: str, probs: dict[str, float]):
        model = self.g.hint_model(probs)
        self.hints.append(Hint.model_validate({"issued_at": issued_at, "for": for_, "model": model,
                                               "confidence": round(probs.get(model, 0.0), 3)}))

    def program(self) -> Program:
        return Program(program=self.pid, tenant=self.tenant, start=round(self.start, 3), slo=self.slo,
                       nodes=self.nodes, hints=self.hints, cancel=self.cancels)


class _Gen:
    def __init__(self, preset: str, seed: int, hours: float, load: float = 1.0, hint_noise: float = 0.0):
        self.preset, self.seed, self.hours, self.load, self.hint_noise = preset, seed, hours, load, hint_noise
        self.rng = np.random.default_rng([seed, sum(map(ord, preset))])
        # the runtime's own draws for the models its hints name: apart from the programs' stream
        self.hint_rng = np.random.default_rng([seed, sum(map(ord, preset)), 1])
        fitted = load_fitted()
        self.tools = fitted["tools"]
        self.tok = fitted["tokens"]
        self.appends = fitted["append_tokens_quantiles"]

    def phase(self, t: float) -> float:
        """Day phase in [0, 1]: 0 at the start, 1 half a drift period later, back to 0."""
        return 0.5 * (1 - math.cos(2 * math.pi * t / DRIFT_PERIOD_S))

    def quantile_sample(self, q: list[float]) -> float:
        return float(np.interp(self.rng.random(), QUANTILES, q))

    def initial_context(self) -> int:
        return SYSTEM_PROMPT_TOKENS + int(self.quantile_sample(self.tok["code"]["context_quantiles"]))

    def output_tokens(self, scale: float = 1.0) -> int:
        # Agent turns write more than the chat completions of the Azure trace: conv shape, x3.
        return int(np.clip(self.quantile_sample(self.tok["conv"]["output_quantiles"]) * 3 * scale, 32, 4000))

    def role_max_tokens(self, scale: float = 1.0) -> int:
        """What a careful runtime asks for, for a role whose outputs are `scale` x the usual: the
        next power of two at or above twice the role's 90th-percentile output (a role at scale 1:
        4096; the reasoner, x2: 8192; the VLM and the summarizer, x0.5 and x0.7: 2048)."""
        p90 = float(np.interp(0.9, QUANTILES, self.tok["conv"]["output_quantiles"])) * 3 * scale
        return 1 << max(0, math.ceil(math.log2(max(2 * p90, 1.0))))

    def hint_model(self, probs: dict[str, float]) -> str:
        """The model a hint names: drawn from the runtime's distribution; under `hint_noise` P,
        replaced with probability P by a uniformly random other model."""
        names = sorted(m for m, p in probs.items() if p > 0)
        w = np.array([probs[m] for m in names], dtype=float)
        model = names[int(self.hint_rng.choice(len(names), p=w / w.sum()))]
        if self.hint_noise > 0 and self.hint_rng.random() < self.hint_noise:
            others = [m for m in HINT_MODELS if m != model]
            model = others[int(self.hint_rng.integers(len(others)))]
        return model

    def tool_s(self, tool: str) -> float:
        p = self.tools.get(tool, self.tools["shell"])
        return round(float(np.clip(p["median_s"] * math.exp(self.rng.normal(0, p["sigma"])), 0.05, 1800.0)), 3)

    def starts(self, mean_gap_s: float, offset_max: float = 300.0) -> list[float]:
        end = self.hours * 3600.0
        mean_gap_s /= self.load  # `load` x the preset's program arrival rate
        t = float(self.rng.uniform(0, min(offset_max, mean_gap_s)))
        out = []
        while t < end:
            out.append(t)
            t += float(self.rng.exponential(mean_gap_s))
        return out


# ---- swe-team ------------------------------------------------------------------------------------
def _legacy_draw(rng, conf: float) -> None:
    """The draws trace v1's hints made on the programs' stream (was the hint wrong, and then its
    model): still made, so that a seed's programs are those it gave before hints were honest."""
    if rng.random() > conf:
        rng.integers(3)


def _swe_program(g: _Gen, pid: str, tenant: str, start: float) -> Program:
    rng = g.rng
    ph = g.phase(start)
    b = _Builder(g, pid, tenant, start, "interactive", g.initial_context())
    last = b.call("planner", [])
    p_hard, p_coder, p_review = 0.05 + 0.35 * (1 - ph), 0.1 + 0.8 * (1 - ph), 0.5 + 0.3 * ph
    hard = rng.random() < p_hard
    coder = "coder" if rng.random() < p_coder else "fast-coder"
    t = b.tool("search", [last])
    # While the search runs the runtime announces the next call, not knowing yet whether the task is
    # hard (the reasoner) nor which coder it gets (the dense one is likelier early in the day).
    b.expect(t, {"reasoner": p_hard, "coder": (1 - p_hard) * p_coder, "fast-coder": (1 - p_hard) * (1 - p_coder)})
    legacy = 0.9
    if hard:
        r = b.call("reasoner", [t], out_scale=2.0)
        t = b.tool("shell", [r])
        b.expect(t, {"coder": p_coder, "fast-coder": 1 - p_coder})
        legacy = 0.8
    p_fail = 0.6
    rounds = 0
    while True:
        rounds += 1
        c = b.call(coder, [t])
        if legacy is not None:
            _legacy_draw(rng, legacy)
        e = b.tool("edit", [c])
        if rng.random() < 0.15:  # a UI change: screenshot, read by the VLM
            v = b.call("vlm", [e], out_scale=0.5)
            e = b.tool("edit", [v])
        test = b.tool("build" if rng.random() < 0.3 else "test", [e])
        # Before the test result is in: a review if the test passes (or, a coin, if it fails), else
        # the coder again. The runtime knows the coder and how many rounds failed.
        p_f = p_fail if rounds < 6 else 0.0
        b.expect(test, {"reviewer": 1 - p_f + p_f * p_review, coder: p_f * (1 - p_review)})
        fails = rng.random() < p_fail and rounds < 6
        p_fail *= 0.7
        go_review = (not fails) or rng.random() < p_review
        if go_review:
            rv = b.call("reviewer", [test])
            if fails and rng.random() < 0.25:
                # A speculative deep dive in parallel, abandoned once the review is in.
                dd = b.call("reasoner", [test], out_scale=2.0)
                b.cancels.append(Cancel(node=dd, at_after=rv))
            last = rv
        else:
            last = test
        if not fails:
            if rng.random() < 0.3:
                last = b.tool("approval", [last])
            break
        t = b.tool("shell", [last]) if go_review else last
        if go_review:
            b.expect(t, {coder: 1.0})  # the test failed and the review is in: the coder again
        legacy = 0.75 if go_review else None
    s = b.tool("shell", [last])
    b.expect(s, {"summarizer": 1.0})  # the tests pass: the summary
    b.call("summarizer", [s], out_scale=0.7)
    return b.program()


def gen_swe_team(g: _Gen, developers: int = 10, mean_gap_s: float = 420.0) -> list[Program]:
    progs = []
    for d in range(developers):
        for k, start in enumerate(g.starts(mean_gap_s)):
            progs.append(_swe_program(g, f"dev{d:02d}-p{k:03d}", f"dev{d:02d}", start))
    return progs


def shuffle_phases(rng: np.random.Generator, progs: list[Program]) -> list[Program]:
    out = []
    for p in progs:
        calls = [n for n in p.nodes if n.kind == "call"]
        models = [n.model for n in calls]
        perm = rng.permutation(len(models))
        new_model = {n.id: models[int(j)] for n, j in zip(calls, perm)}
        old_model = {n.id: n.model for n in calls}
        nodes = [n.model_copy(update={"model": new_model[n.id]}) if n.kind == "call" else n for n in p.nodes]
        hints = []
        for h in p.hints:
            # A right hint follows its call's new model; a wrong one stays wrong (where it would now
            # be right by chance it names the call's old model, which is not its new one): so each
            # hint is right as often as before, and its confidence stays calibrated.
            if h.model == old_model[h.for_]:
                model = new_model[h.for_]
            else:
                model = old_model[h.for_] if h.model == new_model[h.for_] else h.model
            hints.append(h.model_copy(update={"model": model}))
        out.append(p.model_copy(update={"nodes": nodes, "hints": hints}))
    return out


# ---- mapreduce -----------------------------------------------------------------------------------
def gen_mapreduce(g: _Gen, mean_gap_s: float = 90.0) -> list[Program]:
    rng = g.rng
    progs = []
    for k, start in enumerate(g.starts(mean_gap_s)):
        b = _Builder(g, f"mr-p{k:04d}", f"team{k % 3}", start, "interactive", g.initial_context())
        root = b.call("planner", [])
        p_sum, p_reason = 0.6, 0.3
        mapper = "summarizer" if rng.random() < p_sum else "fast-coder"
        joins = []
        base_ctx = b.context
        for _ in range(int(rng.integers(3, 9))):
            b.context = base_ctx
            t = b.tool("search", [root])
            # every branch's search starts as the plan ends: no mapper has run yet
            b.expect(t, {"summarizer": p_sum, "fast-coder": 1 - p_sum})
            m = b.call(mapper, [t])
            joins.append(m)
            if rng.random() < 0.2:  # a speculative backup of a slow branch, cancelled when the primary ends
                bk = b.call(mapper, [t])
                b.cancels.append(Cancel(node=bk, at_after=m))
        b.context = base_ctx + 400 * len(joins)
        reducer = "reasoner" if rng.random() < p_reason else "reviewer"
        b.expect(joins[0], {"reasoner": p_reason, "reviewer": 1 - p_reason})
        b.call(reducer, joins, out_scale=1.5)
        progs.append(b.program())
    return progs


# ---- mixed-tenants -------------------------------------------------------------------------------
def gen_mixed_tenants(g: _Gen) -> list[Program]:
    progs = gen_swe_team(g, developers=5, mean_gap_s=600.0)
    return progs + _batch_chains(g, "batch", lambda rng: int(rng.integers(2, 6)))


def _batch_chains(g: _Gen, prefix: str, n_calls, tenants: int = 3, mean_gap_s: float = 240.0) -> list[Program]:
    """Batch tenants `<prefix>0..`: each program a chain of `n_calls(rng)` calls (summarizer or
    planner), each followed by a shell tool, on a long conversation-shaped context."""
    rng = g.rng
    progs = []
    for t in range(tenants):
        for k, start in enumerate(g.starts(mean_gap_s)):
            b = _Builder(g, f"{prefix}{t}-p{k:04d}", f"{prefix}{t}", start, "batch",
                         int(np.clip(g.quantile_sample(g.tok["conv"]["context_quantiles"]) * 4, 500, 40_000)))
            last = None
            for _ in range(n_calls(rng)):
                model = "summarizer" if rng.random() < 0.7 else "planner"
                last = b.call(model, [last] if last else [])
                last = b.tool("shell", [last])
            progs.append(b.program())
    return progs


# ---- long-tail -----------------------------------------------------------------------------------
def gen_long_tail(g: _Gen, max_calls: int = 60) -> list[Program]:
    """mixed-tenants' batch chains, with Pareto-many calls instead of 2 to 5."""
    return _batch_chains(g, "tail", lambda rng: int(min(max_calls, np.floor(rng.pareto(LONG_TAIL_ALPHA) + 1))))


def generate(preset: str, seed: int, hours: float, load: float = 1.0, hint_noise: float = 0.0) -> Trace:
    """A deterministic trace; `load` multiplies every program arrival rate of the preset;
    `hint_noise` is the probability that a hint names a uniformly random other model than the
    runtime drew (its confidence stays calibrated, see the module's docstring). The programs do
    not depend on `hint_noise`, only the models the hints name and their confidences."""
    if preset not in PRESETS:
        raise ValueError(f"unknown trace preset {preset!r} (known: {', '.join(PRESETS)})")
    # an infinite length or rate never ends (nan slips past a plain comparison)
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours must be a positive, finite number, got {hours:g}")
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a positive, finite number, got {load:g}")
    if not 0.0 <= hint_noise <= 1.0:
        raise ValueError(f"hint_noise must be in [0, 1], got {hint_noise}")
    extra = {**({"load": load} if load != 1.0 else {}), **({"hint_noise": hint_noise} if hint_noise else {})}
    if preset in ("swe-team", "swe-team-shuffled"):
        g = _Gen("swe-team", seed, hours, load, hint_noise)  # the shuffled control starts from the very same programs
        progs = gen_swe_team(g)
        if preset == "swe-team-shuffled":
            progs = shuffle_phases(np.random.default_rng([seed, 7]), progs)
    elif preset == "mapreduce":
        g = _Gen(preset, seed, hours, load, hint_noise)
        progs = gen_mapreduce(g)
    elif preset == "long-tail":
        g = _Gen(preset, seed, hours, load, hint_noise)
        progs = gen_long_tail(g)
    elif preset == "real-sessions":
        from .real_sessions import ROUNDS_FILE, gen_real_sessions, load_source

        src = load_source()  # before any draw: a missing data folder fails at once, by name
        g = _Gen(preset, seed, hours, load, hint_noise)
        progs = gen_real_sessions(g, src)
        # the data's digest, not its path: the same seed gives the same bytes on any machine
        extra["real_data"] = {"file": ROUNDS_FILE.as_posix(), "sha256": src.sha256}
    else:
        g = _Gen(preset, seed, hours, load, hint_noise)
        progs = gen_mixed_tenants(g)
    progs.sort(key=lambda p: (p.start, p.program))
    header = TraceHeader(preset=preset, seed=seed, hours=hours, **extra)
    return Trace(header=header, programs=progs)


def for_catalog(trace: Trace, source: Catalog, target: Catalog) -> tuple[Trace, dict[str, str]]:
    """`trace` with each model that `target` lacks renamed, in calls and hints alike, so a preset
    trace (written for `source`, agent-team) runs on a small catalog such as `toy`: to the
    `target` model at the same rank by size (total bytes; the smallest to the smallest, the
    largest to the largest), since a small catalog's sizes are not the source's. Returns the
    trace and the renames made."""
    have = {m.name for m in target.models}
    by_size = sorted(target.models, key=lambda m: (m.total_bytes, m.name))
    ranked = sorted(source.models, key=lambda m: (m.total_bytes, m.name))
    renames = {}
    for i, m in enumerate(ranked):
        if m.name not in have:
            renames[m.name] = by_size[round(i * (len(by_size) - 1) / max(len(ranked) - 1, 1))].name
    if not renames:
        return trace, {}
    progs = []
    for p in trace.programs:
        nodes = [n.model_copy(update={"model": renames.get(n.model, n.model)}) if n.model else n for n in p.nodes]
        hints = [h.model_copy(update={"model": renames.get(h.model, h.model)}) for h in p.hints]
        progs.append(p.model_copy(update={"nodes": nodes, "hints": hints}))
    return trace.model_copy(update={"programs": progs}), renames
