"""What happens to a program's KV while it waits on a tool (seed 003): the one decision code for
the simulator and the live planner. The rules, at each tool start, for the program's KV in HBM:

    preserve  keep it in HBM
    swap      move it to host DRAM now, and back when the program's next call on it arrives, or
              when the planner prefetches it (InferCept's swap, §11); the swap-out is a background transfer within a per-link
              swap budget: the background transfers on a link share one weight, BACKGROUND_SHARE,
              against each foreground load there
    discard   drop it; the next call recomputes it from the committed tokens (§10)
    adaptive  the cheapest plan for this interrupt in expectation over the predicted wait
              distribution (§12, `adaptive_choice`): act now (swap = out + P(resume) x in over
              PCIe; discard = P(resume) x recompute), or preserve (share of the GPU held x the
              seconds held) for a TTL and act then if the tool still runs. The TTL is part of
              the plan (§22: per tool class, from its wait distribution) and the KV is judged
              again when it runs out, on the wait still to come. P(resume) is learned per tool
              class and model (`predictor.ResumeModel`), the waits per tool class. A KV it
              swaps out comes back ahead of the predicted return (§21), as a background
              transfer that takes only free HBM (it evicts nothing); a call that comes back
              while its KV is still on the way raises the transfer to full weight.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from .waits import ResumeModel, ToolWaitModel

KV_RULES = ("preserve", "swap", "discard", "adaptive")
BACKGROUND_SHARE = 0.25  # the weight of all background transfers on a link together, next to each foreground
                        # one: tool-wait KV swaps (§11) and speculative promotes (§21, `Policy.speculation_yields`)
HOLD_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)  # the TTLs the adaptive rule weighs: quantiles of the remaining wait


def host_link_bps(view, group) -> float:
    """The host links of a GPU group (the cost model's h2d bandwidth, one link per GPU)."""
    return view.cost.link_bw[f"h2d:{view.gpus[group[0]].id}"] * len(group)


def adaptive_choice(kv_bytes: float, hbm_bytes: float, pcie_bps: float, recompute_s: float, p_resume: float,
                    waits: ToolWaitModel, tool: str, elapsed_s: float = 0.0) -> tuple[str, float]:
    """The cheapest plan for one KV copy in a tool wait, in GPU-seconds, in expectation over the
    wait's predicted distribution (§12; §22: the TTL comes out of the same costs). Acting now costs
    F, the cheaper of moving the KV out (and back if the program resumes on it) and recomputing it
    (only if it resumes); `p_resume` is the probability that it does:

        swap = (1 + p_resume) x kv_bytes / pcie_bps        discard = p_resume x recompute_s

    Preserving it for a TTL of tau seconds, then acting if the tool still runs, costs

        C(tau) = h E[min(W, e + tau) - e | W > e] + F P(W > e + tau | W > e),   h = kv_bytes / hbm_bytes

    for a wait W (log-normal per tool class, `ToolWaitModel`) that has lasted e. The rule weighs
    tau = 0 (act now), the remaining wait's quantiles `HOLD_QUANTILES`, and tau = inf (hold it until
    the tool returns), and returns (rule, tau): ("preserve", tau > 0), or ("swap" | "discard", 0).
    Preserving pays while the tool is likely to end soon (the wait's hazard above h / F): a median
    alone prices a long-tailed tool's hold at its median, and holds its KV through the tail."""
    h = kv_bytes / max(hbm_bytes, 1.0)
    act = {"swap": (1.0 + p_resume) * kv_bytes / pcie_bps, "discard": p_resume * recompute_s}
    fallback = min(act, key=lambda k: (act[k], k))
    cost_now = act[fallback]
    holds = waits.remaining_quantiles(tool, elapsed_s, HOLD_QUANTILES) + [math.inf]
    best, best_hold = cost_now, 0.0
    for hold, (held, outlasts) in zip(holds, waits.hold_outcomes(tool, elapsed_s, holds)):
        cost = h * held + cost_now * outlasts
        if hold > 0 and cost < best:
            best, best_hold = cost, hold
    return ("preserve", best_hold) if best_hold > 0 else (fallback, 0.0)


@dataclass(frozen=True)
class KvAction:
    """What to do with one suspended KV copy (`ToolWaitKV.decide`)."""
    rule: str                          # preserve | swap | discard
    recheck_at: float | None = None    # preserve: judge it again then, if the tool still runs (the TTL, §22)
    swap_in_at: float | None = None    # swap: bring it back then, before the predicted return (§21)
    new: bool = True                   # counted in `actions` (a TTL that keeps a KV preserved is not)


class ToolWaitKV:
    """A tool-wait KV rule and what it learns as it goes: the one decision code for the simulator
    and the live planner (each mechanism holds one and carries out its actions: a swap is a
    background move to host DRAM, a discard a drop, a preserve nothing until its TTL).

    Per interrupt the mechanism calls `started` (the wait to expect), then `decide` for each KV
    copy of the program that nothing pins; `remaining` again when a TTL runs out, with the wait so
    far; `ended` when the tool returns; `outcome` when the program uses one of its KVs again
    (resumed) or ends (not resumed). It counts the actions (`actions`) and the adaptive rule's
    prediction errors (`ttl_errors`: predicted minus actual wait)."""

    def __init__(self, rule: str = "preserve"):
        if rule not in KV_RULES:
            raise ValueError(f"unknown tool-wait KV rule {rule!r} (known: {', '.join(KV_RULES)})")
        self.rule = rule
        self.waits = ToolWaitModel.from_fit()  # the adaptive rule's predictions, learned as tools end
        self.resume = ResumeModel()  # ... and whether the program comes back to the KV it suspended
        self.pending: dict[tuple, list[str]] = {}  # KV key -> tool classes of its unresolved interrupts
        self.actions: Counter = Counter()
        self.ttl_errors: list[float] = []

    def started(self, tool: str) -> float | None:
        """A tool wait begins: its predicted length (the median), or None if the rule predicts nothing."""
        return self.waits.quantile_remaining(tool, 0.0, 0.5) if self.rule == "adaptive" else None

    def remaining(self, tool: str, elapsed_s: float) -> float:
        """The median wait still to come, given that it has lasted `elapsed_s`."""
        return self.waits.quantile_remaining(tool, elapsed_s, 0.5)

    def suspended(self, kvk: tuple, tool: str) -> None:
        """The program's KV `kvk` has copies suspended by this interrupt (its outcome is learned)."""
        if self.rule == "adaptive":
            self.pending.setdefault(kvk, []).append(tool)

    def decide(self, tool: str, model: str, kv_bytes: float, predicted: float | None, hbm_bytes: float,
               pcie_bps: float, recompute_s: float, now: float, since: float, preserved: bool,
               held: bool = False) -> KvAction:
        """The rule for one KV copy of `kv_bytes` on GPUs of `hbm_bytes` with `pcie_bps` to host,
        `recompute_s` to rebuild it, in a wait that began at `since` with `predicted` seconds still
        expected; `preserved`: the copy is already held for this wait (a TTL re-check); `held`: a
        lease has promised it to a coming call, so every rule keeps it (judged again at the TTL)."""
        rule, hold = self.rule, None
        if held:
            rule = "preserve"
        elif rule == "adaptive":
            rule, hold = adaptive_choice(kv_bytes, hbm_bytes, pcie_bps, recompute_s, self.resume.p(tool, model),
                                         self.waits, tool, now - since)
        new = rule != "preserve" or not preserved  # a TTL that keeps it preserved is no new action
        if new:
            self.actions[rule] += 1
        if rule == "preserve":
            # judged again when its TTL runs out; one held until the tool returns (and a held one)
            # once the wait outlasts its predicted median, at least doubling the wait each time
            if hold is not None and hold < math.inf:
                at = now + max(hold, 1e-3)
            else:
                at = self.next_check(now, since, predicted) if predicted is not None else None
            return KvAction("preserve", recheck_at=at, new=new)
        if rule == "swap":
            return KvAction("swap", swap_in_at=self.swap_in_at(tool, model, kv_bytes, predicted, pcie_bps, now))
        return KvAction("discard")

    @staticmethod
    def next_check(now: float, since: float, left: float) -> float:
        """When a KV held through a wait that began at `since`, with `left` seconds of it still
        expected, is judged again: once that has passed, and no sooner than the wait so far again
        (a wait of T costs about log2(T) checks)."""
        return now + max(left, now - since, 1e-3)

    def swap_in_at(self, tool: str, model: str, kv_bytes: float, predicted: float | None, pcie_bps: float,
                   now: float) -> float | None:
        """When a KV swapped out for this wait comes back: ahead of the predicted return by twice
        its copy at the swap share, if the rule predicts one and the program likely resumes."""
        if predicted is None or self.resume.p(tool, model) < 0.5:
            return None
        return now + max(0.0, predicted - 2 * kv_bytes / (pcie_bps * BACKGROUND_SHARE))

    def decide_copy(self, view, tool: str, copy, predicted: float | None, since: float) -> KvAction:
        """`decide` for a KV copy in a mechanism's books (`view`: the simulator or the live
        planner): its GPUs' HBM, their host link and the recompute time from the one cost model,
        and whether its policy holds it for a lease (`Policy.holds_kv`)."""
        kvk, g = copy.key, copy.group
        m = view.catalog.by_name[kvk[2]]
        return self.decide(tool, kvk[2], copy.nbytes, predicted, sum(view.tiers.hbm_cap[i] for i in g),
                           host_link_bps(view, g),
                           view.cost.prefill_s(m, view.kv_tokens.get(kvk, 0), g), view.now, since,
                           copy.suspended_since is not None, view.policy.holds_kv(view, kvk))

    def ended(self, tool: str, waited_s: float, predicted: float | None) -> None:
        """A tool wait ended after `waited_s`; `predicted` is what `started` said of it."""
        self.waits.observe(tool, waited_s)
        if predicted is not None:
            self.ttl_errors.append(predicted - waited_s)

    def outcome(self, kvk: tuple, resumed: bool) -> None:
        """Teach the resume model how the interrupts of one KV ended."""
        for tool in self.pending.pop(kvk, ()):
            self.resume.observe(tool, kvk[2], resumed)
