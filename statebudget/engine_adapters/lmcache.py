"""LMCache adapter: per-program KV moves through the LMCache controller's HTTP API.

Source followed: LMCache `lmcache/v1/api_server/__main__.py` (the controller's FastAPI app,
`python -m lmcache.v1.api_server --port 9000 --monitor-port 9001`, commit 958d8ce) and
`lmcache/v1/cache_controller/executor.py`, plus docs.lmcache.ai/kv_cache_management/. Requests:

    POST /lookup        {tokens}                        -> {event_id, layout_info: {instance: [location, n_tokens]}}
    POST /move          {old_position: [instance, location], new_position: [...], tokens, copy}
                                                        -> {event_id, num_tokens}
    POST /check_finish  {event_id}                      -> {status}
    POST /clear         {instance_id, location}         -> {event_id, num_tokens}
    POST /pin           {instance_id, location, tokens} -> {event_id, num_tokens}
    POST /health        {instance_id}                   -> {event_id, error_codes: {worker: code}}
                                                           (other versions: {event_id, error_code})

Every failure is HTTP 500 with FastAPI's `{"detail": "..."}`.

A KV object `["kv", program, model]` is known to LMCache by its token ids (`tokens_of(program,
model)`) and the LMCache instance serving the model (`instance_of[model]`). Tiers map to LMCache
storage locations (`locations`, by tier kind): host -> LocalCPUBackend, nvme -> LocalDiskBackend.
LMCache has no location for the engine's own paged GPU KV: the connector stores a program's KV
into LMCache after its prefill and loads it back on the program's next call. So, unless a "gpu"
location is configured, a KV op whose GPU end has no location uses where LMCache holds the KV
(found with /lookup) as its source, and the host location as its target (staged there, the next
call loads it from host; with `pin_leased`, a live lease pins it so eviction cannot undo the
promote).

    promote / demote    /move source -> target location (with `wait_for_finish`, then
                        /check_finish until "completed"), then /lookup until it places the KV
                        at the target (the verify step, `verify`: LMCache has no checksum; a
                        /lookup that refutes the move fails it)
    op with a lease_id  then /pin at the target location, if `pin_leased` (off by default: the
                        controller has no route to unpin, so pins would pile up and stop eviction)
    drop                /clear of the source location: the API takes no tokens, so this empties
                        every KV the instance holds there, not only this program's

What the LMCache side must provide (not checked here, no LMCache in CI):
- /move is a push between instances: the controller sends the chunks to the destination
  instance's P2P ("distributed") URL, so the instances need LMCache's P2P transfer configured,
  also for a move between two locations of one instance (an intra-instance move through the
  controller is not verified against a real LMCache);
- /lookup hashes the token ids the controller's way (default chunking; the LMCache docs run the
  controller and the engines with the same PYTHONHASHSEED, e.g. 123): else it finds nothing and
  every verify step fails;
- /check_finish raises NotImplementedError in the source followed, hence `wait_for_finish` off.

Why /move (copy=False) and not copy-then-release: /clear takes no tokens (it empties a whole
location of an instance), so a per-program source can only be released by the move itself. A
move the planner refuses (409) is undone by moving the KV back (`abort`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx

from ..models.plan import Op
from .base import Adapter, OpResult, tier_kind
from .http import EngineError, PollTimeout, check, op_result, poll_until, wait_budget_s

log = logging.getLogger("statebudget.adapter.lmcache")

FINISHED = {"completed", "finished", "done", "success"}  # /check_finish statuses that end a wait
FAILED = {"failed", "error", "aborted"}


# ---- the adapter --------------------------------------------------------------------------------------

class LMCacheAdapter(Adapter):
    """KV ops (`["kv", program, model]`) through the LMCache controller."""
    kind = "lmcache"

    def __init__(self, planner: str, node: str, token: str, controller: str,
                 tokens_of: Callable[[str, str], list[int]], instance_of: dict[str, str],
                 locations: dict[str, str] | None = None, client: httpx.Client | None = None,
                 engine_client: httpx.Client | None = None, timeout_s: float = 120.0,
                 poll_interval_s: float = 0.05, wait_for_finish: bool = False, verify_s: float = 5.0,
                 pin_leased: bool = False):
        """`wait_for_finish=True` polls /check_finish after a move: off by default, because in the
        LMCache source followed /move already answers after every worker moved its chunks, and the
        executor's `check_finish` still raises NotImplementedError (the endpoint answers 500).
        `verify_s`: how long a move's verify step (`verify`) waits for /lookup to show the KV at its
        target. `pin_leased`: /pin the KV a leased op moved (there is no unpin route)."""
        super().__init__(planner, node, token, client)
        self.engine = engine_client or httpx.Client(base_url=controller.rstrip("/"),
                                                    timeout=httpx.Timeout(10.0, read=timeout_s))
        self.tokens_of, self.instance_of = tokens_of, dict(instance_of)
        self.locations = {"host": "LocalCPUBackend", "nvme": "LocalDiskBackend", **(locations or {})}
        self.timeout_s, self.poll_interval_s, self.wait_for_finish = timeout_s, poll_interval_s, wait_for_finish
        self.verify_s = verify_s  # the longest a move's verify step waits for /lookup to show it
        self.pin_leased = pin_leased
        # op id -> (instance, tokens, from location, to location) of a done move, until commit/abort
        self.moved: dict[str, tuple[str, list[int], str, str]] = {}

    # ---- HTTP ------------------------------------------------------------------------------------------
    def _post(self, path: str, body: dict) -> dict:
        return check(self.engine.post(path, json=body)).json()

    def where(self, instance: str, tokens: list[int]) -> str:
        """The location LMCache holds these tokens' KV at on `instance` (/lookup)."""
        layout = self._layout(tokens)
        if instance not in layout:
            raise EngineError(f"LMCache holds no KV of these {len(tokens)} tokens on instance {instance!r}")
        return layout[instance][0]

    def move(self, instance: str, tokens: list[int], src: str, dst: str, op: Op) -> None:
        """/move the tokens' KV from one location to another, wait until it finished, and verify
        it (`verify`) before the op may be reported done."""
        answer = self._post("/move", {"old_position": [instance, src], "new_position": [instance, dst],
                                      "tokens": tokens, "copy": False})
        event_id, moved = answer["event_id"], int(answer.get("num_tokens", len(tokens)))
        what = f"move {event_id} ({src} -> {dst})"
        if moved <= 0:
            # nothing found at the source: done only if an earlier run of this op already moved it
            if not self._holds(self._layout(tokens).get(instance), dst, 1):
                raise EngineError(f"LMCache {what} moved none of {len(tokens)} tokens")
            return
        if self.wait_for_finish:
            poll_until(lambda: self._finished(event_id), wait_budget_s(op, self.timeout_s), self.poll_interval_s,
                       f"LMCache {what}")
        self.verify(instance, tokens, dst, moved, op, what)

    def _layout(self, tokens: list[int]) -> dict:
        """/lookup's `layout_info`: instance -> [location, matched tokens]; an answer of another
        shape is the engine's error, not a crash."""
        answer = self._post("/lookup", {"tokens": tokens})
        layout = answer.get("layout_info") if isinstance(answer, dict) else None
        if not isinstance(layout, dict) or not all(isinstance(v, (list, tuple)) and len(v) >= 2
                                                   and isinstance(v[1], (int, float)) for v in layout.values()):
            raise EngineError(f"LMCache /lookup answered {str(answer)[:200]!r}: expected "
                              f"{{layout_info: {{instance: [location, tokens]}}}}")
        return layout

    @staticmethod
    def _holds(where: list | None, location: str, tokens: int) -> bool:
        """An instance's /lookup entry places at least `tokens` tokens at `location`."""
        return where is not None and where[0] == location and int(where[1]) >= tokens

    def verify(self, instance: str, tokens: list[int], dst: str, moved: int, op: Op, what: str) -> None:
        """The verify step of allocate -> copy -> verify -> publish (seed 003 §26). LMCache keeps
        no checksum; its controller's /lookup names, per instance, a location and how many tokens
        of the prefix it matched there. So /lookup is polled (for up to `verify_s`, within the op's
        budget: a worker's report reaches the controller after /move answers) until it places at
        least the `moved` tokens at `dst` on `instance`. If it never does:

          it shows the instance elsewhere, or fewer tokens   the move is refuted: fail
          no instance holds the prefix at all                 the KV is lost: fail
          other instances hold it, this one is not named      not refuted, taken as done: the
              controller names one holder per chunk, so a prefix that another instance
              stored first hides this one (logged)

        What it cannot see: the controller reports the location of the last matched chunk
        only, so earlier chunks are taken on the worker's word (`num_tokens`)."""
        layout: dict = {}

        def placed() -> bool:
            nonlocal layout
            layout = self._layout(tokens)
            return self._holds(layout.get(instance), dst, moved)

        try:
            poll_until(placed, min(self.verify_s, wait_budget_s(op, self.timeout_s)), self.poll_interval_s,
                       f"LMCache {what} to show at {dst}")
        except PollTimeout:
            where = layout.get(instance)
            if where is not None:
                raise EngineError(f"LMCache {what} not verified: /lookup shows {where[1]} tokens at {where[0]} on "
                                  f"{instance!r}, not {moved} tokens at {dst}") from None
            if not layout:
                raise EngineError(f"LMCache {what} not verified: /lookup shows no instance holding the "
                                  f"{len(tokens)} tokens") from None
            log.warning("LMCache %s: /lookup names %s, not %r, for this prefix; taken as done", what,
                        sorted(layout), instance)

    def _finished(self, event_id: str) -> bool:
        status = str(self._post("/check_finish", {"event_id": event_id})["status"]).lower()
        if status in FAILED:
            raise EngineError(f"LMCache event {event_id} {status}")
        return status in FINISHED

    def pin(self, instance: str, tokens: list[int], location: str) -> None:
        self._post("/pin", {"instance_id": instance, "location": location, "tokens": tokens})

    # ---- ops -------------------------------------------------------------------------------------------
    def _location(self, tier: str) -> str | None:
        return self.locations.get(tier_kind(tier))

    def execute(self, op: Op) -> OpResult:
        t0 = time.perf_counter()
        if op.object[0] != "kv":
            return op_result(op, t0, f"LMCache carries KV only, not {op.object[0]!r} objects ({op.object})")
        try:
            program, model = op.object[1], op.object[2]
            if model not in self.instance_of:
                raise EngineError(f"no LMCache instance configured for model {model!r}")
            instance, tokens = self.instance_of[model], list(self.tokens_of(program, model))
            src = self._location(op.src) or self.where(instance, tokens)
            if op.kind == "drop" or op.dst == "none":
                # /clear empties the whole location of the instance (the API takes no tokens)
                self._post("/clear", {"instance_id": instance, "location": src})
                return op_result(op, t0)
            dst = self._location(op.dst) or self.locations["host"]
            if src != dst:
                self.move(instance, tokens, src, dst, op)
                self.moved[op.op_id] = (instance, tokens, src, dst)
            if op.lease_id and self.pin_leased:
                self.pin(instance, tokens, dst)
            return op_result(op, t0)
        except (EngineError, httpx.HTTPError) as e:
            return op_result(op, t0, str(e) or type(e).__name__)

    def commit(self, op: Op) -> None:
        self.moved.pop(op.op_id, None)

    def abort(self, op: Op) -> None:
        """Undo a refused move: move the KV back where it came from."""
        moved = self.moved.pop(op.op_id, None)
        if moved is None:
            return
        instance, tokens, src, dst = moved
        try:
            self.move(instance, tokens, dst, src, op.model_copy(update={"deadline": None}))
        except (EngineError, httpx.HTTPError) as e:
            log.error("could not undo op %s (%s -> %s): %s", op.op_id, src, dst, e)

    def health(self) -> dict:
        instances = {}
        for instance in sorted(set(self.instance_of.values())):
            try:
                body = self._post("/health", {"instance_id": instance})
                codes = None
                if isinstance(body, dict):  # {error_codes: {worker: code}}, or in other versions {error_code}
                    codes = body["error_codes"] if "error_codes" in body else \
                        {"all": body["error_code"]} if "error_code" in body else None
                if not isinstance(codes, dict) or not codes:
                    raise EngineError(f"/health answered {str(body)[:200]}: no error_codes or error_code")
                instances[instance] = {"ok": all(int(c) == 0 for c in codes.values()), "error_codes": codes}
            except (EngineError, httpx.HTTPError, ValueError, TypeError) as e:
                instances[instance] = {"ok": False, "error": str(e)}
        return {"kind": self.kind, "ok": all(v["ok"] for v in instances.values()), "instances": instances}
