"""The `statebudget` command. A bad input file prints one line naming it, the place and the
problem, and exits 2 (no traceback)."""

from __future__ import annotations

import typer

from . import gateway, service, sim, tokens, trace

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
trace_app = typer.Typer(no_args_is_help=True, help="Generate, inspect and fit traces.")
app.add_typer(trace_app, name="trace")
bench_app = typer.Typer(no_args_is_help=True, help="Measure the planner itself.")
app.add_typer(bench_app, name="bench")
token_app = typer.Typer(no_args_is_help=True, help="Manage the service's bearer tokens.")
app.add_typer(token_app, name="token")

# Help lists the commands in this order.
trace_app.command("gen")(trace.trace_gen)
trace_app.command("stats")(trace.trace_stats_cmd)
trace_app.command("fit")(trace.trace_fit)
trace_app.command("import")(trace.trace_import)
app.command()(sim.replay)
app.command()(sim.oracle)
app.command()(sim.sweep)
app.command()(sim.layout)
app.command()(sim.evidence)
bench_app.command("planner")(sim.bench_planner_cmd)
app.command()(service.serve)
app.command()(service.adapter)
app.command()(service.drive)
app.command()(service.residency)
token_app.command("add")(tokens.token_add)
token_app.command("list")(tokens.token_list)
token_app.command("remove")(tokens.token_remove)
app.command()(gateway.gateway)
app.command("fake-engine")(gateway.fake_engine)
app.command("profile")(service.profile_cmd)
app.command()(sim.presets)

__all__ = ["app"]
