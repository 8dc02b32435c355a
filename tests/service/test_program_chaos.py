"""Program state semantics of the live planner and its invariants, and a chaos test: random DAGs
driven by a runtime that repeats events, cancels programs, times tools out and delivers their results late, with adapters that finish or fail ops at random.
The state machine must refuse what is stale, commit each logical call once, release every KV when
a program ends, keep the books within capacity, and converge."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import helpers
from statebudget.models.load import load_catalog, load_cluster
from statebudget.service.live import Conflict, Invalid, LivePlanner, NotFound

MODELS = ["planner", "coder", "reviewer"]
REFUSED = (Conflict, NotFound)


def Clock():
    return helpers.Clock(1000.0)


def planner(clock=None):
    return helpers.make_live_planner(clock)


def kv_state_of(p: LivePlanner, program: str) -> list:
    """Everything the books still hold for a program's KV."""
    out = [k for (k, _) in p.tiers.gpu if k[0] == "kv" and k[1] == program]
    out += [k for (k, _) in p.tiers.host if k[0] == "kv" and k[1] == program]
    out += [k for k in p.kv_tokens if k[1] == program]
    out += [k for (k, _) in p.writer if k[0] == "kv" and k[1] == program]
    return out


# ---- the invariants one by one ------------------------------------------------------------------------

def test_one_valid_commit_per_logical_call(live_planner):
    p = live_planner
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder"})
    p.event("t", {"type": "call_started", "program": "a", "call": "c1"})
    first = p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 100})
    again = p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 999})
    assert first.kv_version == 100 and again.status == "finished" and "kv_version" not in again.body()
    assert p.kv_tokens[("kv", "a", "coder")] == 100  # the repeat did not commit a second result
    with pytest.raises(Conflict, match="commits once"):
        p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder", "attempt": 1})


def test_a_retry_keeps_one_commit_and_refuses_the_old_attempt(live_planner):
    p = live_planner
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder"})
    p.event("t", {"type": "call_started", "program": "a", "call": "c1"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder", "attempt": 1})  # retry
    with pytest.raises(Conflict, match="attempt 0 is stale"):
        p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 50, "attempt": 0})
    with pytest.raises(Conflict, match="attempt 0 is stale"):
        p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder", "attempt": 0})
    p.event("t", {"type": "call_started", "program": "a", "call": "c1", "attempt": 1})
    assert p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 70, "attempt": 1}).kv_version == 70
    assert not p.running_models  # the first attempt's hold went with the retry


def test_a_retry_keeps_its_attained_service_and_plas_priority_follows_service():
    clock = Clock()
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock, queue="plas")
    for prog in ("long", "short"):
        p.event("t", {"type": "program_started", "program": prog})
    p.event("t", {"type": "call_arrived", "program": "long", "call": "c1", "model": "coder"})
    p.event("t", {"type": "call_started", "program": "long", "call": "c1"})
    clock.t += 40  # the first attempt runs 40 s, then fails and is retried
    p.event("t", {"type": "call_arrived", "program": "long", "call": "c1", "model": "coder", "attempt": 1})
    assert p.programs["long"].service_s == 40.0  # kept across the retry, not reset as a new program would be
    p.event("t", {"type": "call_started", "program": "long", "call": "c1", "attempt": 1})
    clock.t += 5
    p.event("t", {"type": "call_finished", "program": "long", "call": "c1", "attempt": 1, "tokens": 10})
    assert p.programs["long"].service_s == 45.0
    a = p.event("t", {"type": "call_arrived", "program": "long", "call": "c2", "model": "coder", "after": ["c1"]})
    b = p.event("t", {"type": "call_arrived", "program": "short", "call": "c1", "model": "coder"})
    assert b.priority < a.priority  # less attained service goes first (lower is earlier)


def test_no_call_before_its_dependencies(live_planner):
    p = live_planner
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder"})
    with pytest.raises(Conflict, match="dependency 'c1'"):
        p.event("t", {"type": "call_arrived", "program": "a", "call": "c2", "model": "reviewer", "after": ["c1"]})
    p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 10})
    assert p.event("t", {"type": "call_arrived", "program": "a", "call": "c2", "model": "reviewer",
                         "after": ["c1"]}).status == "arrived"


def test_no_late_result_across_an_epoch_and_no_new_call_after_a_cancel(live_planner):
    p = live_planner
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "tool_started", "program": "a", "tool": "shell", "call": "t1"})
    p.event("t", {"type": "tool_started", "program": "a", "tool": "shell", "call": "t2"})  # t1 timed out, retried
    with pytest.raises(Conflict, match="late"):
        p.event("t", {"type": "tool_finished", "program": "a", "tool": "shell", "call": "t1"})
    with pytest.raises(Conflict, match="over"):  # a repeated start of the superseded call
        p.event("t", {"type": "tool_started", "program": "a", "tool": "shell", "call": "t1"})
    assert p.event("t", {"type": "program_cancelled", "program": "a"}).epoch == 1
    with pytest.raises(Conflict, match="stale"):
        p.event("t", {"type": "tool_finished", "program": "a", "tool": "shell", "call": "t2", "epoch": 0})
    for late in ({"call": "t2"}, {}):  # without an epoch too: the program is over, nothing awaits it
        with pytest.raises(Conflict, match="late: the program is cancelled"):
            p.event("t", {"type": "tool_finished", "program": "a", "tool": "shell", **late})
    for ev in ({"type": "call_arrived", "call": "c9", "model": "coder"}, {"type": "tool_started", "tool": "shell"}):
        with pytest.raises(Conflict, match="cancelled"):
            p.event("t", {"program": "a", **ev})
    with pytest.raises(Conflict):
        p.submit_lease("t", {"program": "a", "model": "coder", "deadline_s": 10})


def test_threads_wait_on_tools_side_by_side_and_a_retry_supersedes_only_its_own_thread(live_planner):
    p, clock = live_planner, live_planner.clock
    p.event("t", {"type": "program_started", "program": "a"})
    for th, tid in (("map0", "s0"), ("map1", "s1")):  # two branches of a fork/join search at once
        p.event("t", {"type": "tool_started", "program": "a", "tool": "search", "call": tid, "thread": th})
    clock.t += 2
    p.event("t", {"type": "tool_started", "program": "a", "tool": "search", "call": "s1b", "thread": "map1"})
    with pytest.raises(Conflict, match="late"):  # map1's first call was retried ...
        p.event("t", {"type": "tool_finished", "program": "a", "tool": "search", "call": "s1"})
    clock.t += 3
    seen = []
    p.kvw.waits.observe = lambda tool, s: seen.append((tool, s))
    out = p.event("t", {"type": "tool_finished", "program": "a", "tool": "search", "call": "s0"})
    assert out.duration_s == 5.0  # ... map0's goes on: its result is on time, timed from its own start
    assert p.event("t", {"type": "tool_finished", "program": "a", "tool": "search", "call": "s1b"}).duration_s == 3.0
    assert seen == [("search", 5.0), ("search", 3.0)] and not p.programs["a"].tools
    # a result delivered twice (the answer to the first was lost) is taken once, and not refused
    again = p.event("t", {"type": "tool_finished", "program": "a", "tool": "search", "call": "s0"})
    assert again.repeated and len(seen) == 2
    with pytest.raises(Conflict, match="late"):  # the superseded call's result stays late
        p.event("t", {"type": "tool_finished", "program": "a", "tool": "search", "call": "s1"})


def test_a_side_effect_runs_once_across_a_retried_call_and_a_restart(tmp_path):
    from statebudget.service.ledger import Store

    def fresh():
        return LivePlanner(load_cluster("toy2"), load_catalog("toy"), Store(tmp_path / "sb.db"), clock=Clock())

    p = fresh()
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder"})
    p.event("t", {"type": "call_started", "program": "a", "call": "c1"})
    p.event("t", {"type": "call_finished", "program": "a", "call": "c1", "tokens": 300})
    assert p.event("t", {"type": "tool_started", "program": "a", "tool": "pay", "call": "t1",
                         "effect": "pay-42"}).status == "started"
    assert p.event("t", {"type": "tool_finished", "program": "a", "tool": "pay", "call": "t1",
                         "result": "receipt-7"}).effect == "pay-42"
    p = fresh()  # the planner restarts; the effect it saw applied is on disk
    # The next call fails after emitting the same tool call again, under a new tool call id: the
    # payment was made once, so the runtime is told not to make it again, and nothing waits.
    again = p.event("t", {"type": "tool_started", "program": "a", "tool": "pay", "call": "t1-retry", "effect": "pay-42"})
    assert again.body() == {"tool": "pay", "status": "done", "effect": "pay-42", "of": "t1", "result": "receipt-7"}
    assert not p.programs["a"].tools and not p.kv_waits
    # In flight on one thread, the same effect from another thread is refused; the thread's own
    # retry takes the key over, and a failure without the effect frees it for a later try.
    p.event("t", {"type": "tool_started", "program": "a", "tool": "mail", "call": "m1", "thread": "A", "effect": "mail-1"})
    with pytest.raises(Conflict, match="in flight as tool call 'm1' on thread 'A'"):
        p.event("t", {"type": "tool_started", "program": "a", "tool": "mail", "call": "m2", "thread": "B", "effect": "mail-1"})
    p.event("t", {"type": "tool_started", "program": "a", "tool": "mail", "call": "m1b", "thread": "A", "effect": "mail-1"})
    with pytest.raises(Conflict, match="late"):
        p.event("t", {"type": "tool_finished", "program": "a", "tool": "mail", "call": "m1"})
    out = p.event("t", {"type": "tool_finished", "program": "a", "tool": "mail", "call": "m1b", "ok": False})
    assert "effect" not in out.body()
    assert p.event("t", {"type": "tool_started", "program": "a", "tool": "mail", "call": "m3", "thread": "B",
                         "effect": "mail-1"}).status == "started"
    with pytest.raises(Invalid, match="needs its tool call id"):
        p.event("t", {"type": "tool_started", "program": "a", "tool": "mail", "effect": "mail-2"})


def test_every_kv_released_at_finish_and_at_cancel(live_planner):
    p = live_planner
    for prog, end in (("a", "program_finished"), ("b", "program_cancelled")):
        p.event("t", {"type": "program_started", "program": prog})
        for i, m in enumerate(MODELS):
            p.event("t", {"type": "call_arrived", "program": prog, "call": f"c{i}", "model": m})
            p.event("t", {"type": "call_started", "program": prog, "call": f"c{i}"})
            p.event("t", {"type": "call_finished", "program": prog, "call": f"c{i}", "tokens": 1000 * (i + 1)})
        p.event("t", {"type": "tool_started", "program": prog, "tool": "shell"})
        p.submit_lease("t", {"program": prog, "model": "coder", "deadline_s": 30})
        assert kv_state_of(p, prog)
        p.event("t", {"type": end, "program": prog})
        assert kv_state_of(p, prog) == []
        assert not [lease for lease in p.ledger.leases.values() if lease.request.program == prog and lease.state.live]
    p.tiers.check()


# ---- the chaos test -------------------------------------------------------------------------------------

@st.composite
def scenarios(draw):
    programs = []
    for _ in range(draw(st.integers(1, 4))):
        nodes = []
        for i in range(draw(st.integers(1, 6))):
            after = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else []
            nodes.append((draw(st.sampled_from(["call", "tool"])), sorted(after), draw(st.sampled_from(MODELS))))
        programs.append(nodes)
    actions = draw(st.lists(st.tuples(st.sampled_from(["step", "step", "step", "step", "repeat", "repeat", "cancel",
                                                       "timeout", "late", "adapter", "tick", "lease", "retry",
                                                       "early", "branch", "reemit", "tool_fail"]),
                                      st.integers(0, 1000)), min_size=20, max_size=150))
    return programs, actions


class Runtime:
    """Drives one program's DAG through the planner one event at a time."""

    def __init__(self, pid: str, nodes):
        self.pid, self.nodes = pid, nodes
        self.phase = {i: 0 for i in range(len(nodes))}  # events sent for each node
        self.tool_try = {i: 0 for i in range(len(nodes))}
        self.attempt = {i: 0 for i in range(len(nodes))}
        # A node's thread: its first parent's, for that parent's first child; branches wait on tools
        # side by side, each on its own thread.
        heir, self.thread = {}, {}
        for i, (_, after, _) in enumerate(nodes):
            if after:
                heir.setdefault(after[0], i)
        for i, (_, after, _) in enumerate(nodes):
            self.thread[i] = self.thread[after[0]] if after and heir[after[0]] == i else f"th{i}"
        self.sent: list[dict] = []  # every event sent, for duplicate deliveries
        self.dropped: set[int] = set()  # nodes of cancelled branches: a cancelled call and all after it
        self.late: list[dict] = []
        self.started = False
        self.ended = False

    def done(self, i) -> bool:
        kind = self.nodes[i][0]
        return i in self.dropped or self.phase[i] >= (3 if kind == "call" else 2)

    def branch_cancel(self) -> tuple[dict, list[dict]] | None:
        """The runtime abandons a branch: a call that arrived and has not finished is cancelled,
        and with it every node after it. Returns the cancel and what must now be refused: the
        call's own result and the arrival of a call right after it."""
        for i, (kind, _, _) in enumerate(self.nodes):
            if kind == "call" and self.phase[i] in (1, 2) and i not in self.dropped:
                stack = [i]
                while stack:
                    j = stack.pop()
                    if j not in self.dropped:
                        self.dropped.add(j)
                        stack += [k for k, (_, after, _) in enumerate(self.nodes) if j in after]
                refused = [self.call_event(i, 2)]
                child = next((k for k, n in enumerate(self.nodes) if i in n[1] and n[0] == "call"), None)
                if child is not None:
                    refused.append(self.call_event(child, 0))
                return {"type": "call_cancelled", "program": self.pid, "call": f"n{i}"}, refused
        return None

    def next_event(self, pick: int = 0) -> dict | None:
        """The next event of one of the nodes that can move (the `pick`-th, cyclically), so that
        branches interleave: two threads wait on tools at once, calls run side by side."""
        if not self.started:
            self.started = True
            return {"type": "program_started", "program": self.pid}
        ready = [i for i in range(len(self.nodes)) if not self.done(i) and all(self.done(a) for a in self.nodes[i][1])]
        for i in ready[pick % len(ready):pick % len(ready) + 1] if ready else ():
            kind = self.nodes[i][0]
            ph = self.phase[i]
            self.phase[i] += 1
            if kind == "tool":
                return self.tool_event(i, ph)
            return self.call_event(i, ph)
        if not self.ended:
            self.ended = True
            return {"type": "program_finished", "program": self.pid}
        return None

    def tool_event(self, i: int, ph: int, tid: str | None = None) -> dict:
        """A tool node's start or result; each tool node has a side effect, keyed `e{i}` ."""
        ev = {"type": ["tool_started", "tool_finished"][ph], "program": self.pid, "tool": "shell",
              "call": tid or f"t{i}.{self.tool_try[i]}", "thread": self.thread[i]}
        return {**ev, "effect": f"e{i}"} if ph == 0 else ev

    def reemit(self, x: int) -> dict | None:
        """A retried LLM call emits a tool call again that already ran, under a new id: the
        planner must answer `done`, so the runtime does not repeat the side effect."""
        done = [i for i, (kind, _, _) in enumerate(self.nodes) if kind == "tool" and self.phase[i] == 2]
        return self.tool_event(done[x % len(done)], 0, tid=f"r{x}") if done else None

    def tool_fail(self) -> dict | None:
        """A running tool fails without its side effect; the runtime runs it again (a new id)."""
        for i, (kind, _, _) in enumerate(self.nodes):
            if kind == "tool" and self.phase[i] == 1 and i not in self.dropped:
                ev = {**self.tool_event(i, 1), "ok": False}
                self.tool_try[i] += 1
                self.phase[i] = 0
                return ev
        return None

    def call_event(self, i: int, ph: int) -> dict:
        kind, after, model = self.nodes[i]
        at = {"program": self.pid, "call": f"n{i}", "attempt": self.attempt[i]}
        calls = [f"n{a}" for a in after if self.nodes[a][0] == "call"]
        return [{"type": "call_arrived", "model": model, "after": calls, "context_tokens": 500, **at},
                {"type": "call_started", **at},
                {"type": "call_finished", "tokens": 400 * (i + 2) + self.attempt[i], **at}][ph]

    def retry(self) -> dict | None:
        """A call that arrived and has not finished fails and is retried (its next attempt arrives
        again); whatever the old attempt still reports is late."""
        for i, (kind, _, _) in enumerate(self.nodes):
            if kind == "call" and self.phase[i] in (1, 2) and i not in self.dropped:
                self.late.append(self.call_event(i, 2))
                self.attempt[i] += 1
                self.phase[i] = 1
                return self.call_event(i, 0)
        return None

    def early(self) -> dict | None:
        """A call sent before a dependency on another call has finished: it must be refused."""
        for i, (kind, after, _) in enumerate(self.nodes):
            if kind == "call" and self.phase[i] == 0 and i not in self.dropped and any(self.nodes[a][0] == "call" and not self.done(a)
                                                             for a in after):
                return self.call_event(i, 0)
        return None

    def timeout(self) -> dict | None:
        """A running tool times out: the runtime retries it; the old result may still come (late)."""
        for i, (kind, _, _) in enumerate(self.nodes):
            if kind == "tool" and self.phase[i] == 1:
                self.late.append(self.tool_event(i, 1))
                self.tool_try[i] += 1
                return self.tool_event(i, 0)
        return None


def send(p: LivePlanner, ev: dict, commits: dict, cancelled: set, valid: bool = False):
    """One event; checks what must be refused, counts the commits the planner reports (a
    `call_finished` answered with the KV version it committed) and the side effects it says
    were applied (a `tool_finished` answered with its effect key: commits[(program, key)]).
    `valid`: the runtime's own next step of a live program, which the planner must take."""
    try:
        out = p.event("t", ev)
    except REFUSED as e:
        assert not (valid and ev["program"] not in cancelled), f"refused a valid {ev}: {e}"
        return None
    if ev["program"] in cancelled:
        assert ev["type"] not in ("call_arrived", "call_started", "tool_started"), f"accepted {ev} after a cancel"
    key = (ev["program"], ev.get("call"))
    if ev["type"] == "call_finished" and "kv_version" in out.body():
        commits[key] = commits.get(key, 0) + 1
    if ev["type"] == "tool_finished" and "effect" in out.body():
        commits[(ev["program"], out.effect)] = commits.get((ev["program"], out.effect), 0) + 1
    if ev["type"] == "tool_started":  # `done` exactly when the planner took a result with that key
        assert (out.status == "done") == bool(commits.get((ev["program"], ev["effect"]))), (ev, out)
    if ev["type"] == "call_arrived" and out.status == "arrived":  # no call before its dependencies
        missing = [d for d in ev.get("after") or () if not commits.get((ev["program"], d))]
        assert not missing, f"{ev} arrived before {missing} committed"
    return out


def check_books(p: LivePlanner, ended: set):
    p.tiers.check()
    for prog in ended:
        assert kv_state_of(p, prog) == [], f"{prog} ended but its KV is still held"
        assert not [lease.lease_id for lease in p.ledger.leases.values()
                    if lease.request.program == prog and lease.state.live], f"{prog} ended with a live lease"
    assert sum(p.backlog.values()) >= -1.0


def settle_ops(p: LivePlanner, which: int, fail: bool):
    ops = sorted(p.ops)
    if not ops:
        return
    rec = p.ops[ops[which % len(ops)]]
    result = {"status": "failed" if fail else "done", "bytes": rec.op.bytes, "seconds": 0.1, "checksum": "x",
              "version": rec.op.version, "epoch": rec.op.epoch}
    try:
        p.report(rec.node, rec.op.op_id, result)
    except REFUSED:
        pass
    assert rec.op.op_id not in p.ops  # every report closes its op, committed or refused


@given(scenarios())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chaos_random_dags_cancels_timeouts_and_repeats_converge(scenario):
    programs, actions = scenario
    clock = Clock()
    p = planner(clock)
    rts = [Runtime(f"p{k}", nodes) for k, nodes in enumerate(programs)]
    commits: dict = {}
    cancelled: set = set()
    ended: set = set()
    for action, x in actions:
        clock.t += 0.5
        rt = rts[x % len(rts)]
        if action == "step":
            ev = rt.next_event(x // len(rts))
            if ev is not None:
                rt.sent.append(ev)
                send(p, ev, commits, cancelled, valid=True)
                if ev["type"] == "program_finished" and p.programs[rt.pid].status == "finished":
                    ended.add(rt.pid)
        elif action == "repeat" and rt.sent:
            send(p, rt.sent[-1 - x % len(rt.sent)], commits, cancelled)  # a duplicate delivery, late or not
        elif action == "cancel" and rt.started and x % 7 == 0:  # rare: most programs should run on
            send(p, {"type": "program_cancelled", "program": rt.pid}, commits, cancelled)
            cancelled.add(rt.pid)
            ended.add(rt.pid)
            rt.ended = True
        elif action in ("timeout", "retry", "tool_fail") and (ev := getattr(rt, action)()) is not None:
            send(p, ev, commits, cancelled, valid=True)
        elif action == "reemit" and rt.started and not rt.ended and (ev := rt.reemit(x)) is not None:
            out = send(p, ev, commits, cancelled, valid=True)
            assert out is None or out.status == "done", out  # never a second run of the effect
        elif action == "branch" and rt.started and not rt.ended and (got := rt.branch_cancel()) is not None:
            ev, refused = got
            send(p, ev, commits, cancelled, valid=True)
            for late in refused:  # the cancelled call's result, and a call after it
                with pytest.raises(Conflict, match="cancelled|cannot arrive before"):
                    p.event("t", late)
        elif action == "early" and rt.started and not rt.ended and (ev := rt.early()) is not None:
            with pytest.raises(Conflict, match="cannot arrive before"):
                p.event("t", ev)
        elif action == "late" and rt.late:
            with pytest.raises(REFUSED):  # a result of a timed-out tool call or a retried attempt
                p.event("t", rt.late.pop(0))
        elif action == "adapter":
            settle_ops(p, x, fail=x % 5 == 0)
        elif action == "tick":
            p.tick()
        elif action == "lease" and rt.started and not rt.ended:
            try:
                p.submit_lease("t", {"program": rt.pid, "model": MODELS[x % 3], "deadline_s": 1 + x % 20,
                                     "confidence": (x % 10) / 10})
            except REFUSED:
                pass
        check_books(p, ended)
    assert all(n == 1 for n in commits.values()), commits
    # Converge: every program runs to its end, the adapters finish every op, planning settles.
    for rt in rts:
        for _ in range(100):
            ev = rt.next_event()
            if ev is None:
                break
            clock.t += 0.5
            send(p, ev, commits, cancelled, valid=True)
        ended.add(rt.pid)
    for _ in range(30):
        while p.ops:
            settle_ops(p, 0, fail=False)
        clock.t += 60
        if p.tick() == 0 and not p.ops:
            break
    assert not p.ops, "the plan did not settle"
    assert all(r.status in ("finished", "cancelled") for r in p.programs.values())
    assert not p.running_models and not p.kv_tokens
    assert not [lease for lease in p.ledger.leases.values() if lease.state.live and lease.state.name != "READY"]
    assert all(n == 1 for n in commits.values()), commits
    check_books(p, ended)


def test_a_cancelled_call_frees_the_predictor_and_a_program_end_abandons_unfinished_calls(live_planner):
    p = live_planner
    p.event("t", {"type": "program_started", "program": "a"})
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c1", "model": "coder"})
    p.event("t", {"type": "call_started", "program": "a", "call": "c1"})
    p.event("t", {"type": "call_cancelled", "program": "a", "call": "c1"})
    assert p.core.predictor.live["a"].running_calls == 0  # the tool phase can begin
    p.event("t", {"type": "call_arrived", "program": "a", "call": "c2", "model": "coder"})
    p.event("t", {"type": "program_finished", "program": "a"})
    assert {c: v["status"] for c, v in p.programs["a"].calls.items()} == {"c1": "cancelled", "c2": "cancelled"}
