"""Bearer tokens with roles (DESIGN.md §7).

    runtime  events and leases; its tenant comes from the token, never from the body
    adapter  the plan and the ops of its own node only
    admin    operators: residency, cluster, oracle runs, metrics

The token file (JSON, mode 600) holds digests, never secrets:

    {"tokens": [{"sha256": "<64 hex digits>", "role": "runtime", "tenant": "team-a",
                 "expires_s": 1767225600, "id": "ci-runner"}, ...]}

`sha256` is the hex SHA-256 of the secret's UTF-8 bytes; `tenant` is required for a runtime token,
`node` for an adapter token; `expires_s` (unix seconds) is optional, past it the token is refused
with 401 "token expired"; `id` is an optional label that `token list` shows and `token remove`
takes (else the first 12 hex digits of the digest stand for it). Files written before digests
hold `{"token": "<secret>", ...}` entries: they still load, the secret is hashed on reading, and
`token add` or `token remove` rewrite such a file with digests only.

The file is named by `--tokens` or `STATEBUDGET_TOKENS_FILE`; `STATEBUDGET_TOKENS` gives the same
JSON inline. Every request stats the file (mtime, size, inode) and reads it again when it changed,
so a token added is accepted and a token removed refused from the next request on, with no
restart. A file that does not parse (an edit half done) or is gone keeps the tokens read last.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ..models.errors import InputError, pydantic_where
from ..models.load import read_utf8

log = logging.getLogger("statebudget.auth")

Role = Literal["runtime", "adapter", "admin"]

# The pattern of program names in api/schemas.py (`Name`), kept here on its own: tenants must
# never hold `#`, which namespaces programs per tenant, even if program names come to allow it.
_ID = re.compile(r"^[A-Za-z0-9._:/@+-]{1,200}$")
_ID_CHARS = "1-200 characters of A-Z a-z 0-9 . _ : / @ + -"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
SHORT_ID = 12  # hex digits of the digest that stand for a token without an `id`


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenEntry(BaseModel):
    token: str | None = Field(None, min_length=16, description="the secret in clear (files written before digests)")
    sha256: str | None = Field(None, description="hex SHA-256 of the secret")
    role: Role
    tenant: str | None = None
    node: str | None = None
    expires_s: float | None = Field(None, description="unix time after which the token is refused")
    id: str | None = Field(None, description="a label for `token list` and `token remove`")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v):
        if v is not None and not _HEX64.match(v):
            raise ValueError("expected 64 lowercase hex digits (the SHA-256 of the token)")
        return v

    @field_validator("tenant", "node", "id")
    @classmethod
    def _printable(cls, v, info):
        if v is not None and not _ID.match(v):
            raise ValueError(f"{info.field_name} {v!r}: expected {_ID_CHARS}")
        return v

    @model_validator(mode="after")
    def _scoped(self):
        if (self.token is None) == (self.sha256 is None):
            raise ValueError("an entry needs exactly one of sha256 (the token's digest) and token")
        if self.role == "runtime" and not self.tenant:
            raise ValueError("a runtime token needs a tenant")
        if self.role == "adapter" and not self.node:
            raise ValueError("an adapter token needs a node")
        return self

    @property
    def digest(self) -> str:
        return self.sha256 or digest(self.token)

    @property
    def short_id(self) -> str:
        return self.id or self.digest[:SHORT_ID]

    def stored(self) -> dict:
        """The entry as the file keeps it: the digest, never the secret."""
        return {"sha256": self.digest, **self.model_dump(exclude_none=True, exclude={"token", "sha256"})}


class TokenFile(BaseModel):
    tokens: list[TokenEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Principal:
    role: str
    tenant: str | None = None
    node: str | None = None


class Refused(Exception):
    """A token the service does not accept; the message is the 401's detail."""


def parse_tokens(text: str, source: str) -> list[TokenEntry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(source, f"line {e.lineno}", f"not JSON: {e.msg}") from None
    try:
        return TokenFile(**data).tokens if isinstance(data, dict) else TokenFile(tokens=data).tokens
    except ValidationError as e:
        where, msg = pydantic_where(e)
        raise InputError(source, where, msg.removeprefix("Value error, ")) from None


def read_tokens(path: Path) -> list[TokenEntry]:
    return parse_tokens(read_utf8(path, "token file"), str(path))


def _file_stamp(path: Path | None):
    """What tells that a file changed, for one `os.stat`: an edit in place changes its mtime (and
    mostly its size), a replacement (`token add`, an editor's save) its inode."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class Auth:
    def __init__(self, entries: list[TokenEntry], path: Path | None = None, clock=time.time, stamp=None):
        """`path`: the token file the entries came from, read again whenever it changes; `stamp`:
        its `_file_stamp` taken before it was read (by default, now)."""
        self._path, self._clock = path, clock
        self._stamp = stamp if stamp is not None else _file_stamp(path)
        self._set(entries)

    def _set(self, entries: list[TokenEntry]) -> None:
        self._by_digest = {e.digest: (Principal(e.role, e.tenant, e.node), e.expires_s) for e in entries}

    def authenticate(self, token: str) -> Principal:
        """The principal of `token`; raises Refused (unknown, or expired)."""
        if self._path is not None:
            stamp = _file_stamp(self._path)
            if stamp is not None and stamp != self._stamp:
                self._reload(stamp)
        known = self._by_digest.get(digest(token))
        if known is None:
            raise Refused("unknown bearer token")
        who, expires_s = known
        if expires_s is not None and self._clock() >= expires_s:
            raise Refused("token expired")
        return who

    def principal(self, token: str) -> Principal | None:
        """As `authenticate`, None where it refuses."""
        try:
            return self.authenticate(token)
        except Refused:
            return None

    def _reload(self, stamp) -> None:
        # The stamp is taken before the read: a change made while reading is seen on the next request.
        self._stamp = stamp
        try:
            self._set(read_tokens(self._path))
        except (OSError, InputError) as e:
            log.warning("token file not reloaded, the tokens read last stay in force: %s", e)

    @classmethod
    def from_json(cls, text: str, source: str, path: Path | None = None) -> "Auth":
        return cls(parse_tokens(text, source), path)

    @classmethod
    def load(cls, path: str | Path | None) -> "Auth":
        """From `path`, else `STATEBUDGET_TOKENS_FILE`, else inline `STATEBUDGET_TOKENS`."""
        path = path or os.environ.get("STATEBUDGET_TOKENS_FILE")
        if path:
            p = Path(path)
            if not p.exists():
                raise InputError(str(p), "file", "no such token file")
            stamp = _file_stamp(p)  # before the read: a change made meanwhile is read on the first request
            return cls(read_tokens(p), path=p, stamp=stamp)
        inline = os.environ.get("STATEBUDGET_TOKENS")
        if inline:
            return cls.from_json(inline, "STATEBUDGET_TOKENS")
        raise InputError("tokens", "file", "no token file given and STATEBUDGET_TOKENS is not set")


def write_private(path: Path, text: str) -> None:
    """Replace `path` at once with a mode-600 file: a server that re-reads it meanwhile sees the
    old file or the new one, never an empty or half-written one that would refuse a valid token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _write_tokens(path: Path, entries: list[TokenEntry]) -> None:
    write_private(path, json.dumps({"tokens": [e.stored() for e in entries]}, indent=1) + "\n")


@contextlib.contextmanager
def _locked(path: Path):
    """Serialise read-modify-write of one token file: two `token add` at once (a shell loop with
    `&`) would otherwise each write the file without the other's token. The lock file stays: one
    removed while another process waits on it would let a third take a second lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _secret() -> str:
    """A new token secret: 256 random bits in hex, so never a leading '-' that a command line
    would read as an option."""
    return secrets.token_hex(32)


def create_token_file(path: Path) -> str:
    """A new token file holding the digest of one admin token; returns the token, which is
    nowhere else: the caller hands it to the operator."""
    token = _secret()
    _write_tokens(path, [TokenEntry(token=token, role="admin")])
    return token


def new_entry(role: str, tenant: str | None = None, node: str | None = None, expires_s: float | None = None,
              id: str | None = None) -> tuple[str, TokenEntry]:
    """A fresh secret and its entry (digest only). Raises ValidationError for a bad scope."""
    token = _secret()
    return token, TokenEntry(sha256=digest(token), role=role, tenant=tenant, node=node, expires_s=expires_s, id=id)


def add_token(path: Path, role: str, tenant: str | None = None, node: str | None = None,
              expires_s: float | None = None, id: str | None = None) -> str:
    """Append a new token to a token file (created if missing) and return its secret; the file
    keeps only its digest, and clear entries already there are rewritten as digests."""
    token, entry = new_entry(role, tenant, node, expires_s, id)
    with _locked(path):
        entries = read_tokens(path) if path.exists() else []
        if id is not None and any(e.short_id == id for e in entries):
            raise InputError(str(path), "", f"a token with id {id!r} is already there (ids name one token each)")
        _write_tokens(path, entries + [entry])
    return token


def find_token(entries: list[TokenEntry], key: str, source: str) -> TokenEntry:
    """The entry that `key` names: the secret itself, an `id`, or a prefix of the digest (at least
    8 hex digits, the first 12 are what `token list` shows). Raises InputError if none or several."""
    d = digest(key)
    for e in entries:
        if hmac.compare_digest(e.digest, d):
            return e
    hits = [e for e in entries if e.id == key]
    if not hits and len(key) >= 8 and re.fullmatch(r"[0-9a-fA-F]+", key):
        hits = [e for e in entries if e.digest.startswith(key.lower())]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise InputError(source, "", f"{key!r} names {len(hits)} tokens ({', '.join(e.short_id for e in hits)}): "
                                     f"give more of the digest")
    # The key is not echoed: it may be a secret, mistyped.
    raise InputError(source, "", "no token here matches: give the token as `token add` printed it, or an id "
                                 "`token list` shows")


def remove_token(path: Path, key: str) -> TokenEntry:
    """Remove the token `key` names (see `find_token`) and return its entry. Raises InputError,
    the file left as it was, for a key that names none, and for the last token: a file with no
    token does not load, and a server re-reading it would keep the tokens it read last."""
    with _locked(path):
        entries = read_tokens(path)
        gone = find_token(entries, key, str(path))
        rest = [e for e in entries if e is not gone]
        if not rest:
            raise InputError(str(path), "", f"{gone.short_id} is the last token here; add its replacement first "
                                            f"(a token file holds one token at least)")
        _write_tokens(path, rest)
    return gone
