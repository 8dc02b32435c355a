"""No future knowledge (DESIGN.md §5): policies see a call's `max_tokens` or an estimate learnt from
finished calls, never its true `output_tokens` before it ends.

The claim made sharp: replay a trace under a policy, logging every decision it returns (the time,
the hook, what it returned). Then lengthen the true output of the calls that ended after a time T in
that run (to their `max_tokens`: a lengthened call ends no earlier, given the same past) and replay
again. Before the earliest original end time among the changed calls nothing the policy or the
simulator may know differs, so the two logs must be identical up to then. They must differ later
(the change is seen once a changed call ends), and a policy that reads `output_tokens` at arrival
fails the very same check.
"""

from __future__ import annotations

import re

import pytest

from statebudget.models.load import load_catalog, load_cluster
from statebudget.policies import REGISTRY, SEES_FUTURE, make_policy
from statebudget.policies.baselines import BASELINES
from statebudget.policies.ours import StateBudgetLease
from statebudget.sim.config import SimConfig
from statebudget.sim.engine import Simulator
from statebudget.traces.generators import generate

WRAPPED = ("place", "evict_priority", "demote_tier", "may_evict_for_prefetch", "holds_kv")
_ADDR = re.compile(r"0x[0-9a-f]+")


def _log_decisions(policy) -> list:
    """Wrap the policy's decision methods on the instance (the simulator takes its hooks from the
    instance, for the hooks the class overrides), logging (now, hook, repr of what it returned)."""
    log: list = []
    names = [n for n in dir(type(policy)) if n.startswith("on_")] + list(WRAPPED)
    for name in names:
        fn = getattr(policy, name, None)
        if not callable(fn):
            continue

        def wrapper(sim, *args, _fn=fn, _name=name):
            out = _fn(sim, *args)
            log.append((sim.now, _name, _ADDR.sub("0x", repr(out))))
            return out
        setattr(policy, name, wrapper)
    return log


def _run(policy_name, trace, policy=None):
    policy = policy or make_policy(policy_name)
    log = _log_decisions(policy)
    sim = Simulator(load_cluster("hetero16"), load_catalog("agent-team"), trace, policy, config=SimConfig(seed=3))
    sim.run()
    return sim, log


def _lengthen_after(trace, sim, t_cut: float):
    """The trace with the calls that ended after `t_cut` in `sim`'s run writing their `max_tokens`;
    the earliest original end among them."""
    ends = {(c.program, c.node): c.end for c in sim.calls if c.state == "done" and c.end > t_cut}
    progs, changed = [], []
    for p in trace.programs:
        nodes = []
        for n in p.nodes:
            end = ends.get((p.program, n.id))
            if end is not None and n.output_tokens < n.max_tokens:
                n = n.model_copy(update={"output_tokens": n.max_tokens})
                changed.append(end)
            nodes.append(n)
        progs.append(p.model_copy(update={"nodes": nodes}))
    assert changed, "nothing to change: the test would prove nothing"
    return trace.model_copy(update={"programs": progs}), min(changed)


def _before(log, t):
    return [e for e in log if e[0] < t]


class LeakyPlace(BASELINES["prefetch-all"]):
    """Reads the future: places a call by its true output length."""
    name = "leaky"

    def place(self, sim, call):
        groups = sorted(sim.model_groups(sim.catalog.by_name[call.model]))
        return groups[call.output_tokens % len(groups)]


class LeakyPredictor(StateBudgetLease):
    """Reads the future subtly: tells its predictor the call's true duration at arrival."""
    name = "leaky-predictor"

    def on_call_arrive(self, sim, call):
        m = sim.catalog.by_name[call.model]
        groups = sim.model_groups(m)
        expected = sim.cost.call_s(m, call.context_tokens, call.output_tokens, groups[0]) if groups else 0.0
        self._core(sim).predictor.call_arrived(call.program, call.model, sim.now, expected)


@pytest.fixture(scope="module")
def trace():
    return generate("swe-team", 5, hours=0.25)


# Every online policy; `static` plans from the whole trace by definition (offline), and the two
# that see the future (`SEES_FUTURE`) are references. That this check catches them: below.
ONLINE = [p for p in REGISTRY if p != "static" and p not in SEES_FUTURE]


@pytest.mark.parametrize("policy_name", ONLINE)
def test_decisions_before_a_call_ends_do_not_depend_on_its_output(trace, policy_name):
    sim, log = _run(policy_name, trace)
    done = sorted(c.end for c in sim.calls if c.state == "done")
    t_cut = done[len(done) // 3]
    changed, t0 = _lengthen_after(trace, sim, t_cut)
    sim2, log2 = _run(policy_name, changed)
    head, head2 = _before(log, t0), _before(log2, t0)
    assert len(head) > 50, "too few decisions before the first changed call ends to prove anything"
    assert head == head2, next((a, b) for a, b in zip(head, head2) if a != b)
    assert log != log2, "the change never showed: the test has no teeth"


@pytest.mark.parametrize("leaky", [LeakyPlace, LeakyPredictor, REGISTRY["foresight"]])
def test_a_policy_that_reads_output_tokens_fails_the_check(trace, leaky):
    sim, log = _run(leaky.name, trace, leaky())
    done = sorted(c.end for c in sim.calls if c.state == "done")
    changed, t0 = _lengthen_after(trace, sim, done[len(done) // 3])
    _, log2 = _run(leaky.name, changed, leaky())
    assert _before(log, t0) != _before(log2, t0)


def test_a_call_reserves_what_it_asked_for_and_keeps_what_it_wrote(trace):
    sim, _ = _run("prefetch-all", trace)
    est = sim.output_estimate
    finished = [c for c in sim.calls if c.state == "done"]
    assert finished and all(c.output_tokens <= c.max_tokens for c in sim.calls)
    for model in {c.model for c in finished}:
        outs = [c.output_tokens for c in finished if c.model == model]
        assert est.count[model] == len(outs)
        assert 0 < est.expected(model, 10**6) <= max(outs)
