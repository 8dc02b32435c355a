"""What a call will write, before it has: a per-model estimate of output tokens, learnt from
finished calls only (and beside it the KV room its calls ask for, `typical_asked`) (DESIGN.md
§5: policies and the planner never see a call's `output_tokens` before it ends). Pure: no clock;
the simulator and the live planner each own one, fed at every call's end, and policies read it
through their view (`output_estimate`)."""

from __future__ import annotations

import numpy as np

PRIOR_SHARE = 0.25  # before a model's first finished call: a quarter of what the call asked for
EWMA_ALPHA = 0.05   # once a model has 1/alpha finished calls: an exponential average (the day drifts)


class OutputEstimate:
    """Per model: the mean output of its finished calls (a running mean for the first
    1/`alpha` calls, then an exponentially weighted one), clipped to the asking call's
    `max_tokens`. Before a model's first finished call: `prior_share` x `max_tokens`."""

    def __init__(self, alpha: float = EWMA_ALPHA, prior_share: float = PRIOR_SHARE):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha, self.prior_share = alpha, prior_share
        self.mean: dict[str, float] = {}
        self.count: dict[str, int] = {}  # per model, moves at each of its observations: its version
        self.asked: dict[str, float] = {}  # per model, the same kind of mean of context + max_tokens
        self.asked_n: dict[str, int] = {}
        self.version = 0  # moves at every observation: what a cache of estimates is keyed by

    def observe(self, model: str, output_tokens: float) -> None:
        """A call of `model` finished having written `output_tokens`."""
        self.version += 1
        self._fold(self.mean, self.count, model, output_tokens)

    def observe_asked(self, model: str, tokens: float) -> None:
        """A call of `model` finished that had asked KV room for `tokens` (its context and
        `max_tokens`, known since it arrived). Moves no output estimate (nor `version`)."""
        self._fold(self.asked, self.asked_n, model, tokens)

    def _fold(self, mean: dict, count: dict, model: str, x: float) -> None:
        """`x` into `model`'s mean: a running mean for its first 1/alpha values, then weighted alpha."""
        n = count[model] = count.get(model, 0) + 1
        old = mean.get(model, 0.0)
        mean[model] = old + max(1.0 / n, self.alpha) * (float(x) - old)

    def forget_asked(self) -> None:
        """Drop what `observe_asked` learnt (before it is learnt again from a ledger)."""
        self.asked.clear()
        self.asked_n.clear()

    def typical_asked(self, model: str) -> float | None:
        """The KV tokens a call of `model` asks room for, the mean over its finished calls in the
        way outputs are (a running mean, then exponentially weighted); None before one finished.
        What a replica must hold beside its weights (`planner/homes.py:scale_out`)."""
        return self.asked.get(model)

    def expected(self, model: str, max_tokens):
        """The output tokens to expect of a call of `model` that asked for `max_tokens`. A number
        or an array of them (calls waiting in a queue: the same arithmetic per element)."""
        m = self.mean.get(model)
        guess = self.prior_share * max_tokens if m is None else m
        if isinstance(max_tokens, np.ndarray):
            return np.minimum(np.maximum(guess, 0.0), max_tokens)
        return float(min(max(guess, 0.0), max_tokens))
