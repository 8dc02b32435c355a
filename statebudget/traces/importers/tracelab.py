"""TraceLab coding-agent sessions (uw-syfi/TraceLab): one program per session, one call per round.

- `round_trace.jsonl` (a `.jsonl` file): one round a line, `session_id`, `round_index`, `model`,
  `input_tokens_total` (else `prefix_tokens + newly_append_tokens`) -> context, `output_tokens`
  -> output; each of `tools[]` a tool node of `tool_wall_latency_ms` after the call (the tools
  of a round run in parallel, the next round waits for all), named by `fit.TOOL_CLASSES`
  (search, edit, shell) or else by the tool's own name; where the next round opens with a user
  message, the gap from this round's last event to it is a `user` wait. The sessions' real
  starts are months apart: every session starts at 0.
- `multi_session_large.csv` (a `.csv` file, TraceLab's replay schema): `session_id` (or `id`),
  `arrival_time` (ms, synthetic), `round_idx`, `prefix_len + input_len` -> context,
  `output_len` -> output, `tool_wait_after_ms` -> a `wait` after the round.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from ...models.errors import InputError
from ..fit import TOOL_CLASSES
from .common import WAIT_TOOL, BadRows, Session, Turn, csv_rows, json_rows, number, open_input


def _ts(text) -> float:
    if not isinstance(text, str):
        raise ValueError(f"timestamp {text!r} is not text")
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"timestamp {text!r} is not ISO 8601") from None


def _session_class(sid: str, fallback: str) -> str:
    return sid.split(":", 1)[0] if ":" in sid else fallback


def _round(obj: dict) -> dict:
    sid = obj.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("no session_id")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("no model")
    idx = number(obj, "round_index", integer=True)
    ctx = number(obj, "input_tokens_total", integer=True, required=False)
    if ctx is None:
        pre = number(obj, "prefix_tokens", integer=True, required=False)
        app = number(obj, "newly_append_tokens", integer=True, required=False)
        if pre is None or app is None:
            raise ValueError("no input_tokens_total (nor prefix_tokens and newly_append_tokens)")
        ctx = pre + app
    out = number(obj, "output_tokens", integer=True)
    tools, ends = [], []
    for k, tool in enumerate(obj.get("tools") or []):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{k}] is not an object")
        ms = number(tool, "tool_wall_latency_ms", required=False)
        if ms is None:
            if not (tool.get("emitted_at") and tool.get("result_at")):
                raise ValueError(f"tools[{k}] has no tool_wall_latency_ms and no emitted_at/result_at")
            ms = max(0.0, (_ts(tool["result_at"]) - _ts(tool["emitted_at"])) * 1000)
        if tool.get("result_at"):
            ends.append(_ts(tool["result_at"]))
        name = str(tool.get("tool_name") or "tool")
        tools.append((TOOL_CLASSES.get(name, name), ms / 1000.0))
    events = [e for e in obj.get("timing_events") or [] if isinstance(e, dict) and e.get("timestamp")]
    first = events[0] if events else None
    return {"sid": sid, "idx": idx, "model": model, "ctx": ctx, "out": out, "tools": tools,
            "opens_with_user": bool(first and first.get("event_type") == "user_message"),
            "first_ts": _ts(first["timestamp"]) if first else None,
            "end_ts": max([_ts(e["timestamp"]) for e in events] + ends) if events else None}


def _read_rounds(path: Path, bad: BadRows) -> list[Session]:
    by_sid: dict[str, dict[int, dict]] = {}
    for lineno, obj in json_rows(path, bad):
        try:
            r = _round(obj)
        except ValueError as e:
            bad(str(path), lineno, str(e))
            continue
        rounds = by_sid.setdefault(r["sid"], {})
        if r["idx"] in rounds:
            bad(str(path), lineno, f"round {r['idx']} of session {r['sid']} already on line {rounds[r['idx']]['line']}")
            continue
        r["line"] = lineno
        rounds[r["idx"]] = r
    sessions = []
    for sid, rounds in by_sid.items():
        rs = [rounds[i] for i in sorted(rounds)]
        turns = []
        for r, nxt in zip(rs, rs[1:] + [None]):
            user = 0.0
            if nxt and nxt["opens_with_user"] and r["end_ts"] is not None:
                user = max(0.0, nxt["first_ts"] - r["end_ts"])
            turns.append(Turn(keys=(r["model"], _session_class(sid, path.stem), path.stem), context=r["ctx"],
                              output=r["out"], tools=r["tools"], user_s=user))
        sessions.append(Session(pid=f"{path.stem}-{sid}", start_s=0.0, turns=turns))
    return sessions


def _read_csv(path: Path, bad: BadRows) -> list[Session]:
    by_sid: dict[str, dict[int, tuple]] = {}
    arrival: dict[str, float] = {}
    sid_col = None
    for lineno, r in csv_rows(path, bad, ("round_idx", "prefix_len", "input_len", "output_len"),
                              ("session_id", "arrival_time", "tool_wait_after_ms")):
        if sid_col is None:
            sid_col = "session_id" if "session_id" in r else "id" if "id" in r else None
            if sid_col is None:
                raise InputError(str(path), "1", "header lacks session_id (or id)")
        try:
            sid = r[sid_col]
            if not sid:
                raise ValueError(f"no {sid_col}")
            idx = number(r, "round_idx", integer=True)
            ctx = number(r, "prefix_len", integer=True) + number(r, "input_len", integer=True)
            out = number(r, "output_len", integer=True)
            wait = number(r, "tool_wait_after_ms", required=False) or 0.0
            arr = number(r, "arrival_time", required=False) or 0.0
        except ValueError as e:
            bad(str(path), lineno, str(e))
            continue
        rounds = by_sid.setdefault(sid, {})
        if idx in rounds:
            bad(str(path), lineno, f"round {idx} of session {sid} already on line {rounds[idx][0]}")
            continue
        rounds[idx] = (lineno, ctx, out, wait)
        arrival[sid] = min(arrival.get(sid, arr), arr)
    sessions = []
    for sid, rounds in by_sid.items():
        turns = [Turn(keys=(_session_class(sid, path.stem), path.stem), context=ctx, output=out,
                      tools=[(WAIT_TOOL, wait / 1000.0)])
                 for _, ctx, out, wait in (rounds[i] for i in sorted(rounds))]
        sessions.append(Session(pid=f"{path.stem}-s{sid}", start_s=arrival[sid] / 1000.0, turns=turns))
    return sessions


def read_tracelab(paths: list[Path], bad: BadRows) -> list[Session]:
    out: list[Session] = []
    for path in map(open_input, paths):
        if path.suffix == ".jsonl":
            out += _read_rounds(path, bad)
        elif path.suffix == ".csv":
            out += _read_csv(path, bad)
        else:
            raise InputError(str(path), "", "TraceLab input is round_trace.jsonl (.jsonl) or a session CSV like "
                             "multi_session_large.csv (.csv); the raw claude/codex dumps are not read")
    return out
