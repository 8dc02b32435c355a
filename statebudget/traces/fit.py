"""Fit the generators' distributions to the real workload data in `shared/data/real/`.

Run once by `statebudget trace fit`; the result is committed as `fitted.json` so that nothing reads
the data at trace-generation time. What is real and what is assumed:

- token lengths: empirical quantiles of `ContextTokens` / `GeneratedTokens` of the Azure LLM
  inference trace 2023 (code and conversation; CC BY 4.0);
- tool latencies: log-normal fits of TraceLab's `tool_wall_latency_ms` (CC BY 4.0), grouped into
  our tool classes: `search` (WebSearch, WebFetch), `edit` (Write, write_stdin), `shell` (Bash,
  exec_command). `test` and `build` are `shell` scaled up (a test run or a build is a long shell
  command; the scale is an assumption, stated in `ASSUMED`), `approval` (a human) has no real data
  and is an assumption;
- inter-round tool waits of TraceLab's `multi_session_large.csv` as a cross-check;
- tokens a round appends to an agent's context (tool results, user turns): TraceLab's
  `newly_append_tokens` (round_trace) and `input_len` (multi_session_large), pooled.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

TOOL_CLASSES = {
    "WebSearch": "search", "WebFetch": "search",
    "Write": "edit", "write_stdin": "edit", "Edit": "edit",
    "Bash": "shell", "exec_command": "shell",
}
# Classes without real samples: (median seconds, sigma of log) — assumptions, not data.
ASSUMED = {
    "test": {"scale_of": "shell", "median_factor": 40.0, "sigma": 0.9},
    "build": {"scale_of": "shell", "median_factor": 80.0, "sigma": 0.7},
    "approval": {"median_s": 45.0, "sigma": 1.2},
}
QUANTILES = np.linspace(0.0, 1.0, 51)


def _lognormal(samples_s: list[float]) -> dict:
    logs = np.log(np.maximum(np.asarray(samples_s, dtype=float), 1e-3))
    sigma = float(logs.std(ddof=1)) if len(logs) > 1 else 1.0
    # A handful of samples spread over 3 decades gives a sigma that would draw hour-long edits;
    # clip to a plausible band and keep the sample count beside it.
    return {"median_s": float(math.exp(logs.mean())), "sigma": min(max(sigma, 0.3), 1.5), "n": len(samples_s)}


def fit_real(data_dir: Path) -> dict:
    data_dir = Path(data_dir)
    by_class: dict[str, list[float]] = {}
    with open(data_dir / "tracelab" / "round_trace.jsonl") as f:
        for line in f:
            for tool in json.loads(line).get("tools", []):
                cls = TOOL_CLASSES.get(tool["tool_name"])
                if cls and tool.get("tool_wall_latency_ms") is not None:
                    by_class.setdefault(cls, []).append(tool["tool_wall_latency_ms"] / 1000.0)
    tools = {cls: _lognormal(v) for cls, v in sorted(by_class.items())}
    shell = tools["shell"]
    for cls, a in ASSUMED.items():
        if "scale_of" in a:
            tools[cls] = {"median_s": tools[a["scale_of"]]["median_s"] * a["median_factor"],
                          "sigma": a["sigma"], "n": 0, "assumed": True}
        else:
            tools[cls] = {"median_s": a["median_s"], "sigma": a["sigma"], "n": 0, "assumed": True}
    with open(data_dir / "tracelab" / "multi_session_large.csv") as f:
        rows = list(csv.DictReader(f))
    waits = [int(r["tool_wait_after_ms"]) / 1000.0 for r in rows]
    appends = [int(r["input_len"]) for r in rows]
    with open(data_dir / "tracelab" / "round_trace.jsonl") as f:
        appends += [json.loads(line)["newly_append_tokens"] for line in f]
    tokens = {}
    for name in ("code", "conv"):
        ctx, out = [], []
        with open(data_dir / "azure-llm-2023" / f"AzureLLMInferenceTrace_{name}.csv") as f:
            for r in csv.DictReader(f):
                ctx.append(int(r["ContextTokens"]))
                out.append(int(r["GeneratedTokens"]))
        tokens[name] = {
            "context_quantiles": np.quantile(ctx, QUANTILES).round(1).tolist(),
            "output_quantiles": np.quantile(out, QUANTILES).round(1).tolist(),
            "n": len(ctx),
        }
    return {
        "source": "shared/data/real (Azure LLM inference trace 2023, TraceLab); see statebudget/traces/fit.py",
        "tools": tools,
        "tracelab_round_wait_s_quantiles": np.quantile(waits, QUANTILES).round(3).tolist(),
        "append_tokens_quantiles": np.quantile(appends, QUANTILES).round(1).tolist(),
        "tokens": tokens,
        "shell_median_s": shell["median_s"],
    }


FITTED_PATH = Path(__file__).with_name("fitted.json")


def load_fitted() -> dict:
    return json.loads(FITTED_PATH.read_text())
