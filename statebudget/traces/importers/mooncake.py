"""Mooncake traces (kvcache-ai/Mooncake `FAST25-release/traces/*.jsonl`, `mooncake_trace.jsonl`):
one JSON object a line, `timestamp` (ms since the first request), `input_length`,
`output_length`, `hash_ids` (remapped ids of the prompt's 512-token blocks; equal leading ids,
a shared prefix). Read one line at a time.

Sessions are chains of requests found by prefix: request R extends the chain whose last request
T arrived before R and whose reusable blocks are a prefix of R's `hash_ids`; T's reusable blocks
are its whole blocks, `hash_ids[:input_length // 512]` (a partial last block is rehashed once the
prompt grows past it, so a follow-up turn never repeats its id). At least `MIN_SHARED_BLOCKS`
must be shared: in the FAST'25 traces every request starts with block 0, a system prompt, which
does not make them one session. Where several chains qualify, the one sharing the most blocks,
then the one whose last request is latest, then the oldest chain wins. A request that extends
none starts a chain.
"""

from __future__ import annotations

from pathlib import Path

from .common import BadRows, Session, Turn, json_rows, number, open_input

BLOCK_TOKENS = 512
MIN_SHARED_BLOCKS = 2


def _row(obj: dict) -> tuple[float, int, int, tuple[int, ...]]:
    ts = number(obj, "timestamp")
    inp = number(obj, "input_length", integer=True)
    out = number(obj, "output_length", integer=True)
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"hash_ids must be a list of integers, got {str(ids)[:40]}")
    return ts, inp, out, tuple(ids)


class _Chains:
    """The chains' last requests, indexed by (blocks, hash of those blocks) of their reusable
    prefix, so that each request is matched in time linear in its length."""

    def __init__(self):
        self.index: dict[tuple[int, int], list[int]] = {}
        self.tail: list[tuple[float, tuple[int, ...]]] = []  # chain -> (last arrival, its reusable prefix)

    @staticmethod
    def _hashes(ids: tuple[int, ...]) -> list[int]:
        h, out = 0, []
        for i in ids:
            h = hash((h, i))
            out.append(h)
        return out

    def match(self, ts: float, ids: tuple[int, ...]) -> int | None:
        hs = self._hashes(ids)
        for k in range(len(ids), MIN_SHARED_BLOCKS - 1, -1):
            best = None
            for c in self.index.get((k, hs[k - 1]), ()):
                t_ts, pre = self.tail[c]
                if t_ts < ts and pre == ids[:k] and (best is None or t_ts > self.tail[best][0] or
                                                     (t_ts == self.tail[best][0] and c < best)):  # then the oldest
                    best = c
            if best is not None:
                return best
        return None

    def set_tail(self, chain: int | None, ts: float, reusable: tuple[int, ...]) -> int:
        if chain is None:
            chain = len(self.tail)
            self.tail.append((ts, ()))
        else:
            old = self.tail[chain][1]
            if len(old) >= MIN_SHARED_BLOCKS:
                key = (len(old), self._hashes(old)[-1])
                self.index[key].remove(chain)
                if not self.index[key]:
                    del self.index[key]
        self.tail[chain] = (ts, reusable)
        if len(reusable) >= MIN_SHARED_BLOCKS:
            self.index.setdefault((len(reusable), self._hashes(reusable)[-1]), []).append(chain)
        return chain


def read_mooncake(paths: list[Path], bad: BadRows) -> list[Session]:
    sessions: list[Session] = []
    for path in map(open_input, paths):
        cls = path.stem
        chains = _Chains()
        turns: list[list[Turn]] = []
        last_ts = None
        for lineno, obj in json_rows(path, bad):
            try:
                ts, inp, out, ids = _row(obj)
            except ValueError as e:
                bad(str(path), lineno, str(e))
                continue
            if last_ts is not None and ts < last_ts:
                bad(str(path), lineno, f"timestamp {ts:g} ms is before the previous row's {last_ts:g} ms "
                                       f"(a Mooncake trace is in arrival order)")
                continue
            last_ts = ts
            c = chains.match(ts, ids)
            c = chains.set_tail(c, ts, ids[:inp // BLOCK_TOKENS])
            if c == len(turns):
                turns.append([])
            turns[c].append(Turn(keys=(cls,), context=inp, output=out, arrival_s=ts / 1000.0))
        for c, chain in enumerate(turns):
            sessions.append(Session(pid=f"{cls}-{c:06d}", start_s=chain[0].arrival_s, turns=chain))
    return sessions
