"""The service's commands: serve, adapter, drive, residency, and profile (which measures this
machine for the adapters and the cost model). The token commands are in tokens.py."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

from ..models.errors import InputError
from .common import (CatalogOpt, ClusterOpt, TokenFileOpt, TokenOpt, TraceOpt, check_outputs, check_planner,
                     console, err, fail, guard, layout_text, load_layout_checked, load_trace_warned, progress_bar, resolve_token, write_json)
from .render import counts_text, print_profile, print_residency


# How long `drive` waits for a planner that refuses connections (still starting).
PLANNER_WAIT_S = 10.0


def _check_port(host: str, port: int) -> None:
    """Bind each address `host` names, as uvicorn's asyncio server will (IPv6 v6-only, address
    families the machine lacks skipped), and fail in one line if one is taken or refused."""
    import errno
    import socket

    try:
        addrs = {a[4]: a[0] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
    except socket.gaierror as e:
        fail(f"--host {host}: {e.strerror}")
    for addr, family in addrs.items():
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(addr)
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    continue
                hint = " (another server there? pick --port)" if e.errno == errno.EADDRINUSE else ""
                fail(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}")


def _check_db(db: Path) -> None:
    """Refuse a --db that cannot be the ledger before anything is written: a folder, a path under
    a file, a file that is not SQLite (SQLite would say only "file is not a database", later)."""
    check_outputs(files=[("--db", db)])
    if db.is_file() and db.stat().st_size:
        with open(db, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise InputError(str(db), "", "is not a SQLite file; --db takes the ledger `serve` created, or a new path")


def _ledger_runs(db: Path):
    """(cluster, catalog, (layout, holds)) a ledger at `db` already runs (a restart runs them,
    whatever --cluster says; layout None: none), read without writing; None for a new or empty ledger."""
    import sqlite3

    from ..models.catalog import Catalog
    from ..models.cluster import Cluster

    if not (db.is_file() and db.stat().st_size):
        return None
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        meta = dict(con.execute("SELECT k, v FROM meta WHERE k IN ('cluster', 'catalog', 'layout')").fetchall())
    except sqlite3.Error:  # no meta table yet
        return None
    finally:
        con.close()
    if "cluster" not in meta or "catalog" not in meta:
        return None
    from ..service.live import ledger_layout

    return (Cluster(**json.loads(meta["cluster"])), Catalog(**json.loads(meta["catalog"])),
            ledger_layout(json.loads(meta.get("layout", "null"))))


def _layout_said(now: tuple, before: tuple, given: bool) -> str:
    """The start line's words on the layout (`now`, `before`: (homes, holds), homes None for none):
    which one runs, and what became of the ledger's (a unit file's --layout replaces at every
    restart what PUT /v1/layout set since)."""
    if now[0] is None:
        return f", no layout (the ledger's {layout_text(*before)} dropped)" if before[0] else ""
    if not given:
        return f", layout {layout_text(*now)} (the ledger's)"
    replaced = before[0] is not None and before != now
    return f", layout {layout_text(*now)}" + (f" (replaces the ledger's {layout_text(*before)})" if replaced else "")


@guard
def serve(
    db: Annotated[Path, typer.Option(help="SQLite ledger (created if missing; a restart resumes from it)")] = Path("statebudget.db"),
    cluster: ClusterOpt = "hetero16",
    catalog: CatalogOpt = "agent-team",
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=0, max=65535)] = 8700,
    tokens: Annotated[Optional[Path], typer.Option(help="token file (default: <db>.tokens.json; created if missing, "
                                                        "with one admin token whose secret goes to <db>.admin-token)")] = None,
    profile: Annotated[Optional[Path], typer.Option(help="a `statebudget profile` file: measured bandwidths replace the presets'")] = None,
    tick_s: Annotated[float, typer.Option(help="planning step at least this often (seconds)", min=0.01)] = 5.0,
    queue: Annotated[str, typer.Option(help="fcfs | plas | atlas | auto (atlas while finished programs are "
                                            "heavy-tailed, else fcfs): the discipline whose priority call_arrived "
                                            "answers (pass it to the engine, e.g. vLLM's `priority`)")] = "fcfs",
    kv_rule: Annotated[str, typer.Option(help="preserve | swap | discard | adaptive: what happens to a program's KV "
                                              "in HBM while it waits on a tool (the simulator's rule, as ops)")] = "preserve",
    tenant_weights: Annotated[str, typer.Option(help="TENANT=WEIGHT,...: each tenant's fair share in the plas/atlas "
                                                "priority (1 for a tenant not named)")] = "",
    stage_host: Annotated[bool, typer.Option(help="stage weights in host DRAM ahead of use (off for vLLM/SGLang "
                                                  "adapters: their engines reach host DRAM only by sleeping)")] = True,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
    require_checksums: Annotated[bool, typer.Option(help="ops ask for a checksum and a done report without one is "
                                                         "refused (local adapters verify every copy; vLLM and SGLang "
                                                         "sleep/wake cannot)")] = False,
    synchronous: Annotated[str, typer.Option(help="full | normal: SQLite's sync of the ledger at each commit (full "
                                                  "survives a power loss; normal only a crash of the process)")] = "full",
    track_every_s: Annotated[float, typer.Option(help="track a forecast MILP solved this often, off the event loop "
                                                 "(`statebudget-track`, docs/tracking.md); 0: the greedy step alone",
                                                 min=0.0)] = 60.0,
    overload_wait_s: Annotated[float, typer.Option(help="a group whose waiting calls would hold a new one this long, "
                                                   "and one has waited as long, is past capacity: leases onto it are "
                                                   "rejected with a Retry-After (docs/planner.md); below the gateway's "
                                                   "timeout_s, or its calls never wait that long; 0: off",
                                                   min=0.0)] = 90.0,
    scale_out_wait_s: Annotated[float, typer.Option(help="a call of a dense model that has waited this long for HBM "
                                                    "at its group, with no group clear of the queue holding the "
                                                    "model, adds a replica on the group with the most free HBM "
                                                    "that can hold its typical call "
                                                    "(docs/planner.md); the same queue as --overload-wait-s; 0: off",
                                                    min=0.0)] = 20.0,
    scale_out_fits: Annotated[bool, typer.Option("--scale-out-fits/--scale-out-anywhere",
                                                 help="a replica only where the model's typical call (the mean "
                                                      "room its finished calls asked for) fits beside its weights, "
                                                      "or wherever the weights fit")] = True,
    docs: Annotated[bool, typer.Option(help="serve /docs (plain HTML, nothing from the internet) and /openapi.json, "
                                            "both for admin tokens")] = False,
    layout: Annotated[Optional[Path], typer.Option(
        help="an operator's layout (`homes:` model: [GPU index, ...], or what `statebudget layout --json` wrote): "
             "a model with no copy is homed on its group, with `holds: true` one with a copy elsewhere too "
             "(docs/tracking.md). The ledger keeps it: a restart "
             "without --layout keeps it, `--layout none` drops it; PUT /v1/layout replaces it live")] = None,
):
    """Run the planner service: runtimes post events and leases, adapters poll plans (docs/service.md).
    On a restart with the same --db the cluster and catalog come from the ledger. Without --tokens
    (or STATEBUDGET_TOKENS_FILE / STATEBUDGET_TOKENS) the first start creates <db>.tokens.json,
    which keeps token digests only, and writes the one admin token it mints to <db>.admin-token
    (mode 600), never to the log: read it from there, keep it where your secrets live, and delete
    the file. Add runtime and adapter tokens with `statebudget token add`."""
    import sqlite3

    import uvicorn

    from ..api.app import create_app, setup_logging
    from ..api.auth import Auth, create_token_file, write_private
    from ..models.load import check_compatible, load_catalog, load_cluster
    from ..service.ledger import Store
    from ..service.live import LivePlanner
    from ..core.toolwait import KV_RULES
    from ..core.programs import QUEUES, parse_tenant_weights

    from ..service.ledger import SYNCHRONOUS

    for name, value, known in (("--queue", queue, QUEUES), ("--kv-rule", kv_rule, KV_RULES),
                               ("--synchronous", synchronous.upper(), SYNCHRONOUS)):
        if value not in known:
            fail(f"{name} {value!r}: expected one of {', '.join(known)}")
    try:
        weights = parse_tenant_weights(tenant_weights)
    except ValueError as e:
        fail(str(e))
    setup_logging(log_level)
    _check_db(db)  # before anything is written
    _check_port(host, port)
    cl, cat = load_cluster(cluster), load_catalog(catalog)  # bad input fails before anything is written
    check_compatible(cl, cat)
    # The layout is checked before anything is written, against the cluster the planner will run:
    # the ledger's on a restart, else --cluster.
    runs = _ledger_runs(db)
    try:
        homes, holds = (None, False) if str(layout) == "none" else \
            load_layout_checked(layout, *(runs[:2] if runs else (cl, cat)))
    except InputError as e:
        if runs is None or not e.what.startswith("homes["):
            raise
        raise InputError(e.source, e.where, f"{e.what} (on {runs[0].name} and {runs[1].name}, the ledger's: "
                                            "a restart runs them)") from None
    prof = None
    if profile is not None:
        from ..engine_adapters.local.profile import load_profile
        prof = load_profile(profile, cl)
        if prof.get("machine", {}).get("device") == "arena":
            err.print(f"[yellow]warning:[/] {profile} was measured without a GPU (device arena in RAM): its h2d/d2h "
                      "links are host copies, not PCIe", highlight=False)
    mint = tokens is None and not os.environ.get("STATEBUDGET_TOKENS_FILE") and not os.environ.get("STATEBUDGET_TOKENS")
    if mint:
        tokens = db.with_name(db.name + ".tokens.json")
        check_outputs(files=[("--tokens", tokens)])
        mint = not tokens.exists()
    auth = None if mint else Auth.load(tokens)  # a bad token file fails before the ledger is opened
    try:
        store = Store(db, synchronous=synchronous)
    except sqlite3.Error as e:
        fail(f"{db}: cannot open the ledger: {e}")
    if mint:
        # The secret goes to its own mode-600 file, not to stderr: a server's stderr often ends in
        # a log that others read, and the token file keeps digests only.
        admin_file = db.with_name(db.name + ".admin-token")
        write_private(admin_file, create_token_file(tokens) + "\n")
        err.print(f"created {tokens} (token digests only); the admin token is in {admin_file} (mode 600): keep it "
                  f"safe and delete that file. Add runtime and adapter tokens with "
                  f"`statebudget token add --tokens {tokens} --role runtime --tenant NAME --out FILE`", highlight=False)
        auth = Auth.load(tokens)
    from ..planner.config import lease_config
    from ..planner.target import TrackConfig

    track = TrackConfig(replan_s=track_every_s) if track_every_s > 0 else None
    config = lease_config(stage_host=stage_host, overload_wait_s=overload_wait_s or None,
                          scale_out_wait_s=scale_out_wait_s or None, scale_out_fits_typical=scale_out_fits,
                          homes=homes, layout_holds=holds)
    planner = LivePlanner(cl, cat, store, profile=prof, queue=queue, config=config,
                          kv_rule=kv_rule, tenant_weights=weights, require_checksums=require_checksums, track=track)
    if layout is not None and homes is None and planner.layout:  # `none`, or a search that kept none
        planner.set_layout(None)
    if (planner.cluster.name, planner.catalog.name) != (cl.name, cat.name):
        err.print(f"[yellow]warning:[/] {db} was started with cluster {planner.cluster.name} and catalog "
                  f"{planner.catalog.name}; they win over --cluster {cl.name} --catalog {cat.name} (serve a fresh --db, or "
                  f"PUT /v1/cluster while the planner holds no state)", highlight=False)
    err.print(f"planner on http://{host}:{port}: cluster {planner.cluster.name}, catalog {planner.catalog.name}, "
              f"queue {queue}, tool-wait KV {kv_rule}, ledger {db} (plan version {planner.plan_version}, {len(planner.ops)} open ops)"
              + _layout_said((planner.layout, planner.layout_holds), runs[2] if runs else (None, False),
                             layout is not None))
    uvicorn.run(create_app(planner, auth, tick_s=tick_s, docs=docs), host=host, port=port, log_level="warning")


@guard
def adapter(
    kind: Annotated[str, typer.Argument(help="local | vllm | sglang (lmcache: from Python, it needs KV token ids)")],
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    node: Annotated[str, typer.Option(help="the node (host) this adapter serves")],
    token: TokenOpt = None,
    token_file: TokenFileOpt = None,
    root: Annotated[Path, typer.Option(help="local: data directory (NVMe tier = safetensors files under ROOT/NODE/nvme)")] = Path("statebudget-data"),
    arena_mb: Annotated[Optional[float], typer.Option(help="local: device arena per GPU in MB (1e6 B) when there is no CUDA (default 1 GiB)")] = None,
    inventory: Annotated[Optional[Path], typer.Option(help="local: after each poll, write the ops executed and the copies held here (JSON)")] = None,
    engines: Annotated[Optional[Path], typer.Option(help="vllm, sglang: JSON file {endpoints: {MODEL@gpu:I: URL}, model_paths, "
                                                        "cpu_backup, api_key, commands}; local: engine processes "
                                                        "(commands) that follow the weights")] = None,
    catalog: Annotated[Optional[str], typer.Option(help="local: create this catalog's model store under ROOT first")] = None,
    bytes_scale: Annotated[float, typer.Option(help="local: objects get this fraction of their real size (e.g. 0.001 "
                                                    "to run a real catalog's plan on a laptop)")] = 1.0,
    wait_s: Annotated[float, typer.Option(help="long-poll wait")] = 10.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
):
    """Run an engine adapter: poll the plan of NODE, execute its ops, report them. The adapter
    token for NODE comes from --token-file, STATEBUDGET_TOKEN or STATEBUDGET_TOKEN_FILE."""
    from ..api.app import setup_logging
    from ..engine_adapters import adapter_class

    setup_logging(log_level)
    cls = adapter_class(kind)  # an unknown kind fails here, naming the known ones
    token = resolve_token(token, token_file, f"an adapter token for node {node}")
    if kind == "lmcache":
        fail("the lmcache adapter needs the token ids of each program's KV from the runtime: start it from Python "
              "(statebudget.engine_adapters.lmcache.LMCacheAdapter, tokens_of=...) or pass it to a vllm/sglang adapter")
    if kind in ("vllm", "sglang"):
        from ..engine_adapters.http import load_engine_file

        if engines is None:
            fail(f"adapter {kind} needs --engines FILE: where each (model, GPU group) server listens")
        cfg = load_engine_file(engines)
        extra = {"model_paths": cfg.model_paths, "cpu_backup": cfg.cpu_backup} if kind == "sglang" else {}
        sup = cfg.supervisor()
        a = cls(planner, node, token, cfg.endpoint_map(), engine_client=cfg.engine_client(), supervisor=sup, **extra)
        err.print(f"{kind} adapter of {node} polling {planner}; {len(cfg.endpoints)} engine servers"
                  + (f", {len(cfg.commands)} started on demand" if sup else ""))
        try:
            a.run(wait_s=wait_s)
        finally:
            if sup is not None:
                sup.close()
        return
    if not 0 < bytes_scale <= 1:
        fail(f"--bytes-scale must be in (0, 1], got {bytes_scale}")
    sup, endpoints = None, None
    if engines is not None:  # engine processes that follow the weights (fake engines, for a gateway)
        from ..engine_adapters.http import load_engine_file

        ef = load_engine_file(engines)
        sup, endpoints = ef.supervisor(), ef.endpoint_map()
    a = cls(planner, node, token, root=root / node, arena_bytes=int(arena_mb * 1e6) if arena_mb else None,
            bytes_scale=bytes_scale, supervisor=sup, endpoints=endpoints)
    if catalog is not None:
        from ..models.load import load_catalog

        from ..engine_adapters.local import DataPlaneError

        try:
            err.print(f"model store: {a.plane.stock(load_catalog(catalog))} objects under {root / node}")
        except DataPlaneError as e:
            fail(str(e))

    # SIGUSR1 does to the data plane what an engine crash does to its GPU memory (for drills and
    # chaos tests): every copy in HBM is lost, between two polls; the adapter then sends the
    # planner its inventory again, as after an engine restart.
    crash = {"due": False}
    signal.signal(signal.SIGUSR1, lambda *_: crash.__setitem__("due", True))

    def after_step(_n: int) -> None:
        if crash["due"]:
            crash["due"] = False
            err.print(f"SIGUSR1: {a.plane.lose_gpus()} copies in HBM lost, as in an engine crash")
        if inventory is not None:
            tmp = inventory.with_name(inventory.name + ".tmp")
            tmp.write_text(json.dumps(a.inventory()))
            tmp.replace(inventory)

    err.print(f"local adapter of {node} polling {planner}; data under {root / node} ({a.plane.device})"
              + (f"; {len(sup.engines)} engine processes" if sup else ""))
    if sup is not None:  # uvicorn-free: SIGTERM ends the run, and the engines go with it
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        a.run(wait_s=wait_s, on_step=after_step)
    finally:
        if sup is not None:
            sup.close()


@guard
def drive(
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    trace: TraceOpt,
    token: TokenOpt = None,
    token_file: TokenFileOpt = None,
    speed: Annotated[float, typer.Option(help="trace seconds per wall second", min=0.001)] = 20.0,
    call_s: Annotated[float, typer.Option(help="wall seconds each call runs (no engine here)", min=0.0)] = 0.05,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the summary here")] = None,
):
    """Replay a trace against a live planner as an agent runtime: events, leases from the hints,
    and whether each lease was ready when its call came. The runtime token comes from
    --token-file, STATEBUDGET_TOKEN or STATEBUDGET_TOKEN_FILE."""
    check_outputs(files=[("--json", json_out)])
    token = resolve_token(token, token_file, "a runtime token")
    import asyncio

    from ..api.driver import Driver

    tr = load_trace_warned(trace)
    check_planner(planner, PLANNER_WAIT_S)
    try:
        out = asyncio.run(Driver(planner, token, speed, call_s).replay(tr))
    except PermissionError as e:
        fail(f"the planner refused the token ({e}); a runtime token comes from "
              f"`statebudget token add --tokens FILE --role runtime --tenant NAME`")
    late = out["rejected_quoted_after_deadline"]
    why = (f" ({late} rejected because the quote's P95 came after the deadline: deadlines shrink with "
           f"--speed, transfers do not)") if late else ""
    console.print(f"{out['events']} events; leases {counts_text(out['leases'])}{why}; ready when the quote promised: "
                  f"{out['ready_when_promised']}/{out['promised_by_quote']}; request p99 {out['request_ms']['p99']} ms; "
                  f"{out['n_errors']} errors")
    if json_out:
        write_json(json_out, out)
    if out["n_errors"]:
        err.print(f"[bold red]{out['n_errors']} requests failed[/], the first: {out['errors'][0]}", highlight=False)
        raise typer.Exit(1)


@guard
def residency(
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    token: TokenOpt = None,
    token_file: TokenFileOpt = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the raw answer here")] = None,
):
    """What a live planner holds: every copy per tier (ready or in flight), open ops, leases. The
    admin token comes from --token-file (e.g. <db>.admin-token), STATEBUDGET_TOKEN or STATEBUDGET_TOKEN_FILE."""
    check_outputs(files=[("--json", json_out)])
    token = resolve_token(token, token_file, "an admin token")
    import httpx

    r = httpx.get(planner.rstrip("/") + "/v1/residency", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if r.status_code != 200:
        fail(f"{planner}: {r.status_code} {r.json().get('detail', r.text) if r.headers.get('content-type', '').startswith('application/json') else r.text}")
    body = r.json()
    print_residency(body)
    if json_out:
        write_json(json_out, body)


@guard
def profile_cmd(
    cluster: ClusterOpt,
    out: Annotated[Path, typer.Option(help="JSON profile to write (for the --profile options)")],
    catalog: Annotated[Optional[str], typer.Option(help="catalog file or preset: adds per-model prefill tok/s")] = None,
    size_mb: Annotated[float, typer.Option(help="MiB moved by each transfer probe", min=0.001)] = 256,
    repeats: Annotated[int, typer.Option(help="probes per figure (the median is kept)", min=1)] = 3,
):
    """Measure this machine's file, host<->device and prefill rates into a cost-model profile."""
    check_outputs(files=[("--out", out)])
    from ..models.load import load_catalog, load_cluster
    from ..engine_adapters.local.profile import measure_profile, nominal_links

    cl = load_cluster(cluster)
    cat = load_catalog(catalog) if catalog else None
    with progress_bar(TextColumn("{task.description:<16}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                   TimeElapsedColumn()) as prog:
        task = prog.add_task("profiling", total=1)
        prof = measure_profile(cl, size_mb=size_mb, repeats=repeats, catalog=cat,
                               progress=lambda step, done, total: prog.update(task, description=step, completed=done,
                                                                               total=total))
    if prof["machine"]["device"] == "arena":
        err.print("[yellow]warning:[/] no CUDA device here: the h2d/d2h figures are RAM copies into the local "
                  "adapter's device arena and prefill runs on the CPU. Right for `adapter local` without a GPU; "
                  "measure on the GPU host for anything else.", highlight=False)
    print_profile(prof, cl, cat, nominal_links(cl), repeats)
    write_json(out, prof)
    console.print(f"wrote {out}")
