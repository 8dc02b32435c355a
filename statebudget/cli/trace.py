"""`statebudget trace`: generate, inspect and fit traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..models.errors import InputError
from .common import check_outputs, console, fail, guard, load_trace_warned
from .render import print_trace_stats


@guard
def trace_gen(
    preset: Annotated[str, typer.Option(help="swe-team | swe-team-shuffled | mapreduce | mixed-tenants | long-tail | "
                                                "real-sessions (reads shared/data/real)")],
    out: Annotated[Path, typer.Option(help="JSONL file to write")],
    seed: Annotated[int, typer.Option(min=0)] = 1,
    hours: Annotated[float, typer.Option(help="trace length; fractions allowed")] = 2.0,
    load: Annotated[float, typer.Option(help="multiply the preset's program arrival rate", min=0.01)] = 1.0,
    hint_noise: Annotated[float, typer.Option(help="probability that a hint names a uniformly random other model "
                                              "(confidences stay calibrated: fewer hints are right, with lower "
                                              "confidence)", min=0.0, max=1.0)] = 0.0,
    tenant_weights: Annotated[str, typer.Option(help="TENANT=WEIGHT,...: the fair share plas and atlas give each "
                                                "tenant (written to the header; 1 for a tenant not named)")] = "",
    catalog: Annotated[Optional[str], typer.Option(help="write the calls for this catalog (preset or file): a model "
                                                   "it lacks becomes its model at the same rank by size (e.g. toy, "
                                                   "for a toy2 service on a laptop)")] = None,
):
    """Generate a deterministic trace (same preset, seed, hours and load: same bytes)."""
    check_outputs(files=[("--out", out)])
    from ..models.load import load_catalog, write_trace
    from ..core.programs import parse_tenant_weights
    from ..traces.generators import for_catalog, generate

    weights = parse_tenant_weights(tenant_weights)
    trace = generate(preset, seed, hours, load, hint_noise=hint_noise)
    if catalog is not None:
        trace, renames = for_catalog(trace, load_catalog("agent-team"), load_catalog(catalog))
        if renames:
            console.print("models renamed for the catalog: " + ", ".join(f"{a} -> {b}" for a, b in sorted(renames.items())))
    if weights:
        tenants = sorted({p.tenant for p in trace.programs})
        unknown = sorted(set(weights) - set(tenants))
        if unknown:
            raise InputError("--tenant-weights", "", f"{', '.join(unknown)}: {preset} has no programs of that "
                             f"tenant (its tenants: {', '.join(tenants)})")
        trace = trace.model_copy(update={"header": trace.header.model_copy(update={"tenant_weights": weights})})
    if not trace.programs:  # every command that reads a trace refuses one without programs
        fail(f"--hours {hours:g}: {preset} starts no program that soon (seed {seed}); nothing written")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(trace, out)
    console.print(f"wrote {out}: {len(trace.programs)} programs, {trace.n_calls} calls")


@guard
def trace_stats_cmd(
    trace: Annotated[Path, typer.Argument(help="trace file (JSONL, format v1)")],
    catalog: Annotated[Optional[str], typer.Option(help="catalog file or preset, for nominal call times")] = "agent-team",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the statistics as JSON")] = None,
):
    """What seed 001 asks to measure: call shares, switch matrix, concurrency, hotness, waits."""
    from ..models.load import load_catalog
    from ..traces.stats import trace_stats

    tr = load_trace_warned(trace)
    cat = load_catalog(catalog) if catalog else None
    s = trace_stats(tr, cat)
    if json_out:
        json_out.write_text(json.dumps(s, indent=1) + "\n")
    print_trace_stats(trace, s)


@guard
def trace_fit(
    data: Annotated[Path, typer.Option(help="folder with azure-llm-2023/ and tracelab/")] = Path("../shared/data/real"),
    out: Annotated[Optional[Path], typer.Option(help="where to write (default: the package's fitted.json)")] = None,
):
    """Refit the generators' token-length and tool-latency shapes to the real data."""
    from ..traces.fit import FITTED_PATH, fit_real

    if not data.is_dir():
        raise InputError(str(data), "", "no such folder")
    res = fit_real(data)
    target = out or FITTED_PATH
    target.write_text(json.dumps(res, indent=1) + "\n")
    console.print(f"wrote {target}")


@guard
def trace_import(
    inputs: Annotated[list[Path], typer.Argument(metavar="IN...", help="the real trace file(s), all of one format",
                                                 show_default=False)],
    fmt: Annotated[str, typer.Option("--format", help="mooncake | azure | servegen | tracelab")],
    out: Annotated[Path, typer.Option(help="JSONL file to write (trace format v1)")],
    models: Annotated[Optional[str], typer.Option(help="'role': each call's model by the role rule of "
                                                  "docs/traces.md (the default)")] = None,
    map_: Annotated[Optional[str], typer.Option("--map", help="KEY=MODEL,...: the source's model names, "
                                                "session classes or file classes onto catalog models "
                                                "(*=MODEL: the rest)")] = None,
    model: Annotated[Optional[str], typer.Option(help="every call on this one catalog model")] = None,
    rate_scale: Annotated[float, typer.Option(help="arrivals X times faster (X>1) or slower; ServeGen: its rates "
                                              "times X")] = 1.0,
    hours: Annotated[Optional[float], typer.Option(help="keep the programs that start in the first H hours")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random draws (ServeGen's arrivals and tokens)", min=0)] = 1,
    catalog: Annotated[str, typer.Option(help="catalog file or preset the models are checked against")] = "agent-team",
    tenant: Annotated[str, typer.Option(help="every program's tenant")] = "default",
    on_bad: Annotated[str, typer.Option(help="a bad row: skip (counted, the first few listed on stderr) or "
                                         "refuse (exit 2 naming file:line, nothing written)")] = "skip",
):
    """Turn a real trace into trace format v1 (same inputs and seed: same bytes)."""
    check_outputs(files=[("--out", out)])
    from ..models.load import load_catalog, write_trace
    from ..traces.importers import import_trace
    from .common import err

    trace, rep = import_trace(fmt, inputs, load_catalog(catalog), models=models, mapping=map_, model=model,
                              rate_scale=rate_scale, hours=hours, seed=seed, tenant=tenant, on_bad=on_bad,
                              catalog_name=catalog)
    if rep.rows_bad:
        err.print(f"skipped {rep.rows_bad} bad row(s); the first:", highlight=False)
        for line in rep.first_bad:
            err.print(f"  {line}", highlight=False)
    clipped = [f"{n} {what}" for n, what in ((rep.clips.context, "contexts"), (rep.clips.output, "outputs")) if n]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(trace, out)
    console.print(f"wrote {out}: {len(trace.programs)} programs, {trace.n_calls} calls"
                  + (f" (clipped: {', '.join(clipped)})" if clipped else ""), highlight=False)
