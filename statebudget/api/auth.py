"""Bearer tokens with roles (DESIGN.md §7).

    runtime  events and leases; its tenant comes from the token, never from the body
    adapter  the plan and the ops of its own node only
    admin    operators: residency, cluster, oracle runs, metrics

Tokens come from a JSON file (`{"tokens": [{"token", "role", "tenant"?, "node"?}]}`), named by
`--tokens`, by `STATEBUDGET_TOKENS_FILE`, or given inline in `STATEBUDGET_TOKENS`. Tokens are kept
only as SHA-256 digests in memory. A file is read again when a request brings a token not known
and the file has changed since (`statebudget token add` while the server runs): no restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from ..models.errors import InputError, pydantic_where

Role = Literal["runtime", "adapter", "admin"]


class TokenEntry(BaseModel):
    token: str = Field(min_length=16, description="the bearer secret (at least 16 characters)")
    role: Role
    tenant: str | None = None
    node: str | None = None

    @model_validator(mode="after")
    def _scoped(self):
        if self.role == "runtime" and not self.tenant:
            raise ValueError("a runtime token needs a tenant")
        if self.role == "adapter" and not self.node:
            raise ValueError("an adapter token needs a node")
        return self


class TokenFile(BaseModel):
    tokens: list[TokenEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Principal:
    role: str
    tenant: str | None = None
    node: str | None = None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Auth:
    def __init__(self, entries: list[TokenEntry], path: Path | None = None):
        """`path`: the token file the entries came from, read again when it changes."""
        self._by_digest = {_digest(e.token): Principal(e.role, e.tenant, e.node) for e in entries}
        self._path = path
        self._stamp = self._file_stamp()

    def _file_stamp(self):
        try:
            st = self._path.stat() if self._path is not None else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size) if st is not None else None

    def principal(self, token: str) -> Principal | None:
        who = self._by_digest.get(_digest(token))
        if who is None and self._path is not None and self._file_stamp() != self._stamp:
            self._reload()
            who = self._by_digest.get(_digest(token))
        return who

    def _reload(self) -> None:
        """Read the token file again; a file broken mid-edit keeps the tokens known so far."""
        stamp = self._file_stamp()
        try:
            fresh = Auth.from_json(self._path.read_text(), str(self._path))
        except (OSError, InputError):
            return
        self._by_digest, self._stamp = fresh._by_digest, stamp

    @classmethod
    def from_json(cls, text: str, source: str, path: Path | None = None) -> "Auth":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(source, f"line {e.lineno}", f"not JSON: {e.msg}") from None
        try:
            return cls(TokenFile(**data).tokens if isinstance(data, dict) else TokenFile(tokens=data).tokens, path)
        except ValidationError as e:
            raise InputError(source, *pydantic_where(e)) from None

    @classmethod
    def load(cls, path: str | Path | None) -> "Auth":
        """From `path`, else `STATEBUDGET_TOKENS_FILE`, else inline `STATEBUDGET_TOKENS`."""
        path = path or os.environ.get("STATEBUDGET_TOKENS_FILE")
        if path:
            p = Path(path)
            if not p.exists():
                raise InputError(str(p), "file", "no such token file")
            return cls.from_json(p.read_text(), str(p), path=p)
        inline = os.environ.get("STATEBUDGET_TOKENS")
        if inline:
            return cls.from_json(inline, "STATEBUDGET_TOKENS")
        raise InputError("tokens", "file", "no token file given and STATEBUDGET_TOKENS is not set")


def _write_tokens(path: Path, data: dict) -> None:
    """Replace the token file at once (mode 600): a server that re-reads it meanwhile sees the old
    file or the new one, never an empty or half-written one that would refuse a valid token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def create_token_file(path: Path) -> str:
    """A new token file holding one admin token (mode 600); returns the token."""
    token = secrets.token_urlsafe(32)
    _write_tokens(path, {"tokens": [{"token": token, "role": "admin"}]})
    return token


def add_token(path: Path, role: str, tenant: str | None = None, node: str | None = None) -> str:
    """Append a new token to a token file (created if missing); returns it."""
    data = json.loads(path.read_text()) if path.exists() else {"tokens": []}
    entry = TokenEntry(token=secrets.token_urlsafe(32), role=role, tenant=tenant, node=node)
    data["tokens"].append(entry.model_dump(exclude_none=True))
    _write_tokens(path, data)
    return entry.token
