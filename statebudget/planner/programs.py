"""Program-aware serving (seed 003): which waiting call goes first, and what happens to a program's
KV while it waits on a tool. Pure functions over what the mechanism knows; the simulator calls
them, and so will the service.

Queue disciplines (a sort key, lowest first):

    fcfs   arrival time
    plas   the program's attained service (compute seconds of its finished calls): a new call
           inherits its program's service, so short programs overtake long ones (§4)
    atlas  the attained service along the call's critical path in the program's DAG, so a thread
           of a wide fork/join program is not penalised for its siblings (§6)

Both plas and atlas age: every second a call waits takes `aging` seconds off its key, so no
call waits forever behind newer, shorter programs (the bound is stated in BENCHMARKS.md).

Tool-wait KV rules (at each tool start, for the program's KV in HBM):

    preserve  keep it in HBM
    swap      move it to host DRAM now, and back before the predicted return (§11, §21)
    discard   drop it; the next call recomputes it from the committed tokens (§10)
    adaptive  the cheapest of the three for this interrupt under the predicted wait (§12):
              preserve = share of the GPU held x wait; swap = out + in over PCIe; discard = recompute
"""

from __future__ import annotations

QUEUES = ("fcfs", "plas", "atlas")
KV_RULES = ("preserve", "swap", "discard", "adaptive")
AGING = 0.5  # seconds of key per second waited


def parse_spec(spec: str, known_policies) -> tuple[str, str, str | None]:
    """`POLICY[:QUEUE[:KV]]` -> (policy, queue, kv rule or None for the policy's own)."""
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise ValueError(f"policy spec {spec!r}: expected POLICY[:QUEUE[:KV]]")
    policy = parts[0]
    if policy not in known_policies:
        raise ValueError(f"policy spec {spec!r}: unknown policy {policy!r} (known: {', '.join(known_policies)})")
    queue = parts[1] if len(parts) > 1 and parts[1] else "fcfs"
    if queue not in QUEUES:
        raise ValueError(f"policy spec {spec!r}: unknown queue discipline {queue!r} (known: {', '.join(QUEUES)})")
    kv = parts[2] if len(parts) > 2 and parts[2] else None
    if kv is not None and kv not in KV_RULES:
        raise ValueError(f"policy spec {spec!r}: unknown tool-wait KV rule {kv!r} (known: {', '.join(KV_RULES)})")
    return policy, queue, kv


def queue_key(discipline: str, arrive: float, now: float, program_service: float, path_service: float,
              aging: float = AGING) -> tuple:
    if discipline == "fcfs":
        return (arrive,)
    service = program_service if discipline == "plas" else path_service
    return (service - aging * (now - arrive), arrive)


def adaptive_choice(kv_bytes: float, wait_s: float, hbm_bytes: float, pcie_bps: float, recompute_s: float) -> str:
    """The cheapest rule for one interrupt, in GPU-seconds: holding a share of the GPU for the
    wait, moving the KV out and back, or recomputing it (§12)."""
    costs = {
        "preserve": kv_bytes / max(hbm_bytes, 1.0) * wait_s,
        "swap": 2 * kv_bytes / pcie_bps,
        "discard": recompute_s,
    }
    return min(costs, key=lambda k: (costs[k], k))
