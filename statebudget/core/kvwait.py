"""The tool-wait KV rule carried out (seed 003 §10-§12, §21, §22), written once for both drivers.

`ToolWaitKV` (`core/toolwait.py`) decides what to do with one KV copy; this module does the rest:
when a program is idle enough that its KV counts as suspended, what each action does, when a
recheck fires and what it checks, re-arming a recheck while another thread's call runs, the swap
back in before the predicted return, and the swap-in deferred while the swap-out is still being
written. The driver (the simulator, the live planner) is a `KvWaitMechanism`: it moves the bytes
(a transfer on a link, an op for an adapter) and keeps the timers (the simulator on its event
heap, the live planner on its timer heap), and calls `timer_due` when one fires.

A driver names a program and one of its tool waits with its own handles (`program`, `wait`):
the simulator by its `ProgRun` and the tool node, the live planner by its `ProgramRec` and the
(thread, since) of the wait. The functions only hand them back to the driver.
"""

from __future__ import annotations

from typing import Any, Protocol

from .books import GpuCopy, HostCopy
from .toolwait import ToolWaitKV

RECHECK, SWAP_IN = "recheck", "swap_in"  # the two timers of a tool wait


class KvWaitMechanism(Protocol):
    """What a driver gives the tool-wait KV rule. It is also the rule's view (`ToolWaitKV.decide_copy`):
    `now`, `tiers`, `gpus`, `kv_tokens`, `best_source` and the cost model are its own."""

    kvw: ToolWaitKV
    now: float
    kv_tokens: dict

    def kv_copies(self, program: Any) -> list[GpuCopy]:
        """The program's KV copies in HBM that are ready and that nothing pins, in the order the
        rule judges them."""

    def kv_in_hbm(self, program: Any) -> list[GpuCopy]:
        """Every KV copy of the program in HBM (whose suspension ends with the program's waits)."""

    def kv_program_busy(self, program: Any) -> bool:
        """A call of the program waits or runs: its KV is in use, not suspended."""

    def kv_wait_goes_on(self, program: Any, wait: Any, kind: str) -> tuple[str, float] | None:
        """(tool, since) of the tool wait `wait`, if a timer of `kind` set for it still acts."""

    def kv_swap_out(self, copy: GpuCopy) -> None:
        """Move the copy to its node's host DRAM as a background transfer (within the swap share)."""

    def kv_drop(self, copy: GpuCopy) -> None:
        """Drop the copy: the next call recomputes the KV."""

    def kv_swap_in(self, key: tuple, group: tuple) -> None:
        """Bring the KV back into `group` from host DRAM as a background transfer that evicts nothing."""

    def kv_swap_in_once_written(self, program: Any, wait: Any, key: tuple, group: tuple, hc: HostCopy) -> None:
        """The swap-out `hc` is still being written: call `swap_back` again once it is."""

    def kv_set_timer(self, at: float, kind: str, program: Any, wait: Any, key: tuple, group: tuple) -> None:
        """Fire `timer_due(self, kind, program, wait, key, group)` at `at` (`kind`: RECHECK or SWAP_IN)."""

    def kv_on_action(self, rule: str, new: bool) -> None:
        """The rule chose `rule` for a copy (`new`: counted in the rule's `actions`)."""

    def kv_end_suspension(self, copy: GpuCopy) -> None:
        """The copy is no longer suspended (`copy.suspended_since` goes back to None)."""


def tool_started(mech: KvWaitMechanism, program: Any, wait: Any, tool: str, since: float) -> float | None:
    """A tool wait began on one of the program's threads: the rule for each of its KV copies in
    HBM, unless another of its calls still waits or runs (then its KV is not suspended). Returns
    the wait the rule predicts (for `tool_ended`), or None."""
    predicted = mech.kvw.started(tool)
    if mech.kv_program_busy(program):
        return predicted
    copies = mech.kv_copies(program)
    for kvk in sorted({c.key for c in copies}):
        mech.kvw.suspended(kvk, tool)
    for copy in copies:
        suspend(mech, program, wait, tool, since, copy, predicted)
    return predicted


def suspend(mech: KvWaitMechanism, program: Any, wait: Any, tool: str, since: float, copy: GpuCopy,
            predicted: float | None) -> None:
    """The rule for one KV copy in a tool wait that began at `since`, with `predicted` seconds of
    it still expected: preserve (judged again at its TTL), swap (back before the predicted return),
    or discard."""
    act = mech.kvw.decide_copy(mech, tool, copy, predicted, since)
    mech.kv_on_action(act.rule, act.new)
    if act.rule == "preserve":
        if copy.suspended_since is None:
            copy.suspended_since = mech.now
        if act.recheck_at is not None:
            mech.kv_set_timer(act.recheck_at, RECHECK, program, wait, copy.key, copy.group)
    elif act.rule == "swap":
        key, group = copy.key, copy.group
        mech.kv_swap_out(copy)
        if act.swap_in_at is not None:
            mech.kv_set_timer(act.swap_in_at, SWAP_IN, program, wait, key, group)
    else:
        mech.kv_drop(copy)


def timer_due(mech: KvWaitMechanism, kind: str, program: Any, wait: Any, key: tuple, group: tuple) -> None:
    """A timer of a tool wait fired; it acts only while that wait goes on. A swap-in brings the
    KV back (`swap_back`); a recheck (a preserved KV's TTL ran out) judges the copy again on the
    wait still expected, given how long it has lasted (§12: preserve first, offload once it is
    long), if it is still in HBM, suspended and unpinned."""
    if kind == SWAP_IN:
        swap_back(mech, program, wait, key, group)
        return
    w = mech.kv_wait_goes_on(program, wait, kind)
    copy = mech.tiers.gpu.get((key, group)) if w is not None else None
    if copy is None or copy.suspended_since is None or copy.pins or not copy.ready:
        return
    tool, since = w
    left = mech.kvw.remaining(tool, mech.now - since)
    if mech.kv_program_busy(program):
        # Another thread's call runs (on another model: this KV stays suspended). Judge it again
        # once that call may be over, rather than hold it until the tool returns.
        mech.kv_set_timer(mech.kvw.next_check(mech.now, since, left), RECHECK, program, wait, key, group)
        return
    suspend(mech, program, wait, tool, since, copy, left)


def swap_back(mech: KvWaitMechanism, program: Any, wait: Any, key: tuple, group: tuple) -> None:
    """Swap a KV swapped out for a tool wait back into `group` before the predicted return, as a
    background transfer that evicts nothing: once the swap-out is written, if it is still on its
    way; not if the wait is over, the KV is gone or already back, or recomputing it is cheaper."""
    if mech.kv_wait_goes_on(program, wait, SWAP_IN) is None or key not in mech.kv_tokens or \
            (key, group) in mech.tiers.gpu:
        return
    hc = mech.tiers.host.get((key, mech.gpus[group[0]].node))
    if hc is not None and not hc.ready:
        mech.kv_swap_in_once_written(program, wait, key, group, hc)
    elif mech.best_source(key, group).startswith("host:"):  # a swap-in, not a recompute
        mech.kv_swap_in(key, group)


def tool_ended(mech: KvWaitMechanism, program: Any, tool: str | None, waited_s: float, predicted: float | None,
               still_waiting: bool) -> None:
    """A tool wait ended after `waited_s` (`predicted`: what `tool_started` said of it; `tool`
    None: no wait of the rule's ended). Once no thread of the program waits on a tool any more
    (`still_waiting` false), its KV copies are no longer suspended."""
    if tool is not None:
        mech.kvw.ended(tool, waited_s, predicted)
    if not still_waiting:
        for copy in mech.kv_in_hbm(program):
            mech.kv_end_suspension(copy)
