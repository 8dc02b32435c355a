"""The token commands: add, list, remove. The token file keeps digests only (api/auth.py has its
format); a secret is shown once, by `token add`, and a running `serve` sees every change on its
next request."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..models.errors import InputError
from .common import check_outputs, console, err, fail, guard

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in '3600', '3600s', '90m', '12h' or '30d'; ValueError naming the option otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"--expires-in {text!r}: expected a positive number of seconds, or N with s, m, h or d "
                         f"(30d, 12h, 3600s)")
    return float(m[1]) * _UNITS[m[2] or "s"]


def _when(expires_s: float | None, now: float) -> str:
    if expires_s is None:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(expires_s))
    return f"{stamp} (expired)" if now >= expires_s else stamp


def _scope(e) -> str:
    return ", ".join(x for x in (e.role, e.tenant and f"tenant {e.tenant}", e.node and f"node {e.node}") if x)


@guard
def token_add(
    tokens: Annotated[Path, typer.Option(help="token file (created if missing)")],
    role: Annotated[str, typer.Option(help="runtime | adapter | admin")],
    tenant: Annotated[Optional[str], typer.Option(help="runtime: the tenant the token speaks for")] = None,
    node: Annotated[Optional[str], typer.Option(help="adapter: the node the token serves")] = None,
    cluster: Annotated[Optional[str], typer.Option(help="cluster file or preset the server runs: an adapter's "
                                                        "--node must be one of its nodes")] = None,
    expires_in: Annotated[Optional[str], typer.Option(help="refuse the token after this long: 30d, 12h, 90m, "
                                                           "3600s or seconds (default: never)")] = None,
    id: Annotated[Optional[str], typer.Option("--id", help="a label for `token list` and `token remove` "
                                                           "(default: the first 12 hex digits of its digest)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write the token to this file (mode 600) for --token-file, "
                                                     "instead of printing it")] = None,
):
    """Mint a token and print it once (stdout), or write it to --out; the token file keeps only
    its SHA-256. A running `serve` takes it on its next request."""
    from pydantic import ValidationError

    from ..api.auth import SHORT_ID, add_token, digest, new_entry, write_private

    check_outputs(files=[("--tokens", tokens), ("--out", out)])
    if out is not None and out.resolve() == tokens.resolve():
        fail("--out names the token file itself: give the secret its own file")
    expires_s = round(time.time() + parse_duration(expires_in)) if expires_in is not None else None
    try:
        _, entry = new_entry(role, tenant, node, expires_s, id)  # a bad scope fails before any file is read
    except ValidationError as e:
        first = e.errors()[0]
        field = first["loc"][0] if first.get("loc") else None
        option = {"expires_s": "--expires-in"}.get(field, f"--{field}") if field else None
        fail((f"{option}: " if option else "") + first["msg"].removeprefix("Value error, "))
    if cluster is not None and role == "adapter":
        from ..models.load import load_cluster

        cl = load_cluster(cluster)
        if node not in cl.node_by_name:
            fail(f"--node {node!r}: cluster {cl.name} has no such node (nodes: {', '.join(cl.node_by_name)})")
    secret = add_token(tokens, role, tenant, node, expires_s, id)
    short = id or digest(secret)[:SHORT_ID]
    if out is not None:
        write_private(out, secret + "\n")
        err.print(f"token {short} ({_scope(entry)}) added to {tokens}; the secret is in {out} (mode 600)",
                  highlight=False)
    else:
        typer.echo(secret)
        err.print(f"token {short} ({_scope(entry)}) added to {tokens}; this is the only time it is shown",
                  highlight=False)


@guard
def token_list(tokens: Annotated[Path, typer.Option(help="token file")]):
    """The tokens of a token file: id, role, tenant, node, expiry. Never a secret."""
    from ..api.auth import read_tokens

    if not tokens.is_file():
        raise InputError(str(tokens), "", "no such token file")
    entries = read_tokens(tokens)
    now = time.time()
    table = Table("id", "role", "tenant", "node", "expires (UTC)", "stored", title=str(tokens), title_justify="left")
    for e in entries:
        table.add_row(e.short_id, e.role, e.tenant or "", e.node or "", _when(e.expires_s, now),
                      "sha256" if e.sha256 else "clear", style="dim" if e.expires_s is not None and now >= e.expires_s else None)
    console.print(table)
    clear = sum(e.sha256 is None for e in entries)
    if clear:
        err.print(f"[yellow]warning:[/] {clear} token(s) in {tokens} are stored in clear (a file from before digests); "
                  f"the next `token add` or `token remove` rewrites them as digests", highlight=False)


@guard
def token_remove(
    token: Annotated[str, typer.Argument(help="the token as `token add` printed it, or an id `token list` shows "
                                              "(or more hex digits of its digest)")],
    tokens: Annotated[Path, typer.Option(help="token file")],
):
    """Revoke a token: a running `serve` refuses it from its next request. The file is left as it
    was when TOKEN names none."""
    from ..api.auth import remove_token

    if not tokens.is_file():
        raise InputError(str(tokens), "", "no such token file")
    gone = remove_token(tokens, token)
    console.print(f"removed token {gone.short_id} ({_scope(gone)}) from {tokens}", highlight=False)
