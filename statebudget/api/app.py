"""The app factory: the live planner behind FastAPI, with its planning loop.

Handlers are `async` and run on one event loop thread: the planner and its SQLite books are
touched by one request at a time, in order, and each request is one transaction committed before
its answer. The planning loop wakes when events arrive, waits `coalesce_s` for the events that
come with them, and takes one planning step for all (and every `tick_s` regardless, to expire
leases and follow the predictor, or sooner when a tool-wait KV timer is due). Long polls wait on the plan version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from .. import __version__
from ..models.errors import InputError
from ..service.ledger import LedgerError
from ..service.errors import REFUSAL_STATUS
from ..service.live import Conflict, Forbidden, Invalid, LivePlanner, NotFound, Unavailable
from . import docs as api_docs
from .auth import Auth
from .inputs import BodyLimit, excerpt, validation_failed
from .metrics import HttpMetrics, ServiceMetrics
from .routers import calls, events, health, inventory, leases, oracle, plan, queue, residency, ui

log = logging.getLogger("statebudget.api")


class RepeatedFailure:
    """How a loop that runs for days logs a failure. The first of a kind is logged with its
    traceback; the same failure again is one warning line at its 1st, 2nd, 4th ... 64th repeat and
    then at every 64th, so a step that fails on every event does not fill the log and one that
    keeps failing still says so. A failure's kind is its type and the line that raised it, not its
    message, which may name a call or a key; kinds that alternate are counted apart. The first
    success after failures says how many there were."""

    EVERY = 64  # past this many repeats, one line per this many

    def __init__(self, what: str):
        self.what = what  # "planning step", "tracking solve"
        self.repeats: dict[tuple, int] = {}  # kind -> repeats since its traceback, until a success

    def ok(self) -> None:
        if self.repeats:
            n = sum(self.repeats.values()) + len(self.repeats)
            log.warning("%s works again after %d failures", self.what, n)
        self.repeats = {}

    def failed(self, e: BaseException) -> None:
        """Call from inside the `except` block (the traceback is the one being handled)."""
        frames = traceback.extract_tb(e.__traceback__)
        kind = (type(e).__name__,) + ((frames[-1].filename, frames[-1].lineno) if frames else ())
        if kind not in self.repeats:
            log.exception("%s failed", self.what)
            self.repeats[kind] = 0
            return
        n = self.repeats[kind] = self.repeats[kind] + 1
        if (n & (n - 1) == 0 and n <= self.EVERY) or n % self.EVERY == 0:
            try:
                said = f"{type(e).__name__}: {e}"
            except Exception:  # an exception whose message cannot be formatted
                said = type(e).__name__
            log.warning("%s failed again (repeat %d since its traceback): %s", self.what, n, said)


class Service:
    """What the handlers share: the planner, the tokens, the metrics, and the version waiters."""

    def __init__(self, planner: LivePlanner, auth: Auth, metrics: ServiceMetrics, tick_s: float, coalesce_s: float):
        self.planner, self.auth, self.metrics = planner, auth, metrics
        self.tick_s, self.coalesce_s = tick_s, coalesce_s
        self._wake = asyncio.Event()            # events arrived: plan soon
        self._version_moved = asyncio.Event()   # replaced each time the plan version moves
        self._seen_version = planner.plan_version
        self._books_moved = asyncio.Event()     # replaced after every request that changed the books
        self._jobs: dict = {}  # run id -> the running oracle job (a future)

    def changed(self) -> None:
        """After a request changed the books: wake the planning loop, and the long polls if the
        plan version moved."""
        if self.planner.plan_due:
            self._wake.set()
        self._books_moved.set()
        self._books_moved = asyncio.Event()
        if self.planner.plan_version != self._seen_version:
            self._seen_version = self.planner.plan_version
            self._version_moved.set()
            self._version_moved = asyncio.Event()

    async def wait_for_version(self, after: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.planner.plan_version <= after:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._version_moved.wait(), left)
            except TimeoutError:
                return

    async def wait_until(self, done, wait_s: float):
        """`done()` once it is true or `wait_s` has passed; re-evaluated whenever the books move
        (an event, an op report, a planning step)."""
        deadline = time.monotonic() + wait_s
        while not (out := done()):
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            try:
                await asyncio.wait_for(self._books_moved.wait(), left)
            except TimeoutError:
                pass
        return out

    async def planning_loop(self) -> None:
        wake, failures = self._wake, RepeatedFailure("planning step")
        while True:
            due = self.planner.due_in()  # a tool-wait KV timer may come before the next tick
            try:
                await asyncio.wait_for(wake.wait(), self.tick_s if due is None else min(self.tick_s, max(due, 0.0)))
                await asyncio.sleep(self.coalesce_s)  # gather the events that arrive together
            except TimeoutError:
                pass
            wake.clear()
            try:
                self.planner.tick()
                failures.ok()
            except Exception as e:
                failures.failed(e)
            self.changed()

    async def tracking_loop(self, every_s: float, time_limit_s: float) -> None:
        """Every `every_s`: the tracking MILP's problem is built on this loop (it reads the books),
        solved in a worker thread (SCIP releases the GIL), and its target adopted back here. Failures
        are logged as `RepeatedFailure` says."""
        from ..solvers.target import solve_target

        loop = asyncio.get_running_loop()
        failures = RepeatedFailure("tracking solve")
        while True:
            try:
                got = self.planner.target_problem()
                if got is not None:
                    policy, prob = got
                    sol = await loop.run_in_executor(None, solve_target, prob, time_limit_s)
                    self.metrics.target_solved(sol.solve_s, sol.status)
                    if self.planner.adopt_target(policy, prob, sol):
                        self._wake.set()
                failures.ok()
            except Exception as e:
                failures.failed(e)
            await asyncio.sleep(every_s)

    # ---- oracle runs -----------------------------------------------------------------------------------
    def start_oracle(self, body) -> dict:
        run_id = uuid.uuid4().hex[:12]
        run = {"run_id": run_id, "status": "queued", "request": body.model_dump(exclude={"trace_jsonl"}),
               "created_s": time.time()}
        try:
            self.planner.store.put_run(run_id, "queued", run)
        except LedgerError as e:
            raise Unavailable(f"{e}; the run was not started, send it again later") from None
        job = asyncio.get_running_loop().run_in_executor(None, self._oracle_job, run, body)
        self._jobs[run_id] = job
        job.add_done_callback(lambda _: self._jobs.pop(run_id, None))
        return run

    async def wait_for_run(self, run_id: str, wait_s: float) -> None:
        """Until the oracle run `run_id` of this process ends, at most `wait_s` seconds."""
        job = self._jobs.get(run_id)
        if job is not None and wait_s > 0:
            await asyncio.wait({job}, timeout=wait_s)

    def _oracle_job(self, run: dict, body) -> None:
        """In a worker thread: the solver releases the GIL while it works."""
        from ..models.load import check_compatible, parse_trace
        from ..core.costs import CostModel
        from ..solvers.milp import oracle_summary
        from ..traces.generators import generate

        store, p = self.planner.store, self.planner
        store.put_run(run["run_id"], "running", {**run, "status": "running"})
        try:
            trace = generate(body.preset, body.seed, body.hours) if body.preset else \
                parse_trace(body.trace_jsonl, "uploaded trace")
            check_compatible(p.cluster, p.catalog, trace, "uploaded trace")
            cost = CostModel(p.cluster, p.catalog)
            lead = None
            if body.lead == "planner":
                from ..sim.lead import planner_lead

                lead = planner_lead(p.cluster, p.catalog, trace, cost)
            result = oracle_summary(p.cluster, p.catalog, trace, cost, body.window, body.overlap, body.backend,
                                    body.time_limit_s, replicas=body.replicas, guide_from=lead)
            store.put_run(run["run_id"], "done", {**run, "status": "done", "result": result, "finished_s": time.time()})
        except Exception as e:
            try:
                store.put_run(run["run_id"], "failed", {**run, "status": "failed", "error": f"{type(e).__name__}: {e}",
                                                        "finished_s": time.time()})
            except LedgerError:  # the run stays "running" in the ledger; say why here at least
                log.exception("oracle run %s failed (%s) and the ledger refused to record it", run["run_id"], e)


def create_app(planner: LivePlanner, auth: Auth, tick_s: float = 5.0, coalesce_s: float = 0.005,
               planning_loop: bool = True, docs: bool = False) -> FastAPI:
    """The service app. Without `planning_loop` the planner plans only when asked (`tick`): the
    leases' own ops still go out, which is what deterministic tests want. With `docs`, /docs
    (plain HTML, nothing from the internet) and /openapi.json, both for admin tokens (docs.py);
    without, neither exists. A body is at most 1 MiB (a trace or a cluster more: 413), and a
    refused body is never echoed back (inputs.py)."""
    metrics = ServiceMetrics()
    planner.telemetry = metrics
    if planner.queue == "auto":  # what it judged before (a restart rebuilds it from the ledger)
        planner.publish_sizes()
    svc = Service(planner, auth, metrics, tick_s, coalesce_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(svc.planning_loop())] if planning_loop else []
        if planning_loop and planner.track:
            tasks.append(asyncio.create_task(svc.tracking_loop(planner.track.replan_s, planner.track.time_limit_s)))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            try:  # what the planner learnt since the last step's save: a restart takes it up
                with planner.store.tx():
                    planner.save_learnt()
            except LedgerError as e:
                log.warning("what the planner learnt was not saved at shutdown: %s", e)

    app = FastAPI(title="StateBudget planner", version=__version__, lifespan=lifespan,
                  description="Where LLM serving state lives: events and leases in, plans and ops out (DESIGN.md §7).",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = svc
    app.add_middleware(BodyLimit)  # 413 past BODY_LIMIT, or its route's larger limit
    app.add_middleware(HttpMetrics, metrics=metrics)  # request seconds by route template and status
    for r in (events.router, calls.router, leases.router, queue.router, plan.router, inventory.router, residency.router, oracle.router,
              health.router, ui.router):
        app.include_router(r)
    if docs:
        app.include_router(api_docs.router)
    app.add_exception_handler(RequestValidationError, validation_failed)

    def handler(status: int):
        async def answer(request: Request, exc: Exception):
            svc.changed()  # a refusal may have closed an op (committed): wake whoever waits on the plan
            # cut: a message may quote a name from the request (a model, a node, a cluster's field)
            detail = excerpt(str(exc.args[0]), 500) if exc.args else type(exc).__name__
            return JSONResponse({"detail": detail}, status_code=status)
        return answer

    for exc, status in (*REFUSAL_STATUS.items(), (InputError, 422)):
        app.add_exception_handler(exc, handler(status))

    async def unavailable(request: Request, exc: Exception):
        svc.changed()  # the books were rebuilt from the ledger: the plan version may have moved back
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "ledger unwritable"}, status_code=503,
                            headers={"Retry-After": "1"})
    app.add_exception_handler(Unavailable, unavailable)
    return app


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"t": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage(), **getattr(record, "fields", {})}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "info") -> None:
    h = logging.StreamHandler()
    h.setFormatter(JsonLogFormatter())
    root = logging.getLogger("statebudget")
    root.handlers[:] = [h]
    root.setLevel(level.upper())
    root.propagate = False
