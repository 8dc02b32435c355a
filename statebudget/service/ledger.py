"""The durable ledger: what the live planner must not lose, in SQLite (WAL).

    meta        cluster, catalog, plan version, catalog epoch
    residency   one row per copy: (state key, tier) -> bytes, ready, version, epoch, op
    kv          one row per program KV: (program, model) -> tokens (the KV's version)
    leases      every lease: request, quote, state, objects, the GPU group it prepares
    ops         every op (closed ones until compaction): the op itself, its node, status, how
                often it was offered, its result, its place in the node's plan, the time before
                which it is held back, the failed drops before it, when it closed
    programs    program state: tenant, epoch, status, its calls
    oracle_runs background oracle jobs and their results

A request of the service is one transaction (`tx`), committed before the answer leaves: an
accepted lease, an acknowledged op or a residency change is on disk (in the WAL) when the client
hears of it, so a `kill -9` of the server loses none of them. `synchronous=FULL` (the default)
syncs the WAL at every commit, so a power loss loses none either; `NORMAL` is durable against a
crash of the process only, for less time per write (`benchmarks/bench_service.py` measures both).

A write that SQLite refuses (disk full, an I/O error, a locked file) rolls the transaction back
and raises `LedgerError`: the caller's memory must then follow the ledger (`LivePlanner`
rebuilds its books from it), so nothing is acknowledged that is not on disk.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS residency (
  key TEXT NOT NULL, tier TEXT NOT NULL, bytes REAL NOT NULL, ready INTEGER NOT NULL,
  version INTEGER NOT NULL, epoch INTEGER NOT NULL, op_id TEXT, last_use REAL NOT NULL,
  PRIMARY KEY (key, tier));
CREATE TABLE IF NOT EXISTS kv (program TEXT NOT NULL, model TEXT NOT NULL, tokens INTEGER NOT NULL,
  PRIMARY KEY (program, model));
CREATE TABLE IF NOT EXISTS leases (lease_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, program TEXT NOT NULL,
  state TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ops (op_id TEXT PRIMARY KEY, node TEXT NOT NULL, status TEXT NOT NULL,
  plan_version INTEGER NOT NULL, offered INTEGER NOT NULL, op TEXT NOT NULL, result TEXT, reason TEXT,
  ord INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL DEFAULT 0, tries INTEGER NOT NULL DEFAULT 0,
  closed_s REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS ops_open ON ops (status, node);
CREATE TABLE IF NOT EXISTS programs (program TEXT PRIMARY KEY, tenant TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS oracle_runs (run_id TEXT PRIMARY KEY, status TEXT NOT NULL, body TEXT NOT NULL);
"""
# the ops columns added since the first ledgers (`Store` adds them to an older one)
OPS_ADDED = (("ord", "INTEGER"), ("not_before", "REAL"), ("tries", "INTEGER"), ("closed_s", "REAL"))
OPS_COLUMNS = "op_id, node, status, plan_version, offered, op, result, reason, ord, not_before, tries, closed_s"


SYNCHRONOUS = ("FULL", "NORMAL")


class LedgerError(RuntimeError):
    """The ledger refused a write; the transaction was rolled back."""


class Store:
    """SQLite books of the live planner. One connection, guarded by a lock (the service runs its
    handlers on one event loop; background jobs write their results through the same lock)."""

    def __init__(self, path: str | Path, synchronous: str = "FULL"):
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous {synchronous!r}: expected one of {', '.join(SYNCHRONOUS)}")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self.db.executescript(SCHEMA)
        have = {r[1] for r in self.db.execute("PRAGMA table_info(ops)")}
        for col, kind in OPS_ADDED:
            if col not in have:
                self.db.execute(f"ALTER TABLE ops ADD COLUMN {col} {kind} NOT NULL DEFAULT 0")
                if col == "ord":  # an op's place was the order it was made in: its number (op<N>)
                    self.db.execute("UPDATE ops SET ord = CAST(substr(op_id, 3) AS INTEGER)")
        self.lock = threading.RLock()
        self._depth = 0

    @contextmanager
    def tx(self):
        """One transaction; nested uses join the outer one. SQLite's refusals (at a statement or
        at COMMIT) roll the whole transaction back and come out as `LedgerError`."""
        with self.lock:
            outer = self._depth == 0
            if outer:
                self._sql_checked(self.db.execute, "BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self
            except sqlite3.Error as e:
                self._depth -= 1
                self._rollback(outer)
                raise LedgerError(f"ledger write failed: {e}") from e
            except BaseException:
                self._depth -= 1
                self._rollback(outer)
                raise
            self._depth -= 1
            if outer:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.Error as e:
                    self._rollback(True)
                    raise LedgerError(f"ledger commit failed: {e}") from e

    def _rollback(self, outer: bool) -> None:
        if outer and self.db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
            self.db.execute("ROLLBACK")

    @staticmethod
    def _sql_checked(fn, *args):
        try:
            return fn(*args)
        except sqlite3.Error as e:
            raise LedgerError(f"ledger write failed: {e}") from e

    def probe_write(self) -> None:
        """Write and delete a page-sized row: does the ledger take a write that needs room now?
        Raises LedgerError if not."""
        with self.tx():
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('write_probe', ?)", ("x" * 4096,))
            self.db.execute("DELETE FROM meta WHERE k = 'write_probe'")

    def close(self) -> None:
        self.db.close()

    # ---- meta -------------------------------------------------------------------------------------
    def get_meta(self, k: str, default=None):
        row = self.db.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_meta(self, k: str, v) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, json.dumps(v)))

    # ---- residency -----------------------------------------------------------------------------------
    def put_copy(self, key: tuple, tier: str, nbytes: float, ready: bool, version: int, epoch: int,
                 op_id: str | None, last_use: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO residency VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (json.dumps(list(key)), tier, nbytes, int(ready), version, epoch, op_id, last_use))

    def delete_copy(self, key: tuple, tier: str) -> None:
        self.db.execute("DELETE FROM residency WHERE key = ? AND tier = ?", (json.dumps(list(key)), tier))

    def copies(self) -> list[dict]:
        rows = self.db.execute("SELECT key, tier, bytes, ready, version, epoch, op_id, last_use FROM residency "
                               "ORDER BY tier, key").fetchall()
        return [{"key": tuple(json.loads(k)), "tier": t, "bytes": b, "ready": bool(r), "version": v, "epoch": e,
                 "op_id": o, "last_use": lu} for k, t, b, r, v, e, o, lu in rows]

    def put_kv(self, program: str, model: str, tokens: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (program, model, tokens))

    def delete_kv(self, program: str, model: str) -> None:
        self.db.execute("DELETE FROM kv WHERE program = ? AND model = ?", (program, model))

    def kv(self) -> dict[tuple, int]:
        return {("kv", p, m): t for p, m, t in self.db.execute("SELECT program, model, tokens FROM kv")}

    # ---- leases, ops, programs ---------------------------------------------------------------------------
    def put_lease(self, lease_id: str, tenant: str, program: str, state: str, body: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?)",
                        (lease_id, tenant, program, state, json.dumps(body)))

    def leases(self) -> list[dict]:
        return [json.loads(b) for (b,) in self.db.execute("SELECT body FROM leases ORDER BY rowid")]

    def put_op(self, op_id: str, node: str, status: str, plan_version: int, offered: int, op: dict,
               result: dict | None, reason: str, order: int, not_before: float, tries: int,
               closed_s: float = 0.0) -> None:
        self.db.execute(f"INSERT OR REPLACE INTO ops ({OPS_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (op_id, node, status, plan_version, offered, json.dumps(op),
                         json.dumps(result) if result is not None else None, reason, order, not_before, tries,
                         closed_s))

    def get_op(self, op_id: str) -> dict | None:
        row = self.db.execute(f"SELECT {OPS_COLUMNS} FROM ops WHERE op_id = ?", (op_id,)).fetchone()
        return _op_row(row) if row else None

    def ops(self, status: str | None = None) -> list[dict]:
        q = f"SELECT {OPS_COLUMNS} FROM ops"
        rows = self.db.execute(q + " WHERE status = ? ORDER BY rowid" if status else q + " ORDER BY rowid",
                               (status,) if status else ()).fetchall()
        return [_op_row(r) for r in rows]

    def delete_closed_ops(self, before_s: float) -> int:
        """Closed ops that closed before `before_s` (a repeated report of one is then a 404)."""
        return self.db.execute("DELETE FROM ops WHERE status != 'open' AND closed_s < ?", (before_s,)).rowcount

    def delete_programs(self, programs: list[str]) -> int:
        n = 0
        for p in programs:
            n += self.db.execute("DELETE FROM programs WHERE program = ?", (p,)).rowcount
            n += self.db.execute("DELETE FROM kv WHERE program = ?", (p,)).rowcount
        return n

    def delete_leases(self, lease_ids: list[str]) -> int:
        return sum(self.db.execute("DELETE FROM leases WHERE lease_id = ?", (lid,)).rowcount for lid in lease_ids)

    def delete_old_runs(self, keep: int) -> int:
        """All but the newest `keep` oracle runs that have ended."""
        with self.lock:
            return self.db.execute("DELETE FROM oracle_runs WHERE status IN ('done', 'failed') AND rowid NOT IN "
                                   "(SELECT rowid FROM oracle_runs ORDER BY rowid DESC LIMIT ?)", (keep,)).rowcount

    def op_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM ops").fetchone()[0]

    def put_program(self, program: str, tenant: str, body: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO programs VALUES (?, ?, ?)", (program, tenant, json.dumps(body)))

    def programs(self) -> list[dict]:
        return [json.loads(b) for (b,) in self.db.execute("SELECT body FROM programs ORDER BY rowid")]

    # ---- oracle runs ------------------------------------------------------------------------------------
    def put_run(self, run_id: str, status: str, body: dict) -> None:
        with self.tx():
            self.db.execute("INSERT OR REPLACE INTO oracle_runs VALUES (?, ?, ?)", (run_id, status, json.dumps(body)))

    def get_run(self, run_id: str) -> dict | None:
        with self.lock:
            row = self.db.execute("SELECT body FROM oracle_runs WHERE run_id = ?", (run_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def runs(self) -> list[dict]:
        with self.lock:
            return [json.loads(b) for (b,) in self.db.execute("SELECT body FROM oracle_runs ORDER BY rowid")]


def _op_row(row) -> dict:
    op_id, node, status, pv, offered, op, result, reason, order, not_before, tries, closed_s = row
    return {"op_id": op_id, "node": node, "status": status, "plan_version": pv, "offered": offered,
            "op": json.loads(op), "result": json.loads(result) if result else None, "reason": reason or "",
            "order": order, "not_before": not_before, "tries": tries, "closed_s": closed_s}
