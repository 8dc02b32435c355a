"""The benchmarks' side of paired comparisons: saving and loading their rows, and a before/after
command. The statistics are the package's (`statebudget/sim/paired.py`), re-exported here for
bench_queues.py, bench_kv_rules.py, bench_failures.py and bench_policies.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from statebudget.sim.paired import _matches, fmt, paired_change, paired_diff, ratio_of_means, series, t_interval  # noqa: F401


def save(path: Path | None, rows: list[dict], paired: dict) -> None:
    """Write a benchmark's rows and paired comparisons as JSON (nothing if no path was given)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": rows, "paired": paired}, indent=1) + "\n")


def load_rows(paths: str) -> list[dict]:
    """The rows of one or more benchmark JSON files (comma-separated paths), e.g. two seed sets."""
    return [r for p in paths.split(",") for r in json.loads(Path(p).read_text())["rows"]]


def main():
    """Before/after: `python benchmarks/paired.py BEFORE.json[,...] AFTER.json[,...] [--metric
    programs_per_hour] [--by trace,load,rule]` pairs the two runs seed by seed for each group of
    rows (the seeds both runs have) and prints each group's means and the paired change."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--metric", default="programs_per_hour")
    ap.add_argument("--by", default="trace,load,rule")
    a = ap.parse_args()
    before, after = load_rows(a.before), load_rows(a.after)
    by = a.by.split(",")
    for group in sorted({tuple(r[k] for k in by) for r in after}, key=str):
        where = dict(zip(by, group))
        seeds = sorted({r["seed"] for r in before if _matches(r, where)} & {r["seed"] for r in after if _matches(r, where)})
        if not seeds:
            continue
        b, o = series(before, seeds, a.metric, **where), series(after, seeds, a.metric, **where)
        print(f"{' '.join(str(g) for g in group):32} before {np.mean(b):10.3f} after {np.mean(o):10.3f}  "
              f"after/before {fmt(paired_change(b, o))}")


if __name__ == "__main__":
    main()
