"""Do two checkouts replay to the same reports? The check behind every "behaviour unchanged" change.

    mkdir -p /tmp/before && git archive REV | tar -x -C /tmp/before
    .venv/bin/python benchmarks/same_reports.py /tmp/before .

Each checkout's own `statebudget` (put first on PYTHONPATH) generates the demo trace (swe-team,
seed 1, 2 h) and replays it under the nine demo policies, then generates mixed-tenants, mapreduce
and long-tail (seed 3, 0.5 h, load 8) and replays them with one prefill slot per GPU under five
specs that cover the queues and tool-wait KV rules. The traces must be byte-identical and the
reports equal once every `decision_ms` block (wall-clock time of policy calls) is removed.
Exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DEMO = "ondemand,lru-keepwarm,frequency,prefetch-all,static,llama-swap,ray-multiplex,statebudget,statebudget-lease"
SPECS = ("statebudget-lease,statebudget-lease:plas:adaptive,statebudget-lease:auto:adaptive,"
         "statebudget-lease:fcfs:swap,lru-keepwarm:atlas:discard")
RUNS = [("demo", "swe-team", ["--seed", "1", "--hours", "2"], ["--policy", DEMO])] + [
    (t, t, ["--seed", "3", "--hours", "0.5", "--load", "8"],
     ["--prefill-slots", "1", "--max-batch", "32", "--policy", SPECS])
    for t in ("mixed-tenants", "mapreduce", "long-tail")]


def _without_decision_times(doc):
    if isinstance(doc, dict):
        return {k: _without_decision_times(v) for k, v in doc.items() if k != "decision_ms"}
    if isinstance(doc, list):
        return [_without_decision_times(v) for v in doc]
    return doc


def _replay_all(src: Path, out: Path) -> None:
    # run from `out`: `python -c` puts the working directory ahead of PYTHONPATH, and a checkout's
    # own folder there would shadow the other one
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    cli = [sys.executable, "-c", "import sys; from statebudget.cli import app; sys.argv[0] = 'statebudget'; app()"]
    for name, preset, gen, replay in RUNS:
        trace = out / f"{name}.jsonl"
        subprocess.run(cli + ["trace", "gen", "--preset", preset, *gen, "--out", str(trace)], env=env, cwd=out,
                       check=True, capture_output=True)
        subprocess.run(cli + ["replay", "--cluster", "hetero16", "--catalog", "agent-team", "--trace", str(trace),
                              *replay, "--json", str(out / f"{name}.json")], env=env, cwd=out, check=True,
                       capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="a checkout (its folder holds statebudget/)")
    ap.add_argument("after", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / "before", Path(tmp) / "after"]
        for src, out in zip((args.before, args.after), outs):
            out.mkdir()
            _replay_all(src, out)
        same = True
        for name, *_ in RUNS:
            a, b = ((o / f"{name}.jsonl").read_bytes() for o in outs)
            ra, rb = (_without_decision_times(json.loads((o / f"{name}.json").read_text())) for o in outs)
            verdict = "identical" if a == b and ra == rb else "trace differs" if a != b else "report differs"
            same &= verdict == "identical"
            print(f"{name:14s} {verdict}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
