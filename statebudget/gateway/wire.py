"""What the gateway says and reads on the wire: OpenAI's error shape, the X-Next-Model header,
token counts of requests and answers, and the batch of events sent after the answers."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
from fastapi.responses import JSONResponse


class Refused(Exception):
    """A request the gateway answers itself: `status`, OpenAI's error body, optional Retry-After."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None, retry_after_s: float | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.code, self.retry_after_s, self.param = status, kind, code, retry_after_s, param

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))} if self.retry_after_s is not None else None
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}},
                            status_code=self.status, headers=headers)


def parse_next_model(value: str, default_in_s: float) -> tuple[str, float, float]:
    """`NAME[; in=SECONDS][; p=CONFIDENCE]` -> (name, in_s, confidence)."""
    name, *params = [x.strip() for x in value.split(";")]
    in_s, p = default_in_s, 1.0
    for kv in params:
        k, _, v = kv.partition("=")
        try:
            if k.strip() == "in":
                in_s = float(v)
            elif k.strip() == "p":
                p = float(v)
            else:
                raise ValueError
        except ValueError:
            raise Refused(400, f"X-Next-Model: cannot read {kv!r} (expected `NAME; in=SECONDS; p=CONFIDENCE`)",
                          "invalid_request_error", "bad_header") from None
    if not name or not (0 < in_s <= 86_400 and math.isfinite(in_s)) or not 0 <= p <= 1:
        raise Refused(400, f"X-Next-Model: {value!r} needs a name, 0 < in <= 86400 and 0 <= p <= 1",
                      "invalid_request_error", "bad_header")
    return name, in_s, p


class Held:
    """One request counted in `held[model]` (held in the gateway, not yet forwarded) until released."""

    def __init__(self, counts: dict[str, int], model: str):
        self.counts, self.model = counts, model
        counts[model] = counts.get(model, 0) + 1

    def release(self) -> None:
        if self.counts is not None:
            self.counts[self.model] -= 1
            self.counts = None


class Outbox:
    """Events sent after the answers went out, batched: while one batch is on its way to the
    planner, the events of other calls gather for the next (one request, one transaction each)."""

    def __init__(self, planner: httpx.AsyncClient, limit: int = 1000):
        self.planner, self.limit = planner, limit
        self.pending: list[tuple[list[dict], asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def send(self, evs: list[dict]) -> list[tuple[int, dict]]:
        """Each event's (status, answer), once its batch is posted."""
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((evs, fut))
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())
        return await fut

    async def _run(self) -> None:
        while self.pending:
            batch, n = [], 0
            while self.pending and n + len(self.pending[0][0]) <= self.limit:
                batch.append(self.pending.pop(0))
                n += len(batch[-1][0])
            try:
                r = await self.planner.post("/v1/events/batch", json={"events": [e for evs, _ in batch for e in evs]})
                r.raise_for_status()
                results = [(x["status"], x["body"]) for x in r.json()["results"]]
            except (httpx.HTTPError, ValueError, KeyError) as e:
                for _, fut in batch:
                    fut.set_exception(Refused(502, f"the planner: {e}", "planner_error"))
                continue
            i = 0
            for evs, fut in batch:
                fut.set_result(results[i:i + len(evs)])
                i += len(evs)


class Bounded(httpx.AsyncBaseTransport):
    """At most `n` requests at once on `inner`, from sending to the end of the answer; the rest
    wait here, in a queue that costs the same however long it grows. httpcore's own queue scans
    every connection for every request it assigns: a long one costs more CPU the longer it gets."""

    def __init__(self, inner: httpx.AsyncBaseTransport, n: int):
        self.inner, self.slots = inner, asyncio.Semaphore(n)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:  # the client's pool timeout bounds the wait for a slot, as it would httpcore's queue
            async with asyncio.timeout(request.extensions.get("timeout", {}).get("pool")):
                await self.slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(f"no free connection to {request.url.host} in time", request=request) from None
        try:
            r = await self.inner.handle_async_request(request)
        except BaseException:
            self.slots.release()
            raise
        return httpx.Response(r.status_code, headers=r.headers, stream=_Releasing(r.stream, self.slots),
                              extensions=r.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Releasing(httpx.AsyncByteStream):
    """An answer's body that gives its slot back once, when it is closed."""

    def __init__(self, inner, slots: asyncio.Semaphore):
        self.inner, self.slots = inner, slots

    async def __aiter__(self):
        async for chunk in self.inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            if self.slots is not None:
                self.slots, slots = None, self.slots
                slots.release()


def prompt_tokens(body: dict) -> int:
    """A rough token count of a request's prompt (4 characters a token)."""
    if "messages" in body:
        text = "".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text) // 4)


def usage(answer: bytes, chunks: int) -> tuple[int, int]:
    """(prompt, output) tokens from the answer's `usage` where the engine sent one, else the
    streamed chunks (one token each, less the role and the finish chunk)."""
    i = answer.rfind(b'"usage"')
    if i >= 0:
        try:
            start = answer.index(b"{", i)
            usage, _ = json.JSONDecoder().raw_decode(answer[start:].decode(errors="replace"))
            return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        except (ValueError, AttributeError):
            pass
    return 0, max(0, chunks - 3)
