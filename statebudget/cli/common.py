"""What every command shares: the consoles, the common options, one-line errors and output checks."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from ..models.errors import InputError

# Reports are read in logs and CI too: with no terminal to size them to, tables get 200 columns
# (the replay table's twelve fit on one line each) unless COLUMNS says otherwise. Lines of text
# are never broken (soft wrap): a path or a command split over two lines cannot be copied.
_WIDTH = None if os.environ.get("COLUMNS", "").isdigit() else 200
console = Console(width=None if sys.stdout.isatty() else _WIDTH, soft_wrap=True)
err = Console(stderr=True, width=None if sys.stderr.isatty() else _WIDTH, soft_wrap=True)


# The options every command that reads a cluster, a catalog or a trace file shares.
ClusterOpt = Annotated[str, typer.Option(help="cluster file or preset (hetero16, hetero16-l40, hetero8, h200x8, "
                                               "single-a100, toy2)")]
CatalogOpt = Annotated[str, typer.Option(help="catalog file or preset (agent-team, solo, toy)")]
TraceOpt = Annotated[Path, typer.Option(help="trace file (JSONL, format v1)")]
LayoutOpt = Annotated[Optional[Path], typer.Option(
    help="an operator's layout for our planners (`homes:` model: [GPU index, ...], or what `statebudget layout "
         "--json` wrote): a model with no copy is homed on its group, with `holds: true` one with a copy "
         "elsewhere too (docs/tracking.md)")]

# A secret on the command line is in `ps` and shell history: commands that take a token read it
# from a file or the environment as well, and --token is never required.
TokenOpt = Annotated[Optional[str], typer.Option(
    help="the token itself; visible in `ps`: prefer --token-file, or STATEBUDGET_TOKEN in the environment")]
TokenFileOpt = Annotated[Optional[Path], typer.Option(
    help="file holding the token (as `statebudget token add --out` writes it); also STATEBUDGET_TOKEN_FILE")]


def resolve_token(token: str | None, token_file: Path | None, what: str) -> str:
    """The secret from --token, --token-file, STATEBUDGET_TOKEN or STATEBUDGET_TOKEN_FILE, in
    that order; `what` names the token wanted ("an adapter token for node n0") when none is."""
    if token is not None and token_file is not None:
        fail("give --token or --token-file, not both")
    if token is None and token_file is None:
        token = os.environ.get("STATEBUDGET_TOKEN") or None
        if token is None and os.environ.get("STATEBUDGET_TOKEN_FILE"):
            token_file = Path(os.environ["STATEBUDGET_TOKEN_FILE"])
    if token_file is not None:
        from ..models.load import read_utf8

        if not token_file.is_file():
            raise InputError(str(token_file), "", "no such token file")
        lines = [ln.strip() for ln in read_utf8(token_file, "file holding one token").splitlines() if ln.strip()]
        if lines and lines[0].startswith(("{", "[")):
            raise InputError(str(token_file), "", "is a JSON token list (the server's --tokens file), not one token: "
                                                  "give the file `statebudget token add --out` wrote")
        if len(lines) != 1:
            raise InputError(str(token_file), "", f"expected one token on one line, found {len(lines)} lines")
        token = lines[0]
    if not token:
        fail(f"no token: {what} comes from --token-file PATH or STATEBUDGET_TOKEN "
             f"(mint one with `statebudget token add`)")
    return token


def load_trace_warned(path: Path):
    """The trace at `path`; what in it is most likely a mistake (`trace_warnings`) goes to stderr."""
    from ..models.load import load_trace, trace_warnings

    tr = load_trace(path)
    for msg in trace_warnings(tr):  # names from the trace are text, never markup
        err.print(f"[yellow]warning:[/] {escape(str(path))}: {escape(msg)}", highlight=False)
    return tr


def layout_text(homes: tuple, holds: bool = False) -> str:
    """A layout on one line: "coder:10,11 reviewer:8" (" holding" with `layout_holds`)."""
    return " ".join(f"{m}:{','.join(map(str, g))}" for m, g in homes) + (" holding" if holds else "")


def load_layout_checked(path: Path | None, cluster=None, catalog=None) -> tuple[tuple | None, bool]:
    """(the layout in `path` as `PlannerConfig.homes`, its `holds`) ((None, False): none), each
    entry checked against the cluster and catalog when given (else its shape alone); a bad one
    fails here, naming the file and the entry."""
    if path is None:
        return None, False
    from ..models.load import found_elsewhere, load_layout
    from ..planner.homes import layout

    homes, names = load_layout(path)
    for what, found, want in found_elsewhere(names, cluster and cluster.name, catalog and catalog.name):
        err.print(f"[yellow]warning:[/] {escape(str(path))}: a layout found on {what} {escape(found)}, "
                  f"used on {escape(want)}", highlight=False)
    if not homes:
        why = "the search kept no layout" if homes is None else "it homes no model"
        err.print(f"[yellow]warning:[/] {escape(str(path))}: {why}; the planner homes models as without one",
                  highlight=False)
        return None, False
    if cluster is not None and catalog is not None:
        try:
            layout(catalog, cluster, homes)
        except ValueError as e:
            raise InputError(str(path), "", str(e)) from None
    return homes, names.get("holds", False)


def fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(2)


def check_outputs(files=(), folders=()) -> None:
    """Refuse, before any work, output paths that cannot be written: a file option naming a
    folder, a folder option naming a file. `files`, `folders`: (option, path or None)."""
    for want_folder, pairs in ((False, files), (True, folders)):
        for option, path in pairs:
            if path is None:
                continue
            if path.exists() and path.is_dir() != want_folder:
                raise InputError(str(path), "", f"is a folder; {option} takes a file path" if path.is_dir()
                                 else f"is a file; {option} takes a folder")
            parent = next((p for p in path.parents if p.exists()), None)
            if parent is not None and not parent.is_dir():
                raise InputError(str(path), "", f"{parent} is a file, so {option} cannot be written there")
            if path.exists() and not want_folder:  # /dev/null, /dev/fd/N: written in place
                if not os.access(path, os.W_OK):
                    raise InputError(str(path), "", f"{option} cannot be written: no permission")
            elif parent is not None:
                try:  # a read-only mount, a folder of another user, /proc: found out now, not after the run
                    tempfile.TemporaryFile(dir=parent).close()
                except OSError as e:
                    raise InputError(str(path), "", f"{option} cannot be written in {parent} ({e.strerror})") from None


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")


def check_planner(url: str, wait_s: float) -> None:
    """GET /healthz before a long run, so that a wrong URL fails now: a refused connection is
    retried for `wait_s` (a planner still starting) and then raised; any answer but 200 means it
    is not a planner (InputError)."""
    import httpx

    deadline = time.monotonic() + wait_s
    while True:
        try:
            r = httpx.get(url.rstrip("/") + "/healthz", timeout=5.0)
            break
        except httpx.ConnectError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
    if r.status_code != 200:
        raise InputError(url, "", f"GET /healthz answered {r.status_code}: not a StateBudget planner's base URL")


def guard(fn):
    """Turn bad input into one clear line and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        import httpx

        try:
            return fn(*a, **kw)
        except (InputError, ValueError, PermissionError) as e:
            fail(str(e))
        except OSError as e:  # a path that cannot be written; any other OSError keeps its traceback
            if e.filename is None:
                raise
            fail(f"{e.filename}: {e.strerror or e}")
        except httpx.InvalidURL as e:  # not a URL at all ("http://[::1")
            fail(f"not a URL: {e}")
        except httpx.HTTPError as e:  # a planner URL that is wrong, or a server that is down
            try:
                where = f" at {e.request.url}"
            except RuntimeError:  # an error raised before any request was made
                where = ""
            fail(f"cannot reach the planner{where}: {e or type(e).__name__} (is the URL right, with http://, "
                  f"and the server up?)")
    return wrapper


def progress_bar(*columns):
    """A progress bar on stderr, left on screen only where stderr is a terminal."""
    return Progress(*columns, console=err, transient=not sys.stderr.isatty())
