"""The policy interface: policies return decisions, the mechanism (simulator or live planner)
applies them. Every method receives the mechanism as a read-only view (`sim`).

An `on_*` hook returns a list of decisions (`core/decisions.py`: Promote, PromoteHost, Demote,
Cancel), or None; `on_waiting` alone returns calls to move. The simulator binds a call to a
group when it arrives, and `on_waiting` may move it while it waits; the service binds a call only
when it starts.

Eviction is a key function (`evict_priority`: lower goes first) and a tier (`demote_tier`): the
structure that evicts does not know which policy it serves.
"""

from __future__ import annotations

import math

from ..core.costs import expected_missing_pages
from ..models.state import kv_key, weights_key
from ..planner.homes import dense_fits, most_free


class Policy:
    name = "base"
    tick_s: float | None = None
    demote_to = "none"  # where evicted copies go: "host" (sleep / KV offload) or "none" (drop)
    # The oracle and `foresight` read the trace's future: references, never baselines or contenders.
    sees_future = False
    # Speculation yields to demand (seed 003 §21): a promote that no lease asked for loads as a
    # background transfer (BACKGROUND_SHARE of a link until a call waits for it), and a call that
    # needs the room may cancel it while its bytes are still moving. Off for every policy: at
    # saturation it did not pay (BENCHMARKS.md, "Speculation yields to demand").
    speculation_yields = False

    # ---- what a restart keeps ----------------------------------------------------------------------
    def learnt(self, now: float) -> dict | None:
        """What the policy has learnt from the calls so far that a restart should keep, as plain
        JSON (None: nothing; its configuration is not learnt). `take_up` starts from it."""
        return None

    def take_up(self, state: dict, now: float) -> None:
        """Start from what `learnt` saved (from the same policy), before or at the first hook."""
        if state is not None:
            raise ValueError(f"policy {self.name!r} learns nothing a restart keeps; got a saved state")

    # ---- placement ------------------------------------------------------------------------------
    def place(self, sim, call):
        return default_place(sim, call)

    # ---- eviction ------------------------------------------------------------------------------
    def evict_priority(self, sim, copy):
        return copy.last_use  # LRU

    def demote_tier(self, sim, copy) -> str:
        return self.demote_to

    def may_evict_for_prefetch(self, sim, victim, key, group) -> bool:
        """Whether a prefetch of `key` onto `group` may evict the copy `victim`."""
        return True

    def holds_kv(self, sim, kvk) -> bool:
        """The policy has promised this KV to a coming call (a lease): a tool-wait rule keeps it."""
        return False

    # ---- hooks -----------------------------------------------------------------------------------
    def on_call_arrive(self, sim, call):
        return None

    def on_call_admitted(self, sim, call):
        """The call has its HBM reserved and its state pinned on its group."""
        return None

    def on_call_refused(self, sim, call):
        """The engine on `call.group` refused the call (its own expert pages could not fit there,
        `call.refused` lists the groups that did); `place` is asked next. The simulator's only:
        the service sees no refusals."""
        return None

    def on_call_end(self, sim, call):
        return None

    def on_hint(self, sim, program, hint):
        return None

    def on_hints(self, sim, program, hints):
        """The hints announced when a node starts (several compete for the same links)."""
        out = []
        for h in hints:
            out += self.on_hint(sim, program, h) or []
        return out

    def on_program_start(self, sim, program):
        return None

    def on_tool_start(self, sim, program, node, tool):
        return None

    def on_tool_end(self, sim, program, node, tool, duration_s):
        return None

    def on_call_cancelled(self, sim, call):
        return None

    def on_copy_ready(self, sim, copy):
        return None

    def on_program_end(self, sim, program):
        return None

    def on_tick(self, sim):
        return None

    def on_waiting(self, sim, calls):
        """After each pass that admits waiting calls, `calls` (in the queue's order) still wait
        for HBM. Returns [(program, node, group)], calls to move there (not decisions); the
        mechanism moves a call only where it is admitted at once. None: every call waits where it
        was placed, as in the tools people run today, which bind a request to an instance when it
        arrives."""
        return None


def restore_estimate_s(sim, call, group) -> float:
    """Uncontended seconds to make a call's state ready on `group`, from the best tiers now, its
    expert pages by how often calls touch them (`expected_missing_pages`)."""
    m = sim.catalog.by_name[call.model]
    cost = sim.cost
    node = sim.gpus[group[0]].node
    total = 0.0
    w = weights_key(m.name)
    if (w, group) not in sim.tiers.gpu:
        src = sim.best_source(w, group)
        kind, where = src.split(":", 1)
        total += cost.weights_restore_s(m, kind, where, group, wake=sim.tiers.asleep_on(w, group))
    missing_pages = expected_missing_pages(m, group, sim.tiers.gpu)
    if missing_pages:
        total += cost.group_transfer_s(missing_pages * m.moe.page_bytes, "nvme", node, group)
    kvk = kv_key(call.program, call.model)
    T = sim.kv_tokens.get(kvk, 0)
    if T and (kvk, group) not in sim.tiers.gpu:
        src = sim.best_source(kvk, group)
        total += cost.kv_restore(m, T, src, group)[1]
    return total


def ready_s(sim, call, group, compute: float = 0.0) -> float:
    """`restore_estimate_s` + `compute` x the prefill of the call's new tokens on `group` (with
    `compute` 1: when its first token would come, were it admitted now)."""
    if not compute:
        return restore_estimate_s(sim, call, group)
    new = max(0, call.context_tokens - sim.kv_tokens.get(kv_key(call.program, call.model), 0))
    return restore_estimate_s(sim, call, group) + compute * sim.cost.prefill_s(sim.catalog.by_name[call.model], new, group)


def ready_by_group(sim, call, compute: float = 0.0, groups=None) -> dict:
    """{group: `ready_s`} over `groups` (default: every group of the call's model) that could ever
    hold the call: what `default_place` ranks and `place_under_load` adds waits to, computed
    once when a hook asks both."""
    return {g: ready_s(sim, call, g, compute)
            for g in (groups if groups is not None else sim.model_groups(sim.catalog.by_name[call.model]))
            if sim.could_ever_fit(call, g)}


def wait_s(sim, group, load=None, ends=None) -> float:
    """Seconds a call placed on `group` now is expected to wait for HBM: until the running calls
    there are expected to end, and with the admission queue's pressure `load` (`overload.py`) at
    least the queued work ahead. `ends`: the view's `latest_ends()`, read once for many groups."""
    running = sim.expected_wait_s(group, ends)
    return running if load is None else max(running, load.wait_s(group))


def default_place(sim, call, groups=None, compute: float = 0.0, load=None, ready: dict | None = None):
    """The group where the call's state is ready soonest (with `compute` > 0: the least restore +
    `compute` x the prefill of its new tokens on that group's GPUs; 1 = the soonest first token),
    preferring groups with room now (after evicting unpinned state) over groups where it would
    wait unless waiting for the best group (`wait_s`; with the pressure `load`, the queue ahead
    counts while that group is below capacity) costs less than the difference; ties go to the
    less busy, then the one with more free HBM, then the lower index. Groups that could never
    hold the call are skipped. `ready`: `ready_by_group`'s estimates (same `compute` and
    `groups`) where the caller has them already."""

    if ready is None:
        ready = ready_by_group(sim, call, compute, groups)
    ranked = sorted((est, sum(sim.running_on[i] for i in g), -min(sim.tiers.gpu_free(i) for i in g), g)
                    for g, est in ready.items())
    if not ranked:
        return None
    best_s, best = ranked[0][0], ranked[0][-1]
    for est, *_, g in ranked:
        if sim.has_room_now(call, g):
            # Room now beats waiting unless the wait for the best group is shorter than the
            # difference (e.g. an engine awake there against a cold start here).
            if g == best:
                return g
            below = load is not None and not load.past_capacity(best)
            return g if est <= best_s + wait_s(sim, best, load if below else None) else best
    return best


def place_under_load(sim, call, load, compute: float = 0.0, ready: dict | None = None):
    """The group where restore (+ `compute` x prefill) + the wait is least: no wait where the call
    has room now without evicting another model's weights, else the queue ahead (`load.wait_s`,
    `planner/overload.py`) or, with no queue, the running calls' expected ends. Evicting weights
    counts as no room: past capacity the model evicted is queued for too, and its calls would
    move on in turn (a cascade of reloads). Ties go to the lower index. None if no group fits.
    `ready`: `ready_by_group`'s estimates over every group of the model (same `compute`), where the
    caller has them already; they hold only the groups that could ever fit, in the model's order."""
    if ready is None:
        ready = ready_by_group(sim, call, compute)
    best, best_s = None, math.inf
    ends = None  # `latest_ends`, read at the first group without room (most have none past capacity)
    for g, est in ready.items():
        if est >= best_s:  # a wait only adds: it cannot win (nor tie first)
            continue
        if not room_keeping_weights(sim, call, g):
            if ends is None:
                ends = sim.latest_ends()
            est += wait_s(sim, g, load, ends)
        if est < best_s:
            best, best_s = g, est
    return best


def weight_victims(sim, call, group) -> list | None:
    """Other models' weights (copies, or asleep engines to stop) that room for the call on `group`
    now evicts; None if there is no room now whatever goes."""
    keys, new, private = sim.expected_need(call, group)
    victims = sim.plan_eviction(group, new + private, protect={(k, group) for k in keys})
    if victims is None:
        return None
    return [v for v in victims if v.key[0] == "w" and v.key[1] != call.model]


def room_keeping_weights(sim, call, group) -> bool:
    """The call has room on `group` now without evicting another model's weights."""
    return weight_victims(sim, call, group) == []


def stay_with_copy(sim, call, group, ready: dict, slower: float | None = None):
    """`group`, unless placing the call there would load its model by evicting another model's
    weights (or stopping its asleep engine) while its own model has a ready copy on a group that
    could hold the call: then that copy's group, the soonest ready (`ready`: `ready_by_group`'s
    estimates), where it waits for room (`on_waiting` may still move it to another ready copy).
    A group that evicts nothing of another model is not second-guessed. One call's sooner start
    would send the evicted model's next calls to a cold start or a slower GPU, and each move
    invites the next (docs/planner.md, "Placement"). With `slower`, only the second counts: the
    call stays only if an evicted model would be homed next where it prefills over `slower` x
    slower (`rehomed_slower`)."""
    copies = sim.copies_of(call.model)
    if any(c.group == group for c in copies):
        return group
    own = [c.group for c in copies if c.ready and c.group in ready]
    if not own:
        return group
    victims = weight_victims(sim, call, group) or []
    if slower is not None:
        victims = [v for v in victims if rehomed_slower(sim, v, group, slower)]
    return min(own, key=lambda g: (ready[g], g)) if victims else group


def rehomed_slower(sim, victim, group, slower: float) -> bool:
    """Whether the model of `victim` (weights, or an asleep engine, evicted for room on `group`),
    with no other ready copy, would next be homed where a 4k-token prefill takes over `slower` x
    as long as where it is: its likely home, `homes.most_free` of the groups clear of `group`'s
    GPUs that its dense part fits (`home_of`'s last resort, without its owed pages or reclaim), or
    none. With a measured profile the prefill is the model's own rate on any group: only "none"
    counts."""
    m = sim.catalog.by_name[victim.key[1]]
    if any(c.group != victim.group and c.ready for c in sim.copies_of(m.name)):
        return False
    taken = set(group)
    home = most_free(sim, [g for g in dense_fits(sim, m) if taken.isdisjoint(g)])
    return home is None or sim.cost.prefill_s(m, 4096, home) > slower * sim.cost.prefill_s(m, 4096, victim.group)


NEVER = math.inf


def saved_rates(policy, state: dict, field: str) -> dict[str, float]:
    """`state[field]`, model -> a finite number >= 0, of a state `policy.learnt` saved; ValueError,
    saying what is wrong, otherwise."""
    if not isinstance(state, dict) or state.get("policy") != policy.name or field not in state:
        what = state.get("policy") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"policy {policy.name!r}: a saved state of {what!r}, expected one of "
                         f"{policy.name!r} with {field!r}")
    return number_map(state[field], f"policy {policy.name!r}: saved {field!r}")


def number_map(d, what: str) -> dict[str, float]:
    """`d` as model -> a finite number >= 0; ValueError, naming `what`, otherwise."""
    try:
        got = {str(m): float(v) for m, v in d.items()}
    except (AttributeError, TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must map model to a number") from None
    if not all(math.isfinite(v) and v >= 0 for v in got.values()):
        raise ValueError(f"{what} holds a negative or non-finite number")
    return got
