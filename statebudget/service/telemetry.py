"""What the live planner reports as it works. The planner calls these hooks; the service plugs
Prometheus in (`api/metrics.py`, `ServiceMetrics`); the default does nothing, for tests and
embedded use.

Outcomes are counted where the state changes, so each is counted once whatever asked for it: a
lease's end in the lease ledger (`LeaseLedger.on_end`: a second DELETE, or a program cancel that
stops its leases, ends nothing anew), a program's end in `_end_program`, an op's close in
`Journal._finish`. What is cheap to read off the books (occupancy, open ops, adapters' last
contact) is not reported here: the `/metrics` handler reads it at scrape time.

Hooks called inside a request's transaction are held (`HeldTelemetry`) and replayed once it
commits: a request the ledger refuses (503) is rolled back and counts nothing, and its retry
counts once.
"""

from __future__ import annotations

# The terminal states a lease ends in (`planner/leases.py`), each lease counted in one of them once.
LEASE_ENDS = ("consumed", "rejected", "cancelled", "stale", "expired")

# Why an op closed: a bounded set, so that a label never carries an engine's free-text error.
#   committed             done, version and epoch matched: the copy is ready
#   version_mismatch      done, but reported with another version or epoch than the op's
#   stale                 done as asked, but the state moved on while the op ran
#   engine_error          the adapter reported it failed
#   gave_up               a drop the engine failed for the last time (`DROP_TRIES`): the books let it go
#   cancelled_by_adapter  the adapter reported it cancelled
#   cancelled_by_planner  the planner stopped it (its lease ended, nobody waits, the state moved)
#   adapter_restarted     the planner failed it unreported: its node's adapter sent a new inventory
OP_REASONS = ("committed", "version_mismatch", "stale", "engine_error", "gave_up", "cancelled_by_adapter",
              "cancelled_by_planner", "adapter_restarted")


def op_reason(rec, books) -> str:
    """The reason class (`OP_REASONS`) of `rec`, an op record (`journal.OpRec`) just closed, read
    from its status and the adapter's report (None: the planner closed it). `books` is the
    planner: a failed drop counts as given up only if the books did not take the copy back."""
    from .journal import DROP_TRIES, OpStatus, object_key, tier_group  # the journal imports this module

    if rec.status == OpStatus.DONE:
        return "committed"
    report = rec.result
    if report is None:
        return "adapter_restarted" if rec.status == OpStatus.FAILED else "cancelled_by_planner"
    if report.get("status") == OpStatus.DONE:  # a done report the journal refused
        mismatch = (report.get("version"), report.get("epoch")) != (rec.op.version, rec.op.epoch)
        return "version_mismatch" if mismatch else "stale"
    if report.get("status") == OpStatus.CANCELLED:
        return "cancelled_by_adapter"
    op = rec.op
    if (op.kind == "drop" and rec.tries >= DROP_TRIES and op.src.startswith("gpu:")
            and (object_key(op.object), tier_group(op.src)) not in books.tiers.gpu):
        return "gave_up"
    return "engine_error"


class Telemetry:
    """The planner's hooks, each called once per thing it counts, never for a refused request."""

    def decision(self, seconds: float) -> None:
        """A planning step (`tick`) took `seconds` of wall time."""

    def lease(self, decision: str) -> None:
        """A lease was decided at submit: accepted, partial or rejected (its end: `lease_ended`)."""

    def lease_ended(self, state: str) -> None:
        """A lease reached the terminal `state` (`LEASE_ENDS`); called once per lease."""

    def program_ended(self, status: str) -> None:
        """A program finished or was cancelled (`status`); a repeated end event is not counted."""

    def moved(self, link: str, nbytes: float) -> None:
        """A committed op put `nbytes` on `link`."""

    def stall(self, seconds: float, handoff: bool) -> None:
        """A call started `seconds` after it arrived; `handoff`: its program changed model."""

    def event(self, kind: str) -> None:
        """A runtime event of type `kind` was accepted (a runtime's repeat of one included)."""

    def op(self, status: str, reason: str = "other") -> None:
        """An op closed with `status` (done, failed, cancelled) for `reason` (`OP_REASONS`)."""

    def kv_action(self, rule: str) -> None:
        """A tool-wait KV decision of `rule` (preserve, swap, discard) was taken anew."""

    def program_sizes(self, cv: float | None, ordering: str) -> None:
        """Queue `auto`: the CV of finished programs' service, and the discipline it orders by."""


class HeldTelemetry:
    """Telemetry calls held back during a transaction, replayed on the real one once it commits
    (dropped if it rolls back): what a refused request did is not counted."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        def hold(*args, **kw):
            self.calls.append((name, args, kw))
        return hold

    def replay(self, real) -> None:
        for name, args, kw in self.calls:
            getattr(real, name)(*args, **kw)
        self.calls.clear()
