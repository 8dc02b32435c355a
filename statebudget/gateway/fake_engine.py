"""A fake OpenAI engine: one model, tokens at a set rate, and vLLM's sleep-mode routes.

For tests and the demo: the gateway, the supervisor and the vLLM adapter drive it as they would
drive `vllm serve --enable-sleep-mode` (routes as in `engine_adapters/vllm.py`), on a laptop.

    python -m statebudget.gateway.fake_engine --model coder --port 8001 --tokens-per-s 200

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (`stream: true` gives server-sent
events, one chunk per token, then `data: [DONE]`), `GET /v1/models`, `GET /health`,
`POST /sleep?level=1|2`, `POST /wake_up`, `GET /is_sleeping`, `POST /collective_rpc`, and
`GET /stats` (requests served, sleeps, wakes: what a test checks). The answer is `n` tokens,
`"<model>:<i> "` for i in 0..n-1, n = min(max_tokens, --answer-tokens): a client can tell that it
got the whole answer, in order, from the right model. Asleep, completions answer 503.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .wire import prompt_tokens


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def make_app(model: str, tokens_per_s: float = 0.0, ttft_s: float = 0.0, answer_tokens: int = 16,
             wake_s: float = 0.0, sleep_s: float = 0.0, asleep: bool = False) -> FastAPI:
    """`tokens_per_s` 0: tokens as fast as they can be written. `wake_s`, `sleep_s`: how long a
    wake or a sleep takes (a real one moves weights)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    state = {"asleep": asleep, "requests": 0, "sleeps": 0, "wakes": 0, "in_flight": 0, "started_s": time.time()}
    gap = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0

    async def complete(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        if body.get("model") not in (model, None):
            return error(404, f"the model `{body.get('model')}` does not exist", "NotFoundError")
        if state["asleep"]:
            return error(503, "the engine is asleep", "ServiceUnavailableError")
        state["requests"] += 1
        n = max(0, min(int(body.get("max_tokens") or body.get("max_completion_tokens") or answer_tokens), answer_tokens))
        pieces = [f"{model}:{i} " for i in range(n)]
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        created = int(time.time())
        usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": n,
                 "total_tokens": prompt_tokens(body) + n}
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str, finish, delta: bool):
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            if delta:
                return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}

        if not body.get("stream"):
            state["in_flight"] += 1
            try:
                await asyncio.sleep(ttft_s + gap * n)
            finally:
                state["in_flight"] -= 1
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model,
                                 "choices": [choice("".join(pieces), "length" if n == answer_tokens else "stop", False)],
                                 "usage": usage})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        async def events():
            state["in_flight"] += 1
            try:
                if ttft_s:
                    await asyncio.sleep(ttft_s)
                if chat:
                    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [first]})
                for i, p in enumerate(pieces):
                    if gap and i:
                        await asyncio.sleep(gap)
                    yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                                "choices": [choice(p, None, True)]})
                yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                            "choices": [choice("", "length" if n == answer_tokens else "stop", True)]})
                if include_usage:
                    yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model, "choices": [],
                                "usage": usage})
                yield b"data: [DONE]\n\n"
            finally:
                state["in_flight"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": int(state["started_s"]),
                                            "owned_by": "statebudget-fake"}]}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.post("/sleep")
    async def sleep(level: int = 1):
        if level not in (1, 2):
            return error(400, f"sleep level must be 1 or 2, not {level}")
        await asyncio.sleep(sleep_s)
        state["asleep"], state["sleeps"] = True, state["sleeps"] + 1
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up():
        await asyncio.sleep(wake_s)
        state["asleep"], state["wakes"] = False, state["wakes"] + 1
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": state["asleep"]}

    @app.post("/collective_rpc")
    async def collective_rpc():
        return {"results": [None]}

    @app.get("/stats")
    async def stats():
        return {"model": model, **state}

    return app


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def main(argv: list[str] | None = None) -> None:
    import uvicorn
    ap = argparse.ArgumentParser(prog="python -m statebudget.gateway.fake_engine", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-s", type=float, default=0.0)
    ap.add_argument("--ttft-s", type=float, default=0.0)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--wake-s", type=float, default=0.0)
    ap.add_argument("--sleep-s", type=float, default=0.0)
    ap.add_argument("--asleep", action="store_true", help="start asleep (as an engine the planner has not woken)")
    a = ap.parse_args(argv)
    app = make_app(a.model, a.tokens_per_s, a.ttft_s, a.answer_tokens, a.wake_s, a.sleep_s, a.asleep)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
