"""`statebudget gateway` and `statebudget fake-engine`."""

from __future__ import annotations

import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..models.errors import InputError
from .common import TokenFileOpt, TokenOpt, check_planner, err, escape, fail, guard, resolve_token


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_tokens(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        node, sep, path = p.partition("=")
        if not sep or not node or not path:
            raise InputError("--adapter-token-file", p, "expected NODE=FILE (an adapter token of that node)")
        out[node] = resolve_token(None, Path(path), f"an adapter token for node {node}")
    return out


def _warn_if_no_planner(url: str) -> None:
    """The gateway starts without its planner (one may start later: requests get a 502 until it
    answers), but says so; a URL no request could ever use (no http://) fails here."""
    import httpx

    try:
        check_planner(url, 0.0)
    except (httpx.ConnectError, httpx.TimeoutException) as e:
        why = f"cannot reach the planner at {url} ({e or type(e).__name__})"
    except InputError as e:
        why = str(e)
    else:
        return
    err.print(f"[yellow]warning:[/] {escape(why)}; requests get a 502 until a planner answers there", highlight=False)


def engine_file(cfg, node: str):
    """The adapter's engine file for the config's engines on `node`."""
    from ..engine_adapters.http import EngineFile

    mine = [e for e in cfg.engines if e.node == node]
    key = {id(e): f"{e.model}@{e.gpu_tier}" for e in mine}
    return EngineFile(endpoints={key[id(e)]: e.base_url() for e in mine},
                      commands={key[id(e)]: e.cmd for e in mine if e.cmd},
                      env={key[id(e)]: e.env for e in mine if e.cmd and e.env}, log_dir="statebudget-engine-logs")


@guard
def gateway(
    planner: Annotated[str, typer.Option(help="planner URL, e.g. http://127.0.0.1:8700")],
    config: Annotated[Optional[Path], typer.Option(help="gateway YAML: engines [{model, url | cmd, node, gpus}], "
                                                        "timeout_s, queue_limit, …")] = None,
    from_llama_swap: Annotated[Optional[Path], typer.Option(help="read a llama-swap config.yaml instead")] = None,
    token: TokenOpt = None,
    token_file: TokenFileOpt = None,
    adapter_token_file: Annotated[list[str], typer.Option(
        help="NODE=FILE: run NODE's engine adapter in this process with that adapter token (it starts the "
             "engines that have a cmd, sleeps and wakes them); repeatable")] = [],
    adapter: Annotated[bool, typer.Option(help="with --adapter-token-file: run the adapter (else only report the "
                                               "engines found awake at start)")] = True,
    engine_kind: Annotated[str, typer.Option(help="vllm | sglang: the engines' sleep API")] = "vllm",
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8080,
    node: Annotated[str, typer.Option(help="--from-llama-swap: the node its models run on")] = "n0",
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
):
    """An OpenAI-compatible front door (docs/gateway.md): agents point their base URL here; each
    request is announced to the planner, held until its model is ready, and streamed back. The
    runtime token comes from --token-file, STATEBUDGET_TOKEN or STATEBUDGET_TOKEN_FILE."""
    import uvicorn

    from ..api.app import setup_logging
    from ..gateway.app import make_app
    from ..gateway.config import load_config

    setup_logging(log_level)
    if (config is None) == (from_llama_swap is None):
        fail("give --config FILE or --from-llama-swap FILE (one of them)")
    if from_llama_swap is not None:
        from ..gateway.llamaswap import convert_llama_swap, notes, read_llama_swap

        raw = read_llama_swap(from_llama_swap)
        cfg = convert_llama_swap(raw, str(from_llama_swap), node=node)
        for line in notes(raw):
            err.print(f"llama-swap: {line}", highlight=False)
    else:
        cfg = load_config(config)
    for e in cfg.engines:
        if e.cmd and e.url is None and e.port is None:
            e.port = _free_port()
    runtime = resolve_token(token, token_file, "a runtime token")
    nodes = _node_tokens(adapter_token_file)
    unknown = sorted(set(nodes) - {e.node for e in cfg.engines})
    if unknown:
        fail(f"--adapter-token-file for node(s) {', '.join(unknown)}, where no engine of the config runs")
    _warn_if_no_planner(planner)
    threads = []
    if adapter:
        from ..engine_adapters import adapter_class

        for n, tok in nodes.items():
            ef = engine_file(cfg, n)
            sup = ef.supervisor()
            a = adapter_class(engine_kind)(planner, n, tok, ef.endpoint_map(), supervisor=sup,
                                           **({"model_paths": {}} if engine_kind == "sglang" else {}))
            t = threading.Thread(target=a.run, kwargs={"wait_s": 10.0}, name=f"adapter-{n}", daemon=True)
            threads.append((t, sup))
        nodes = {}  # the adapters announce what is awake themselves
    for t, _ in threads:
        t.start()
    err.print(f"gateway on http://{host}:{port}/v1 for {', '.join(cfg.models())}; planner {planner}"
              + (f"; {len(threads)} adapter(s) in process" if threads else ""))
    # uvicorn raises the SIGTERM it caught again once it has shut down: as SystemExit here, so
    # that the engines this process started are stopped with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(make_app(cfg, planner, runtime, nodes), host=host, port=port, log_level="warning",
                    access_log=False)
    finally:
        for _, sup in threads:
            if sup is not None:
                sup.close()


def fake_engine(
    model: Annotated[str, typer.Option(help="the model name it answers to")],
    port: Annotated[int, typer.Option()],
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    tokens_per_s: Annotated[float, typer.Option(help="0: as fast as it can")] = 0.0,
    ttft_s: Annotated[float, typer.Option()] = 0.0,
    answer_tokens: Annotated[int, typer.Option()] = 16,
    wake_s: Annotated[float, typer.Option(help="how long /wake_up takes")] = 0.0,
    sleep_s: Annotated[float, typer.Option(help="how long /sleep takes")] = 0.0,
    asleep: Annotated[bool, typer.Option(help="start asleep")] = False,
):
    """A fake OpenAI engine with vLLM's sleep-mode routes, for tests and the demo."""
    from ..gateway.fake_engine import main

    argv = ["--model", model, "--port", str(port), "--host", host, "--tokens-per-s", str(tokens_per_s),
            "--ttft-s", str(ttft_s), "--answer-tokens", str(answer_tokens), "--wake-s", str(wake_s),
            "--sleep-s", str(sleep_s)] + (["--asleep"] if asleep else [])
    main(argv)
