"""A soak of the live stack: `statebudget serve` on 127.0.0.1, two `statebudget adapter local`
processes (nodes n0 and n1 of `toy2`, 400 MB arenas: real bytes) and the runtime driver replaying a
`swe-team` trace mapped onto the `toy` catalog at 30x, one fresh stack per seed (the end-to-end
test's `Stack`). Prints per seed: ops in the ledger, failed ops and why, runtime errors, lease
decisions, and accepted leases whose quote promised the deadline / those ready at their call.

`--src DIR` runs the server and adapters of another checkout (e.g. `git archive <commit> | tar -x
-C DIR`) under this one's driver, so two versions are compared on the same seeds. The driver runs
the trace in wall-clock time: a run differs from the next by timing, so compare over seeds.

    python benchmarks/soak_service.py [--seeds 1,2,3] [--kv-rule swap] [--hours 0.08] [--src DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))  # a script, not a package: the end-to-end stack lives in the tests

from tests.helpers import wait_until  # noqa: E402
from tests.test_e2e_service import Stack  # noqa: E402


def soak(src: Path, seed: int, kv_rule: str, hours: float) -> dict:
    stack = Stack(Path(tempfile.mkdtemp(prefix=f"soak{seed}-")))
    stack.env["PYTHONPATH"] = str(src)
    try:
        stack.start_server("--kv-rule", kv_rule)
        stack.start_adapters()
        r = stack.replay(seed, hours)
        wait_until(stack.drained, 120, "the adapters to drain the plan")
        rows = stack.ledger("SELECT status, reason FROM ops")
        failed = [why for status, why in rows if status == "failed"]
        return {"seed": seed, "ops": len(rows), "failed": len(failed), "why": failed[:3], "errors": r["n_errors"],
                "leases": r["leases"], "promised": r["promised_by_quote"], "ready": r["ready_when_promised"]}
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--kv-rule", default="swap", choices=["preserve", "swap", "discard", "adaptive"])
    ap.add_argument("--hours", type=float, default=0.08)
    ap.add_argument("--src", type=Path, default=HERE, help="the checkout to run (default: this one)")
    a = ap.parse_args()
    rows = [soak(a.src.resolve(), int(s), a.kv_rule, a.hours) for s in a.seeds.split(",")]
    for row in rows:
        print(json.dumps(row))
    promised, ready = sum(r["promised"] for r in rows), sum(r["ready"] for r in rows)
    print(f"failed ops {sum(r['failed'] for r in rows)} of {sum(r['ops'] for r in rows)}; "
          f"ready when promised {ready}/{promised}")


if __name__ == "__main__":
    main()
