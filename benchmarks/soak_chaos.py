"""A chaos soak of the live stack for minutes: `statebudget serve`, two `adapter local` processes
(real bytes) and the runtime driver replaying toy `swe-team` traces back to back at 30x, while
faults are injected at random every few seconds:

  adapter_kill   SIGKILL one adapter (with ops in flight or not) and start it again
  engine_loss    SIGUSR1 to one adapter: its data plane loses every copy in HBM, as in an engine crash
  server_kill    SIGKILL the server and start it again on its ledger

At the end, with the plan drained, it counts what a sceptic asks: events acknowledged, and those
whose effect is missing from the ledger (lost); ops acknowledged done; ops executed twice (within
one adapter process, and by a restarted adapter after its killed predecessor); failed ops and
why; whether the books equal the adapters' inventories; ops made by an idle planner over six
planning steps (a failure loop); driver errors. Target: zero lost, zero twice, books equal.

A full ledger disk is not injected here (a subprocess's SQLite cannot be filled from outside
without a hook in the server): `tests/service/test_ledger_faults.py` and `tests/api/test_trust.py`
cover it.

    python benchmarks/soak_chaos.py [--minutes 5] [--fault-every 8] [--seed 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))  # a script, not a package: the stack lives in the tests

from statebudget.models.load import parse_trace  # noqa: E402
from tests.helpers import toy_trace_jsonl, wait_until  # noqa: E402
from tests.test_chaos_service import AckDriver, decisions, settled, start_adapter  # noqa: E402
from tests.test_e2e_service import TOKENS, Stack  # noqa: E402


def trace_for(round_: int, seed: int):
    t = parse_trace(toy_trace_jsonl(seed=seed + round_, hours=0.05), "toy trace")
    return t.model_copy(update={"programs": [p.model_copy(update={"program": f"r{round_}-{p.program}"})
                                             for p in t.programs]})


async def soak(stack: Stack, minutes: float, fault_every: float, seed: int) -> dict:
    rng = random.Random(seed)
    stop_at = time.monotonic() + minutes * 60
    faults: Counter = Counter()
    acked: list[dict] = []
    errors: list[str] = []
    executed_before: dict[str, set] = {"n0": set(), "n1": set()}
    twice_across: set = set()
    rounds = 0

    async def replays():
        nonlocal rounds
        while time.monotonic() < stop_at:
            d = AckDriver(stack.url, TOKENS["runtime"], speed=30.0, call_s=0.02, retry_s=120)
            await d.replay(trace_for(rounds, seed))
            acked.extend(d.acked)
            errors.extend(d.errors)
            rounds += 1

    async def inject():
        while time.monotonic() < stop_at - fault_every:
            await asyncio.sleep(rng.uniform(0.5, 1.5) * fault_every)
            kind = rng.choice(["adapter_kill", "engine_loss", "server_kill"])
            i = rng.randrange(2)
            node = ("n0", "n1")[i]
            if kind == "adapter_kill":
                p = stack.adapters[i]
                p.send_signal(signal.SIGKILL)
                p.wait()
                executed_before[node] |= set(stack.inventory(node)["executed"])
                (stack.tmp / f"inv-{node}.json").unlink(missing_ok=True)
                await asyncio.to_thread(start_adapter, stack, node)
                stack.adapters[i] = stack.adapters.pop()
            elif kind == "engine_loss":
                stack.adapters[i].send_signal(signal.SIGUSR1)
            else:
                await asyncio.to_thread(stack.kill_server)
            faults[kind] += 1

    await asyncio.gather(replays(), inject())
    await asyncio.to_thread(settled, stack)  # raises if the books never equal the inventories
    for node in ("n0", "n1"):
        twice_across |= executed_before[node] & set(stack.inventory(node)["executed"])
    programs = {json.loads(b)["program"]: json.loads(b) for (b,) in stack.ledger("SELECT body FROM programs")}
    lost = []
    for ev in acked:
        rec = programs.get(ev["program"])
        if rec is None or (ev["type"] == "program_finished" and rec["status"] != "finished") or \
                (ev["type"] == "call_finished" and rec["calls"].get(ev.get("call"), {}).get("status") != "finished"):
            lost.append(ev)
    ops = stack.ledger("SELECT COUNT(*) FROM ops")[0][0]
    d0 = decisions(stack)
    await asyncio.to_thread(wait_until, lambda: decisions(stack) >= d0 + 6, 60, "six planning steps")
    idle_ops = stack.ledger("SELECT COUNT(*) FROM ops")[0][0] - ops
    executed = [o for n in ("n0", "n1") for o in stack.inventory(n)["executed"]]
    failed = Counter(reason.split(":")[0][:60] for (reason,) in stack.ledger("SELECT reason FROM ops WHERE status = 'failed'"))
    return {"minutes": minutes, "rounds": rounds, "faults": dict(faults), "events_acked": len(acked),
            "events_lost": len(lost), "ops_done": stack.ledger("SELECT COUNT(*) FROM ops WHERE status = 'done'")[0][0],
            "ops_total": ops, "executed_twice_one_process": len(executed) - len(set(executed)),
            "executed_again_after_restart": len(twice_across), "ops_failed": dict(failed.most_common(6)),
            "ops_by_idle_planner": idle_ops, "books_equal_inventories": True, "driver_errors": len(errors),
            "first_errors": errors[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--fault-every", type=float, default=8.0, help="mean seconds between faults")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    stack = Stack(Path(tempfile.mkdtemp(prefix="soak-chaos-")))
    try:
        stack.start_server()
        stack.start_adapters()
        out = asyncio.run(soak(stack, a.minutes, a.fault_every, a.seed))
    finally:
        stack.stop()
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
