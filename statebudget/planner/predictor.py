"""What the planner expects next: which model each live program calls next, and when.

Three online estimates, all forgetting the past at a half-life so they follow hourly drift:

- a Markov model-switch matrix, per tenant and global: `P(next model | last model)`, the tenant's
  counts blended with the global ones (and a uniform prior) so a new tenant starts from the team;
- per tool class, the distribution of tool waits (log-normal, from decayed moments of the observed
  log-durations, seeded by the real-data fit), so `P(the wait ends within h | it has lasted e)`;
- the rate of new programs and their first model.

Together they give, for each live program, the probability that model m (and that program's KV)
is needed within a horizon h:

    P(prog needs m within h) = P(next model = m | last model) x P(next call arrives within h)

A runtime hint, when present, replaces the Markov row for its program by its confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain, compress

import numpy as np

from ..core.waits import ANY, SQRT2, ToolWaitModel

STATE_FORMAT = "statebudget.predictor/1"  # `Predictor.state_dict`'s layout; a change bumps it
MAX_COUNT = 1e12  # a saved decayed count above this is no count (and would overflow the sums)
FORGOTTEN = 1e-3  # a tenant whose decayed counts sum below this (one count ten half-lives on) is not saved
_EDGE = "<start|end>"  # the switch counts' last row (a program's first call) and column (its end)



def _finite(x, what: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"predictor state: {what} is not a number ({x!r})") from None
    if not math.isfinite(v):
        raise ValueError(f"predictor state: {what} is not finite ({x!r})")
    return v


def _count(x, what: str, positive: bool = False) -> float:
    v = _finite(x, what)
    if v < 0 or (positive and v == 0):
        raise ValueError(f"predictor state: {what} must be {'> 0' if positive else '>= 0'}, got {x!r}")
    return v


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF, vectorised (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), in place
    on a few arrays (the planner runs it at every step over every live program):
        z = |x| / sqrt2,  t = 1 / (1 + 0.3275911 z),  erf = 1 - t (a1 + t (a2 + ...)) exp(-z^2)."""
    z = np.abs(x)
    z /= SQRT2
    t = z * 0.3275911
    t += 1.0
    np.divide(1.0, t, out=t)
    poly = t * 1.061405429
    for a in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += a
        poly *= t
    e = z * z
    np.negative(e, out=e)
    np.exp(e, out=e)
    e *= poly
    np.subtract(1.0, e, out=e)  # erf(z)
    out = np.sign(x)
    out *= e
    out += 1.0
    out *= 0.5
    return out


def _lognorm_cdf(t: np.ndarray, mu: np.ndarray, sig: np.ndarray) -> np.ndarray:
    x = np.log(np.maximum(t, 1e-9))
    x -= mu
    x /= sig
    return _norm_cdf(x)


class DecayedCounts:
    """An array of counts that halves every `half_life_s` of (simulated or wall) time."""

    def __init__(self, shape: tuple[int, ...], half_life_s: float):
        self.c = np.zeros(shape)
        self.t = 0.0
        self.half_life_s = half_life_s

    def add(self, index: tuple, now: float, w: float = 1.0) -> None:
        self._decay(now)
        self.c[index] += w

    def grow(self, n: int) -> None:
        """`n` more zero entries along the first axis."""
        self.c = np.concatenate((self.c, np.zeros((n,) + self.c.shape[1:])))

    def _decay(self, now: float) -> None:
        if now > self.t:
            self.c *= 0.5 ** ((now - self.t) / self.half_life_s)
            self.t = now

    def rows(self, now: float) -> np.ndarray:
        self._decay(now)
        return self.c


@dataclass
class LiveProgram:
    """What the predictor knows of one running program."""
    program: str
    tenant: str
    last_model: str | None = None
    phase: str = "call"  # "call" (a call is running) or "tool" (waiting on a tool)
    tool: str | None = None
    since: float = 0.0
    call_end_s: float = 0.0  # when the running call is expected to end
    last_arrival: float | None = None
    running_calls: int = 0
    hint: tuple[str, float, str | None] | None = None  # (model, confidence, call) announced for the next call
    rec: tuple | None = field(default=None, repr=False, compare=False)  # its row of `Predictor._state`; None when changed
    # where `rec` is in `Predictor._rows`; -1: not yet, -2: ended or replaced by a restart
    row: int = field(default=-1, repr=False, compare=False)


class Predictor:
    def __init__(self, models: list[str], half_life_s: float = 1800.0, prior: float = 0.5,
                 tenant_weight: float = 2.0):
        self.models = list(models)
        self.idx = {m: i for i, m in enumerate(self.models)}
        self.half_life_s, self.prior, self.tenant_weight = half_life_s, prior, tenant_weight
        self.called: set[str] = set()         # models some call has asked for
        self.first_call_s: float | None = None
        n = len(self.models)
        # rows: last model, then START (a program's first call); columns: next model, then END
        self.global_switch = DecayedCounts((n + 1, n + 1), half_life_s)
        self.cycle_s = 20.0  # EWMA of the time between a program's successive call arrivals
        self.lookahead = 3
        # every tenant's counts stacked by tenant index (`_tenants`): one decay for all of them
        self.tenant_switch = DecayedCounts((0, n + 1, n + 1), half_life_s)
        self.tools = ToolWaitModel.from_fit()
        self.live: dict[str, LiveProgram] = {}
        self.program_starts = DecayedCounts((1, 1), half_life_s)  # [0,0]: decayed count of starts
        self._version = 0  # bumped by every event; keys the per-program arrays
        self._cache_key = None
        self._cache = None
        self._memo: dict[tuple, object] = {}
        self._tenants: dict[str, int] = {}            # tenant -> index in the per-program rows
        self._classes: dict[str, int] = {ANY: 0}      # tool class -> index
        self._params: np.ndarray | None = None        # `_tool_params`, until a wait is observed
        self._rows_array: np.ndarray | None = None    # `_rows`: the last rows, for `_rows_progs`
        self._rows_progs: list[LiveProgram] = []
        self._born: list[LiveProgram] = []            # started since the last `_rows`
        self._gone = False                            # a program in `_rows_progs` has ended since then
        self._dirty: list[LiveProgram] = []           # programs whose row an event dropped
        self._ids_of: list[LiveProgram] | None = None  # `next_model_probs`: `_ids` are of these
        self._ids: list[str] = []
        self._counts_version = 0                      # bumped by every switch count added
        self._tenant_key: tuple | None = None         # `_tenant_matrices`: what its last answer is for
        self._tenant_mats: np.ndarray | None = None

    # ---- events -------------------------------------------------------------------------------
    def program_started(self, program: str, tenant: str, now: float) -> None:
        self._start(program, tenant, now)
        self.program_starts.add((0, 0), now)

    def program_resumed(self, program: str, tenant: str, now: float, last_model: str | None = None,
                        waits=()) -> None:
        """A program that ran before a restart comes back: no new start; its next call is a switch
        from `last_model`, not a program's first call; `waits`: its running tool waits, (tool,
        since) each, the latest setting its phase."""
        lp = self._start(program, tenant, now)
        if last_model in self.idx:
            lp.last_model = last_model
        for tool, since in sorted(waits, key=lambda w: w[1]):
            self.tool_started(program, tool, since)

    def _start(self, program: str, tenant: str, now: float) -> LiveProgram:
        self._version += 1
        old = self.live.get(program)
        if old is not None:  # the same id again: it keeps its place in `live`, so rows are rebuilt
            old.row, self._rows_array = -2, None
        lp = self.live[program] = LiveProgram(program, tenant, since=now)
        self._born.append(lp)
        return lp

    def call_arrived(self, program: str, model: str, now: float, expected_s: float = 0.0) -> None:
        self._version += 1
        if model in self.idx:
            self.called.add(model)
            if self.first_call_s is None:
                self.first_call_s = now
        lp = self.live.get(program)
        if lp is None or model not in self.idx:
            return
        row = self.idx[lp.last_model] if lp.last_model in self.idx else len(self.models)
        self._counts_version += 1
        self.global_switch.add((row, self.idx[model]), now)
        self.tenant_switch.add((self._tenant(lp.tenant), row, self.idx[model]), now)
        if lp.last_arrival is not None:
            self.cycle_s = 0.9 * self.cycle_s + 0.1 * (now - lp.last_arrival)
        lp.last_arrival = now
        lp.last_model, lp.phase, lp.since, lp.hint = model, "call", now, None
        lp.call_end_s = max(lp.call_end_s if lp.running_calls else 0.0, now + expected_s)
        lp.running_calls += 1
        self._drop_row(lp)

    def call_finished(self, program: str, now: float) -> None:
        self._version += 1
        lp = self.live.get(program)
        if lp is not None:
            lp.running_calls = max(0, lp.running_calls - 1)
            if lp.running_calls == 0 and lp.phase == "call":
                lp.phase, lp.tool, lp.since = "tool", None, now
                self._drop_row(lp)

    def tool_started(self, program: str, tool: str, now: float) -> None:
        self._version += 1
        lp = self.live.get(program)
        if lp is not None and lp.running_calls == 0:
            lp.phase, lp.tool, lp.since = "tool", tool, now
            self._drop_row(lp)

    def tool_finished(self, program: str, tool: str, duration_s: float, now: float) -> None:
        self._version += 1
        self.tools.observe(tool, duration_s)
        self._params = None

    def hinted(self, program: str, model: str, confidence: float, call: str | None = None) -> None:
        self._version += 1
        lp = self.live.get(program)
        if lp is not None:
            lp.hint = (model, confidence, call)
            self._drop_row(lp)

    def call_cancelled(self, program: str, call: str, arrived: bool = True, now: float = 0.0) -> None:
        """A branch was abandoned, or a call attempt failed: a hint announced for it no longer
        holds, and a call that had arrived no longer runs (as if it had finished)."""
        self._version += 1
        lp = self.live.get(program)
        if lp is not None and lp.hint is not None and lp.hint[2] == call:
            lp.hint = None
            self._drop_row(lp)
        if arrived:
            self.call_finished(program, now)

    def program_finished(self, program: str, now: float = 0.0) -> None:
        self._version += 1
        lp = self.live.pop(program, None)
        if lp is not None:
            lp.row, self._gone = -2, True
        if lp is not None and lp.last_model in self.idx:
            n = len(self.models)
            self._counts_version += 1
            self.global_switch.add((self.idx[lp.last_model], n), now)
            self.tenant_switch.add((self._tenant(lp.tenant), self.idx[lp.last_model], n), now)

    # ---- what it has learnt, saved and taken up again -----------------------------------------
    def state_dict(self, now: float) -> dict:
        """What the predictor has learnt, as plain JSON: the switch counts (global and per tenant,
        decayed to `now`), the rate of program starts, the tool-wait moments, the call cycle and
        the models called. Live programs are not in it: they are the runtime's, and a restart
        brings them back (`program_resumed`). Rows and columns are named by model, so a catalog that
        gained or lost models keeps what the two share."""
        names = self.models + [_EDGE]
        return {"format": STATE_FORMAT, "half_life_s": self.half_life_s, "models": names,
                "switch": self.global_switch.rows(now).tolist(),
                # a tenant whose counts have decayed away adds nothing to the team's: not kept
                "tenants": {t: c.tolist() for t, c in zip(self._tenants, self.tenant_switch.rows(now))
                            if c.sum() >= FORGOTTEN},
                "program_starts": float(self.program_starts.rows(now)[0, 0]),
                "tools": {k: list(v) for k, v in self.tools.stats.items()},
                "cycle_s": self.cycle_s, "called": sorted(self.called),
                "called_for_s": None if self.first_call_s is None else now - self.first_call_s}

    @classmethod
    def check_state(cls, state) -> None:
        """ValueError, saying what is wrong, unless `state` is a `state_dict` that a predictor over
        its own models takes up (checked by doing so, on a throwaway one)."""
        names = state.get("models") if isinstance(state, dict) else None
        ok = isinstance(names, list) and all(isinstance(m, str) for m in names)
        cls(names[:-1] if ok else []).load_state_dict(state, 0.0)  # a bad state raises, saying why

    def load_state_dict(self, state: dict, now: float) -> None:
        """Take up what `state_dict` saved, as learnt just before `now`: counts are not decayed over
        the time the planner was down (a restart does not change the workload). Models the saved
        state does not know start from zero counts; models it knows that the catalog has lost are
        dropped. Counts saved under another half-life are scaled to this one's (the same rates).
        Raises ValueError, saying what is wrong, for anything but such a state; then nothing of it
        is taken up."""
        try:
            switch, stacked, tenants, starts, tools, cycle_s, first, called = self._read_state(state, now)
        except (TypeError, AttributeError, KeyError, OverflowError) as e:
            raise ValueError(f"predictor state: not one `state_dict` wrote ({type(e).__name__}: {e})") from None
        self.global_switch.c, self.global_switch.t = switch, now
        self._tenants = {t: i for i, t in enumerate(tenants)}
        self.tenant_switch.c, self.tenant_switch.t = stacked, now
        self.program_starts.c[0, 0], self.program_starts.t = starts, now
        self.tools.stats, self.cycle_s, self.first_call_s, self.called = tools, cycle_s, first, called
        for lp in self.live.values():  # their rows carry tenant indices: written again
            lp.row, lp.rec = -2, None
        self._rows_array, self._rows_progs, self._born, self._gone, self._dirty = None, [], [], False, []
        self._params, self._tenant_key, self._tenant_mats = None, None, None
        self._version += 1
        self._counts_version += 1

    def _read_state(self, state, now: float) -> tuple:
        """`load_state_dict`'s parts, each read and checked before anything changes."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"predictor state: format {got!r}, expected {STATE_FORMAT!r}")
        missing = [k for k in ("models", "switch", "program_starts") if k not in state]
        if missing:
            raise ValueError(f"predictor state: no {', '.join(map(repr, missing))}")
        names = state["models"]
        if not isinstance(names, list) or not all(isinstance(m, str) for m in names):
            raise ValueError("predictor state: 'models' must be a list of model names")
        if not names or names[-1] != _EDGE:
            raise ValueError(f"predictor state: 'models' must end with {_EDGE!r}")
        mine = self.models + [_EDGE]
        pos = {m: i for i, m in enumerate(mine)}
        src = [i for i, m in enumerate(names) if m in pos]
        dst = [pos[names[i]] for i in src]
        scale = self.half_life_s / _count(state.get("half_life_s", self.half_life_s), "half_life_s", positive=True)
        if not 1e-6 <= scale <= 1e6:
            raise ValueError(f"predictor state: half_life_s {state.get('half_life_s')!r} is not within 1e6x of "
                             f"this predictor's {self.half_life_s:g} s")

        def mapped(rows, what: str) -> np.ndarray:
            a = np.asarray(rows, dtype=float)
            if a.shape != (len(names), len(names)):
                raise ValueError(f"predictor state: {what} of shape {a.shape}, expected "
                                 f"{(len(names), len(names))} (one row and column per name in 'models')")
            if not (np.isfinite(a).all() and (a >= 0).all() and (a <= MAX_COUNT).all()):
                raise ValueError(f"predictor state: {what} holds a negative, non-finite or huge count "
                                 f"(over {MAX_COUNT:g})")
            out = np.zeros((len(mine), len(mine)))
            out[np.ix_(dst, dst)] = a[np.ix_(src, src)] * scale
            return out

        tenants = state.get("tenants", {})
        if not isinstance(tenants, dict):
            raise ValueError(f"predictor state: 'tenants' must map tenant to counts, got {type(tenants).__name__}")
        stacked = (np.stack([mapped(rows, f"tenant {t!r}'s switch matrix") for t, rows in tenants.items()])
                   if tenants else np.zeros((0, len(mine), len(mine))))
        tools = state.get("tools", {})
        if not isinstance(tools, dict) or not all(isinstance(v, (list, tuple)) and len(v) == 3 for v in tools.values()):
            raise ValueError("predictor state: 'tools' must map a tool class to [weight, sum log, sum log^2]")
        tools = {str(k): [_count(v[0], f"tools[{k!r}]"), *(_finite(x, f"tools[{k!r}]") for x in v[1:])]
                 for k, v in tools.items()}
        if any(abs(x) > 1e3 * MAX_COUNT for v in tools.values() for x in v):  # log-waits are tens at most
            raise ValueError(f"predictor state: 'tools' holds a moment over {1e3 * MAX_COUNT:g}")
        age = state.get("called_for_s")
        first = None if age is None else now - _count(age, "called_for_s")
        called = {m for m in state.get("called", ()) if m in self.idx}
        starts = _count(state["program_starts"], "program_starts")
        if starts > MAX_COUNT:
            raise ValueError(f"predictor state: program_starts {starts:g} is over {MAX_COUNT:g}")
        return (mapped(state["switch"], "the switch matrix"), stacked, list(tenants), starts * scale, tools,
                _count(state.get("cycle_s", self.cycle_s), "cycle_s", positive=True), first, called)

    # ---- estimates ----------------------------------------------------------------------------
    def switch_matrix(self, now: float, tenant: str | None = None) -> np.ndarray:
        """Row-stochastic P(next | last) over the models then END (the program ends); the last
        row is P(first model of a program)."""
        key = ("switch", self._version, now, tenant)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._switch_matrix(now, tenant)
        return hit

    def _switch_matrix(self, now: float, tenant: str | None) -> np.ndarray:
        if tenant is not None and tenant in self._tenants:
            return self._tenant_matrices(now)[self._tenants[tenant]]
        return self._stochastic(self.global_switch.rows(now))

    def _stochastic(self, counts: np.ndarray) -> np.ndarray:
        """Counts plus the uniform prior, each row (the last axis) normalised to sum to 1."""
        c = counts + self.prior / counts.shape[-1]
        return c / c.sum(axis=-1, keepdims=True)

    def _state(self, now: float, use_hints: bool):
        """Per-live-program arrays, rebuilt only when an event changed something (or the clock
        moved). The rows are kept between steps (`_rows`); the rest is numpy."""
        key = (self._version, now, use_hints)
        if self._cache_key == key:
            return self._cache
        self._memo.clear()  # every memo is keyed by the same version and clock
        n = len(self.models)
        a = self._rows()
        progs = self._rows_progs  # kept while no program starts or ends, so are their ids (`next_model_probs`)
        rows, tenant, cls, hinted = a[:, (0, 1, 3, 6)].T.astype(int)
        in_call = a[:, 2] > 0
        no_tool = ~in_call & (cls < 0)
        cls = np.maximum(cls, 0)
        # row `rows` of tenant `tenant`'s matrix, gathered from the stack seen as one table of rows
        # no live program: no rows to gather, and the counts are not decayed to this time
        q = (self._tenant_matrices(now).reshape(-1, n + 1).take(tenant * (n + 1) + rows, axis=0)[:, :n]
             if len(progs) else np.zeros((0, n)))
        h = np.nonzero(hinted >= 0)[0] if use_hints else ()
        if len(h):
            conf = a[h, 7]
            q[h] *= (1.0 - conf)[:, None]
            q[h, hinted[h]] += conf
        elapsed = np.where(in_call, 0.0, now - a[:, 4])
        call_left = np.where(in_call, np.maximum(0.0, a[:, 5] - now), 0.0)
        params = self._tool_params()
        mu, sig = params.take(cls, axis=0).T
        self._cache_key = key
        self._cache = (progs, q, in_call, no_tool, mu, sig, elapsed, call_left)
        return self._cache

    def _drop_row(self, lp: LiveProgram) -> None:
        """An event changed what the program's row says: it is written again at the next `_rows`."""
        if lp.rec is not None:
            lp.rec = None
            self._dirty.append(lp)

    def _rows(self) -> np.ndarray:
        """The live programs' rows as an array (in `live` order, in `_rows_progs`), kept between
        steps: programs that ended are cut out, those that started are appended (as `live` orders
        them) and only the rows an event dropped are written again, so a step costs what changed."""
        a, progs, born, dirty = self._rows_array, self._rows_progs, self._born, self._dirty
        if a is not None and not born and not self._gone:
            for lp in dirty:
                if lp.rec is None:  # not written again already
                    a[lp.row] = self._row(lp)
            dirty.clear()
            return a
        if a is None:  # first step, or an id started again (`program_started`)
            progs, first = list(self.live.values()), 0
            a = self._fresh(progs)
        else:
            if self._gone:
                keep = [lp.row != -2 for lp in progs]
                progs = list(compress(progs, keep))
                a = a[np.fromiter(keep, bool, len(keep))]
            born = [lp for lp in born if lp.row != -2]
            # with none cut out, the kept rows keep their places: only the born are numbered
            first = 0 if self._gone else len(progs)
            progs = progs + born
            a = np.concatenate((a, self._fresh(born))) if born else a
        for i in range(first, len(progs)):
            progs[i].row = i
        for lp in dirty:
            if lp.row >= 0 and lp.rec is None:
                a[lp.row] = self._row(lp)
        self._rows_array, self._rows_progs = a, progs
        self._born, self._gone, self._dirty = [], False, []
        return a

    def _fresh(self, progs: list[LiveProgram]) -> np.ndarray:
        # flattened rows: numpy reads a flat iterator several times faster than nested tuples
        flat = chain.from_iterable([lp.rec or self._row(lp) for lp in progs])
        return np.fromiter(flat, dtype=float, count=8 * len(progs)).reshape(len(progs), 8)

    def _tenant(self, tenant: str) -> int:
        """The tenant's index in the per-program rows and the stacked counts."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = len(self._tenants)
            self.tenant_switch.grow(1)
        return t

    def _tenant_matrices(self, now: float) -> np.ndarray:
        """`switch_matrix(now, tenant)` of every tenant, stacked by tenant index, in one numpy pass
        (a tenant with no counts adds exact zeros to the global ones)."""
        key = (now, self._counts_version, len(self._tenants))
        if self._tenant_key == key:  # same counts at the same clock: the same matrices
            return self._tenant_mats
        c = self.global_switch.rows(now) + self.tenant_weight * self.tenant_switch.rows(now)
        self._tenant_key, self._tenant_mats = key, self._stochastic(c)
        return self._tenant_mats

    def _tool_params(self) -> np.ndarray:
        """(mu, sigma) per tool class index; they change only when a wait is observed or a class
        is first seen."""
        if self._params is None or len(self._params) != len(self._classes):
            self._params = np.array([self.tools.params(c) for c in self._classes])
        return self._params

    def _row(self, lp: LiveProgram) -> tuple:
        """A program's row: last-model row of the switch matrix, tenant, in a call (1/0), tool class
        (-1: between a call and the next event), since, call end, hinted model (-1: none), hint
        confidence."""
        tool = lp.phase == "tool"
        tenant = self._tenant(lp.tenant)
        cls = 0
        if tool:
            cls = -1 if lp.tool is None else self._classes.setdefault(lp.tool, len(self._classes))
        hint = lp.hint if lp.hint is not None and lp.hint[0] in self.idx else None
        lp.rec = (self.idx.get(lp.last_model, len(self.models)), tenant, 0 if tool else 1, cls, lp.since,
                  lp.call_end_s, -1 if hint is None else self.idx[hint[0]], 0.0 if hint is None else hint[1])
        return lp.rec

    def next_model_probs(self, now: float, use_hints: bool = True) -> tuple[list[str], np.ndarray]:
        """(program ids, matrix [programs x models]) of P(the program's next call is on model m);
        a runtime hint replaces the row by its confidence (the rest keeps the row's shape)."""
        progs, q, *_ = self._state(now, use_hints)
        if self._ids_of is not progs:  # the ids of the same programs, kept while they are live
            self._ids_of, self._ids = progs, [lp.program for lp in progs]
        return self._ids, q

    def p_next_within(self, now: float, horizon_s, use_hints: bool = True) -> np.ndarray:
        """For each live program (in `live` order): P(its next call arrives within the horizon):
        the rest of its tool wait, or — while a call runs — the call's end plus a tool wait. With
        an array of horizons, one row per horizon."""
        _, _, in_call, no_tool, mu, sig, elapsed, call_left = self._state(now, use_hints)
        # one CDF pass over horizon 0 and each horizon: row 0 is f0, P(the wait ended by now)
        # (0 in a call, where it ends at or before now), the same for every horizon
        h = np.append(0.0, horizon_s)[:, None]
        end = np.where(in_call, h - call_left, elapsed + h)
        f = np.where(end > 0, _lognorm_cdf(end, mu, sig), 0.0)
        f0, f1 = f[0], f[1:]
        p = np.where(f0 < 1.0, (f1 - f0) / np.maximum(1.0 - f0, 1e-12), 1.0)
        p = np.minimum(np.maximum(np.where(no_tool, 0.9, p), 0.0), 1.0)  # no tool yet: soon
        return p if np.ndim(horizon_s) else p[0]

    def need_within(self, now: float, horizon_s: float, use_hints: bool = True) -> tuple[list[str], np.ndarray]:
        """(programs, [programs x models]) of P(the program needs model m within the horizon),
        looking `lookahead` calls ahead along the switch matrix: the j-th next call comes about
        (j - 1) call cycles after the next one."""
        self.prepare(now, (horizon_s,), use_hints)
        return self._memo[("need", self._version, now, horizon_s, use_hints)]

    def prepare(self, now: float, horizons, use_hints: bool = True) -> None:
        """Compute `need_within` for several horizons in one pass (a planning step asks for two)."""
        todo = [h for h in horizons if ("need", self._version, now, h, use_hints) not in self._memo]
        if todo:
            for h, hit in zip(todo, self._need_within(now, todo, use_hints)):
                self._memo[("need", self._version, now, h, use_hints)] = hit

    def _need_within(self, now: float, horizons: list, use_hints: bool) -> list:
        progs, q = self.next_model_probs(now, use_hints)
        n = len(self.models)
        step = self.switch_matrix(now)[:n, :n]  # model -> model, END mass dropped
        # the j-th call ahead counts while h - j x cycle is still ahead (the next call always)
        lefts = [[h] + [left for j in range(1, self.lookahead) if (left := h - j * self.cycle_s) > 0]
                 for h in horizons]
        ahead = sorted({left for ls in lefts for left in ls})
        p = dict(zip(ahead, self.p_next_within(now, np.asarray(ahead), use_hints)))
        qs = [q]  # q along the switch matrix, j calls ahead
        out = []
        for ls in lefts:
            miss = 1.0 - q * p[ls[0]][:, None]
            for j, left in enumerate(ls[1:], start=1):
                if len(qs) <= j:
                    qs.append(qs[-1] @ step)
                miss *= 1.0 - qs[j] * p[left][:, None]
            out.append((progs, 1.0 - miss))
        return out

    def model_need_within(self, now: float, horizon_s: float, use_hints: bool = True) -> np.ndarray:
        """Per model: P(some program, live or new, calls it within the horizon)."""
        _, p = self.need_within(now, horizon_s, use_hints)
        miss = np.multiply.reduce(1.0 - p, axis=0) if len(p) else np.ones(len(self.models))
        rate = self.program_starts.rows(now)[0, 0] * math.log(2) / self.half_life_s  # starts per second
        first = self.switch_matrix(now)[len(self.models), :len(self.models)]
        miss = miss * np.exp(-rate * horizon_s * first)
        return 1.0 - miss
