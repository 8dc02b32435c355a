"""Azure LLM inference traces (Azure/AzurePublicDataset `AzureLLMInferenceTrace_{code,conv}.csv`,
the Splitwise trace): `TIMESTAMP, ContextTokens, GeneratedTokens`, one request a row, no
sessions. Each request becomes a one-call program arriving at its timestamp's offset from the
earliest timestamp of all the files imported together (the two files cover the same hour)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from ...models.errors import InputError
from .common import BadRows, Session, Turn, csv_rows, number, open_input

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PREFIX = "AzureLLMInferenceTrace_"


def file_class(path: Path) -> str:
    """`code` or `conv` for the dataset's files, else the file's stem."""
    return path.stem.removeprefix(PREFIX) or path.stem


def _when(text: str) -> datetime:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"TIMESTAMP {text!r} is not a date and time (like 2023-11-16 18:17:03.9799600)") from None
    return t.replace(tzinfo=None) if t.tzinfo is None else t.astimezone(timezone.utc).replace(tzinfo=None)


def read_azure(paths: list[Path], bad: BadRows) -> list[Session]:
    rows: list[tuple[str, int, datetime, int, int]] = []
    seen: dict[str, Path] = {}
    for path in map(open_input, paths):
        cls = file_class(path)
        if cls in seen:
            raise InputError(str(path), "", f"same class {cls!r} as {seen[cls]}: program ids would repeat")
        seen[cls] = path
        n = 0
        for lineno, r in csv_rows(path, bad, COLUMNS):
            try:
                when = _when(r["TIMESTAMP"])
                ctx = number(r, "ContextTokens", integer=True)
                out = number(r, "GeneratedTokens", integer=True)
            except ValueError as e:
                bad(str(path), lineno, str(e))
                continue
            n += 1
            rows.append((cls, n, when, ctx, out))
    if not rows:
        return []
    t0 = min(r[2] for r in rows)
    return [Session(pid=f"{cls}-{n:06d}", start_s=(when - t0).total_seconds(),
                    turns=[Turn(keys=(cls,), context=ctx, output=out)])
            for cls, n, when, ctx, out in rows]
