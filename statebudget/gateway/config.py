"""The gateway's configuration (DESIGN.md §7b): which engine servers serve which model.

    engines:
      - {model: coder, url: "http://127.0.0.1:8001", node: n0, gpus: [0]}
      - {model: reviewer, cmd: "vllm serve Qwen/Qwen3-8B --port ${PORT} --enable-sleep-mode",
         env: {VLLM_SERVER_DEV_MODE: "1"}, node: n0, gpus: [1]}

An engine with a `cmd` is started by the supervisor with `${PORT}` replaced by its port (as
llama-swap's `cmd`); its `url` then defaults to `http://127.0.0.1:${PORT}`. `gateway
--from-llama-swap` builds the same object from a llama-swap file (`llamaswap.py`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..models.errors import InputError, pydantic_where


class EngineSpec(BaseModel):
    """One engine server of one model on one GPU group of one node."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: str = Field(min_length=1, max_length=200, description="the name clients send in `model`")
    url: str | None = Field(None, description="base URL of the server (without /v1)")
    node: str = "n0"
    gpus: list[int] = Field(default_factory=lambda: [0])
    cmd: str | None = Field(None, description="command that starts the server; ${PORT} is replaced")
    port: int | None = Field(None, ge=1, le=65535)
    env: dict[str, str] = Field(default_factory=dict)
    aliases: list[str] = Field(default_factory=list)
    upstream_model: str | None = Field(None, description="the name the server knows the model by (default: model)")
    max_inflight: int = Field(64, ge=1, description="requests forwarded at once; more wait in the gateway")
    check_path: str = "/health"
    ttl_s: float | None = Field(None, ge=0, description="llama-swap's ttl, kept for reference: the planner decides")

    @model_validator(mode="after")
    def _where(self):
        if self.url is None and self.cmd is None:
            raise ValueError(f"engine of {self.model!r}: give its `url`, or a `cmd` that starts it")
        if self.url is None:
            if self.port is None and "${PORT}" not in self.cmd:
                raise ValueError(f"engine of {self.model!r}: its `cmd` has no ${{PORT}} and no `port` is given, "
                                 "so its address is unknown")
        return self

    @property
    def gpu_tier(self) -> str:
        return "gpu:" + ",".join(str(g) for g in sorted(self.gpus))

    def base_url(self) -> str:
        """Its address; a `cmd` engine without a `url` must have been given its port."""
        if self.url is not None:
            return self.url.rstrip("/").replace("${PORT}", str(self.port or ""))
        if self.port is None:
            raise RuntimeError(f"engine of {self.model!r} has no port yet")
        return f"http://127.0.0.1:{self.port}"


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    engines: list[EngineSpec] = Field(min_length=1)
    timeout_s: float = Field(60.0, gt=0, description="how long a request may be held while its state is prepared")
    queue_limit: int = Field(256, ge=0, description="requests held per model beyond which new ones get 503")
    program_idle_s: float = Field(600.0, gt=0, description="a program with no request for this long is finished")
    hint_in_s: float = Field(5.0, gt=0, description="the lease deadline of an X-Next-Model without `in=`")
    planner_connections: int = Field(4, ge=1, le=64, description="connections for the requests to the planner "
                                     "that do not wait (more for a planner far away; waits have their own)")

    @model_validator(mode="after")
    def _names(self):
        seen: dict[str, str] = {}
        for e in self.engines:
            for name in [e.model, *e.aliases]:
                if name in seen and seen[name] != e.model:
                    raise ValueError(f"name {name!r} is both model {seen[name]!r} and model {e.model!r}")
                seen[name] = e.model
        return self

    def models(self) -> list[str]:
        return sorted({e.model for e in self.engines})

    def resolve(self, name: str) -> str | None:
        """The model a client's name (or alias) means; None if the config has none."""
        for e in self.engines:
            if name == e.model or name in e.aliases:
                return e.model
        return None


def load_config(path: str | Path) -> GatewayConfig:
    """Read a gateway YAML/JSON file; a bad one is an InputError that says where."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise InputError(str(path), "", f"cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise InputError(str(path), "", f"not YAML: {e}") from None
    return parse_config(raw, str(path))


def parse_config(raw, where: str = "config") -> GatewayConfig:
    if not isinstance(raw, dict):
        raise InputError(where, "", f"expected a mapping with `engines`, got {type(raw).__name__}")
    try:
        return GatewayConfig(**raw)
    except ValidationError as e:
        loc, what = pydantic_where(e)
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise InputError(where, loc, what + more) from None
