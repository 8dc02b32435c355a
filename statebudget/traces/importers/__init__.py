"""Import real traces into trace format v1 (`statebudget trace import`, docs/traces.md).

Each reader turns its files into sessions (`common.Session`: calls with their real tokens and
waits); `import_trace` chooses each call's catalog model, clips tokens, scales arrivals, keeps
the first hours and returns a `Trace` for `models.load.write_trace`. Bad rows are skipped and
counted or refused (`common.BadRows`). The only random draws are ServeGen's, seeded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ...models.catalog import Catalog
from ...models.errors import InputError
from ...models.trace import Trace, TraceHeader
from .azure import read_azure
from .common import BadRows, Builder, Clips, ModelChooser
from .mooncake import read_mooncake
from .servegen import read_servegen
from .tracelab import read_tracelab

FORMATS = ("mooncake", "azure", "servegen", "tracelab")


@dataclass
class ImportReport:
    rows_bad: int = 0
    first_bad: list[str] = field(default_factory=list)
    sessions: int = 0  # read, before --hours
    clips: Clips = field(default_factory=Clips)


def import_trace(fmt: str, paths: list[Path], catalog: Catalog, *, models: str | None = None,
                 mapping: str | None = None, model: str | None = None, rate_scale: float = 1.0,
                 hours: float | None = None, seed: int = 1, tenant: str = "default",
                 on_bad: str = "skip", catalog_name: str | None = None) -> tuple[Trace, ImportReport]:
    if fmt not in FORMATS:
        raise InputError("--format", "", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if not paths:
        raise InputError("IN", "", "no input file")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise InputError("--rate-scale", "", f"must be a positive, finite number, got {rate_scale:g}")
    if hours is not None and not (math.isfinite(hours) and hours > 0):
        raise InputError("--hours", "", f"must be a positive, finite number, got {hours:g}")
    chooser = ModelChooser(catalog, models, mapping, model)  # bad options fail before any reading
    bad = BadRows(on_bad)
    paths = [Path(p) for p in paths]
    if fmt == "mooncake":
        sessions = read_mooncake(paths, bad)
    elif fmt == "azure":
        sessions = read_azure(paths, bad)
    elif fmt == "tracelab":
        sessions = read_tracelab(paths, bad)
    else:
        sessions = read_servegen(paths, bad, seed, rate_scale, hours)
    seen: dict[str, int] = {}
    for sess in sessions:  # ids come from file names: two inputs of one name would collide
        seen[sess.pid] = seen.get(sess.pid, 0) + 1
    if dup := sorted(k for k, n in seen.items() if n > 1):
        raise InputError("IN", "", f"two sessions would both be program {dup[0]!r} ({len(dup)} such): inputs with the "
                         "same file name (give each its own name)")
    time_scale = 1.0 if fmt == "servegen" else rate_scale  # ServeGen's rates are scaled as drawn
    end = hours * 3600.0 if hours is not None else None
    builder = Builder(chooser, tenant)
    programs = []
    # Models are chosen in the source's order (the role rule numbers one-call classes as they appear).
    for s in sessions:
        start = round(s.start_s / time_scale, 3)
        if end is not None and start >= end:
            continue
        programs.append(builder.program(s, start))
    if not programs:
        raise InputError(", ".join(map(str, paths)), "", "no program to write"
                         + (f" in the first {hours:g} hours" if hours is not None and sessions else "")
                         + (f" ({bad.count} bad rows skipped, first: {bad.first[0]})" if bad.count else ""))
    programs.sort(key=lambda p: (p.start, p.program))
    source = {"format": fmt, "inputs": [p.name for p in paths], "models": chooser.describe(),
              "catalog": catalog_name or catalog.name, "rate_scale": rate_scale, "bad_rows_skipped": bad.count}
    header = TraceHeader(seed=seed, hours=hours, imported=source)
    report = ImportReport(rows_bad=bad.count, first_bad=bad.first, sessions=len(sessions), clips=builder.clips)
    return Trace(header=header, programs=programs), report


__all__ = ["FORMATS", "ImportReport", "import_trace"]
