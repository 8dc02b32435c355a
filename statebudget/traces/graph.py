"""Static facts of a program's DAG that the simulator, the stats and the planner all need."""

from __future__ import annotations

import graphlib

from ..models.trace import MAIN_THREAD, Program, Trace


def previous_call(program: Program) -> dict[str, str | None]:
    """For each call node, the call before it in its thread: the nearest call reached by walking
    `after` back through tool nodes (the first listed parent at a join)."""
    by_id = {n.id: n for n in program.nodes}
    memo: dict[str, str | None] = {}

    def last_call_at_or_before(nid: str) -> str | None:
        # iterative walk: follow first parents until a call node
        seen = nid
        while True:
            if seen in memo:
                return memo[seen]
            node = by_id[seen]
            if node.kind == "call":
                return seen
            if not node.after:
                return None
            seen = node.after[0]

    out = {}
    for n in program.nodes:
        if n.kind == "call":
            out[n.id] = last_call_at_or_before(n.after[0]) if n.after else None
            memo[n.id] = n.id
    return out


def handoff_calls(program: Program) -> set[str]:
    by_id = {n.id: n for n in program.nodes}
    return {cid for cid, prev in previous_call(program).items()
            if prev is not None and by_id[prev].model != by_id[cid].model}


def hinted_calls(program: Program) -> set[str]:
    return {h.for_ for h in program.hints}


def count_handoffs(trace: Trace) -> int:
    return sum(len(handoff_calls(p)) for p in trace.programs)


def threads(program: Program) -> dict[str, str]:
    """Each node's thread (DESIGN.md §2, a sequential chain): its first parent's, for that
    parent's first child; a new thread, named after the node, for any other node; MAIN_THREAD for
    the first root."""
    heir: dict[str, str] = {}
    for n in program.nodes:
        if n.after:
            heir.setdefault(n.after[0], n.id)
    out: dict[str, str] = {}
    for n in in_order(program):
        first = n.after[0] if n.after else None
        out[n.id] = out[first] if first is not None and heir[first] == n.id else (MAIN_THREAD if not out else n.id)
    return out


def in_order(program: Program) -> list:
    """The program's nodes, each after its dependencies."""
    by_id = {n.id: n for n in program.nodes}
    return [by_id[nid] for nid in graphlib.TopologicalSorter({n.id: n.after for n in program.nodes}).static_order()]


def children_of(program: Program) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for n in program.nodes:
        for a in n.after:
            children.setdefault(a, []).append(n.id)
    return children


def reachable(children: dict[str, list[str]], root: str) -> set[str]:
    """`root` and every node after it, transitively."""
    out, stack = {root}, [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in out:
                out.add(c)
                stack.append(c)
    return out


def descendants(program: Program, root: str) -> list[str]:
    """`root` and every node after it (transitively), in file order."""
    out = reachable(children_of(program), root)
    return [n.id for n in program.nodes if n.id in out]
