"""Learned estimates of tool waits: how long a wait of each tool class lasts (log-normal, from
decayed moments of the observed log-durations, seeded by the real-data fit), and whether a program
comes back to the KV it suspended. The tool-wait KV rules and the predictor both read them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from ..traces.fit import load_fitted

SQRT2 = math.sqrt(2.0)
_NORMAL = NormalDist()
ANY = "any"  # the wait between a call's end and the program's next call, whatever the tool


@dataclass
class ToolWaitModel:
    """Log-normal tool waits per class from exponentially weighted moments of log-durations."""
    prior: dict[str, tuple[float, float]]  # class -> (median_s, sigma)
    prior_weight: float = 5.0
    half_life_n: float = 200.0  # observations
    stats: dict[str, list[float]] = field(default_factory=dict)  # class -> [w, sum log, sum log^2]

    @classmethod
    def from_fit(cls) -> "ToolWaitModel":
        tools = load_fitted()["tools"]
        return cls({k: (v["median_s"], v["sigma"]) for k, v in tools.items()})

    def observe(self, tool: str, duration_s: float) -> None:
        """One observed wait, for its class and for `any` (the pooled wait after a call)."""
        x = math.log(max(duration_s, 1e-3))
        keep = 0.5 ** (1.0 / self.half_life_n)
        for cls in (tool, ANY):
            s = self.stats.setdefault(cls, [0.0, 0.0, 0.0])
            s[0] = s[0] * keep + 1.0
            s[1] = s[1] * keep + x
            s[2] = s[2] * keep + x * x

    def params(self, tool: str) -> tuple[float, float]:
        """(mu, sigma) of the log-duration."""
        med, sig = self.prior.get(tool, self.prior.get("shell", (1.0, 1.0)))
        w0 = self.prior_weight
        mu0, var0 = math.log(med), sig * sig
        w, s1, s2 = self.stats.get(tool, (0.0, 0.0, 0.0))
        n = w0 + w
        mu = (w0 * mu0 + s1) / n
        ex2 = (w0 * (var0 + mu0 * mu0) + s2) / n
        return mu, math.sqrt(max(ex2 - mu * mu, 0.01))

    def _cdf(self, tool: str):
        mu, sig = self.params(tool)
        return lambda t: 0.5 * (1.0 + math.erf((math.log(max(t, 1e-6)) - mu) / (sig * SQRT2)))

    def p_end_within(self, tool: str, elapsed_s: float, horizon_s: float) -> float:
        """P(wait <= elapsed + h | wait > elapsed)."""
        f = self._cdf(tool)
        done = f(elapsed_s) if elapsed_s > 0 else 0.0
        if done >= 1.0:
            return 1.0
        return min(1.0, max(0.0, (f(elapsed_s + horizon_s) - done) / (1.0 - done)))

    def hold_outcomes(self, tool: str, elapsed_s: float, holds: list[float]) -> list[tuple[float, float]]:
        """For a wait that has lasted `elapsed_s`, and each `hold` (seconds more, `inf` allowed):
        (E[seconds of it that still pass, capped at the hold], P(it outlasts the hold)), i.e.
        E[min(W, e + hold) - e | W > e] and P(W > e + hold | W > e) for W log-normal. Closed
        form: E[min(W, t)] = exp(mu + s^2/2) Phi((ln t - mu - s^2)/s) + t P(W > t); upper tails
        by erfc, so a wait far past its median keeps its precision."""
        mu, sig = self.params(tool)
        mean = math.exp(mu + 0.5 * sig * sig)

        def tails(t: float) -> tuple[float, float]:  # (P(W > t), E[W; W > t] / mean)
            if t <= 0:
                return 1.0, 1.0
            if t == math.inf:
                return 0.0, 0.0
            z = (math.log(t) - mu) / sig
            return 0.5 * math.erfc(z / SQRT2), 0.5 * math.erfc((z - sig) / SQRT2)

        s_e, m_e = tails(elapsed_s)
        if s_e <= 0.0:  # past anything the model can tell apart: it ends any moment
            return [(0.0, 0.0) for _ in holds]
        out = []
        for hold in holds:
            t = elapsed_s + hold
            s_t, m_t = tails(t)
            # integral of P(W > x) over (e, t] = E[min(W, t)] - E[min(W, e)]
            held = mean * (m_e - m_t) - elapsed_s * s_e + (t * s_t if s_t > 0 else 0.0)
            out.append((max(held, 0.0) / s_e, s_t / s_e))
        return out

    def remaining_quantiles(self, tool: str, elapsed_s: float, qs) -> list[float]:
        """`quantile_remaining` for several q at once, in closed form (the inverse normal)."""
        mu, sig = self.params(tool)
        s_e = 0.5 * math.erfc((math.log(elapsed_s) - mu) / (sig * SQRT2)) if elapsed_s > 0 else 1.0
        out = []
        for q in qs:
            tail = (1.0 - q) * s_e
            t = elapsed_s if tail <= 0 else 0.0 if tail >= 1 else math.exp(mu - sig * _NORMAL.inv_cdf(tail))
            out.append(max(0.0, t - elapsed_s))
        return out

    def quantile_remaining(self, tool: str, elapsed_s: float, q: float) -> float:
        """The q-quantile of the remaining wait given it has lasted `elapsed_s`."""
        return self.remaining_quantiles(tool, elapsed_s, (q,))[0]


@dataclass
class ResumeModel:
    """P(a program uses its KV of model m again after a tool wait), per (tool class, model), from
    exponentially weighted outcomes (seed 003 §9-§12: preserving suits a likely return, discarding
    an unlikely one; expected occupancy and restore cost are weighed by this probability).

    It starts from `prior_p` (every interrupt resumes, so no KV is discarded before there is
    evidence) and learns from outcomes: a later call of the program on the same model is a resume; the program ending
    first is not. A (tool, model) pair with few outcomes leans on the model's pooled estimate."""
    prior_p: float = 1.0
    prior_weight: float = 2.0
    half_life_n: float = 200.0  # outcomes
    stats: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (tool, model) -> [w, resumed]

    def observe(self, tool: str, model: str, resumed: bool) -> None:
        keep = 0.5 ** (1.0 / self.half_life_n)
        for key in ((tool, model), (ANY, model)):
            s = self.stats.setdefault(key, [0.0, 0.0])
            s[0] = s[0] * keep + 1.0
            s[1] = s[1] * keep + float(resumed)

    def p(self, tool: str, model: str) -> float:
        w0 = self.prior_weight
        w, r = self.stats.get((ANY, model), (0.0, 0.0))
        pooled = (w0 * self.prior_p + r) / (w0 + w)
        w, r = self.stats.get((tool, model), (0.0, 0.0))
        return (w0 * pooled + r) / (w0 + w)
