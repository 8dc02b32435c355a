"""A runtime client that replays a v1 trace against a live planner, as an agent runtime would.

Each program runs as a task: its nodes start when their dependencies end; a call is announced
(`call_arrived`, with its `max_tokens`), runs for `call_s` (there is no engine here) and ends with its
KV length and what it wrote (`call_finished`: its `output_tokens` are known at its end only); a tool
waits its duration. Hints become HandoffLeases when their node starts, with the deadline at the
hinted call's expected arrival; at that call the driver asks whether the lease is ready. Times are
the trace's divided by `speed`.

It retries what a restart of the planner interrupts: a request that never reached the server is
sent again; a lease whose answer was lost is not (it is counted as `unanswered`), so every lease
the driver counts as accepted was acknowledged by the server.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from ..models.trace import Trace, ttft_bound
from ..traces.graph import descendants, threads


class Driver:
    def __init__(self, url: str, token: str, speed: float = 20.0, call_s: float = 0.05, retry_s: float = 60.0,
                 transport=None):
        self.url, self.speed, self.call_s, self.retry_s = url, speed, call_s, retry_s
        self.headers = {"Authorization": f"Bearer {token}"}
        self.transport = transport
        self.leases: list[dict] = []     # every lease answer, with what became of it
        self.latency_s: list[float] = []
        self.errors: list[str] = []
        self.unanswered = 0
        self.events = 0

    async def _send(self, client: httpx.AsyncClient, method: str, path: str, body=None, idempotent=True):
        """One request; retried while the server is unreachable (and after a lost answer when the
        request is idempotent). Returns the response, or None if it never got one."""
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            t0 = time.perf_counter()
            try:
                r = await client.request(method, path, json=body)
                if r.status_code >= 500 and time.monotonic() < deadline:
                    raise httpx.RemoteProtocolError(f"{r.status_code}")
                if r.status_code == 401 or (r.status_code == 403 and "another tenant" not in r.text):
                    # every later request would fail the same way (a program of another tenant is that program's error)
                    raise PermissionError(f"{method} {path}: {r.status_code} {r.text[:200]}")
                self.latency_s.append(time.perf_counter() - t0)
                return r
            except httpx.ConnectError:
                pass
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout):
                if not idempotent:
                    self.unanswered += 1
                    return None
            if time.monotonic() > deadline:
                self.errors.append(f"{method} {path}: planner unreachable for {self.retry_s:.0f} s")
                return None
            await asyncio.sleep(delay)  # back off while the planner restarts
            delay = min(delay * 2, 1.0)

    async def _event(self, client, **body) -> dict | None:
        r = await self._send(client, "POST", "/v1/events", body)
        self.events += 1
        if r is not None and r.status_code != 200:
            self.errors.append(f"event {body['type']} {body['program']}: {r.status_code} {r.text[:200]}")
        return r.json() if r is not None and r.status_code == 200 else None

    async def _program(self, client, p, t0: float, slo_classes: dict[str, float]) -> None:
        await asyncio.sleep(max(0.0, t0 + p.start / self.speed - time.monotonic()))
        started = await self._event(client, type="program_started", program=p.program)
        if started is None:  # refused (its error is counted) or unanswered: nothing of it can follow
            return
        if started.get("status") != "running":
            self.errors.append(f"program {p.program}: already {started.get('status')} in the planner's ledger (program "
                               f"ids must be new: another trace seed, or serve with a fresh --db); not replayed")
            return
        done = {n.id: asyncio.Event() for n in p.nodes}
        by_id = {n.id: n for n in p.nodes}
        hints_at: dict[str, list] = {}
        for h in p.hints:
            hints_at.setdefault(h.issued_at, []).append(h)
        lease_for: dict[str, dict] = {}
        cancels_at: dict[str, list[str]] = {}
        for c in p.cancel:
            cancels_at.setdefault(c.at_after, []).append(c.node)
        dropped: set[str] = set()  # nodes of branches the trace cancels (DESIGN §5 `cancel`), as in the simulator
        thread = threads(p)

        ttft_s = ttft_bound(slo_classes, p.slo)  # the simulator's TTFT bound

        async def cancel_branch(root: str):
            """Drop `root` and every node after it. A node's own task sees it before its next
            event: a call that has arrived sends `call_cancelled` (after its event in flight, so
            the planner gets them in order), the others send nothing. Leases asked for them go."""
            new = [nid for nid in descendants(p, root) if nid not in dropped]
            dropped.update(new)
            for nid in new:
                done[nid].set()  # nothing waits for it: every node after it is dropped too
            for nid in new:
                rec = lease_for.get(nid)
                if rec is not None and rec["decision"] != "rejected":
                    await self._send(client, "DELETE", f"/v1/leases/{rec['lease_id']}")

        async def run(n):
            for a in n.after:
                await done[a].wait()
            if n.id in dropped:
                return
            for h in hints_at.get(n.id, ()):
                wait = (n.duration if n.kind == "tool" else 0.0) / self.speed
                body = {"program": p.program, "model": h.model, "deadline_s": max(wait, 1e-3),
                        "confidence": h.confidence, "for_call": h.for_}
                r = await self._send(client, "POST", "/v1/leases", body, idempotent=False)
                if r is not None and r.status_code == 200:
                    rec = {**r.json(), "program": p.program, "for_call": h.for_, "deadline_s": body["deadline_s"],
                           "asked_model": h.model, "ready_at_use": None}
                    self.leases.append(rec)
                    lease_for.setdefault(h.for_, rec)
                elif r is not None:
                    self.errors.append(f"lease {p.program}/{h.for_}: {r.status_code} {r.text[:200]}")
            if n.kind == "tool":
                # The node is the tool's side effect (its idempotency key): a start answered `done`
                # (repeated after a lost answer, say) already ran, so it is not run again.
                out = await self._event(client, type="tool_started", program=p.program, tool=n.tool or "tool",
                                        call=n.id, thread=thread[n.id], effect=n.id)
                if out is None or out.get("status") != "done":
                    await asyncio.sleep(n.duration / self.speed)
                    await self._event(client, type="tool_finished", program=p.program, tool=n.tool or "tool",
                                      call=n.id, thread=thread[n.id])
            else:
                rec = lease_for.get(n.id)
                if rec is not None and rec["decision"] != "rejected":
                    r = await self._send(client, "GET", f"/v1/leases/{rec['lease_id']}")
                    rec["ready_at_use"] = r is not None and r.status_code == 200 and r.json()["ready"]
                    rec["at_use"] = r.json() if r is not None and r.status_code == 200 else None
                if n.id in dropped:  # dropped while its leases were asked for: it never arrives
                    return
                await self._event(client, type="call_arrived", program=p.program, call=n.id, model=by_id[n.id].model,
                                  context_tokens=n.context_tokens, max_tokens=n.requested_tokens, ttft_s=ttft_s,
                                  after=[a for a in n.after if by_id[a].kind == "call"])
                # what the call wrote is told at its end only (DESIGN.md §5)
                for ev in ({"type": "call_started"}, None, {"type": "call_finished", "output_tokens": n.output_tokens,
                                                            "tokens": n.context_tokens + n.output_tokens}):
                    if n.id in dropped:
                        await self._event(client, type="call_cancelled", program=p.program, call=n.id)
                        return
                    if ev is None:
                        await asyncio.sleep(self.call_s)
                    else:
                        await self._event(client, program=p.program, call=n.id, **ev)
            if n.id not in dropped:
                for victim in cancels_at.get(n.id, ()):
                    await cancel_branch(victim)
            done[n.id].set()

        await asyncio.gather(*(run(n) for n in p.nodes))
        await self._event(client, type="program_finished", program=p.program)

    async def replay(self, trace: Trace) -> dict:
        async with httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=30.0,
                                     transport=self.transport) as client:
            t0 = time.monotonic()
            await asyncio.gather(*(self._program(client, p, t0, trace.header.slo_classes) for p in trace.programs))
        return self.summary()

    def summary(self) -> dict:
        by = {"accepted": 0, "partial": 0, "rejected": 0}
        for rec in self.leases:
            by[rec["decision"]] += 1
        promised = [r for r in self.leases if r["decision"] == "accepted" and r["quote"]["p95_s"] <= r["deadline_s"]]
        kept = [r for r in promised if r["ready_at_use"]]
        lat = sorted(self.latency_s)

        def q(x):
            return round(lat[min(len(lat) - 1, int(x * len(lat)))] * 1e3, 3) if lat else 0.0

        late = [{"lease_id": r["lease_id"], "model": r["asked_model"], "deadline_s": r["deadline_s"],
                 "p95_s": r["quote"]["p95_s"], "at_use": {k: (r.get("at_use") or {}).get(k) for k in ("state", "reason", "objects")}}
                for r in promised if not r["ready_at_use"]]
        # a deadline is the trace's wait divided by --speed, while a quote is the transfer's real time
        quoted_late = sum(1 for r in self.leases if r["decision"] == "rejected" and r["quote"]["p95_s"] > r["deadline_s"])
        return {"events": self.events, "leases": by, "rejected_quoted_after_deadline": quoted_late,
                "unanswered": self.unanswered,
                "promised_by_quote": len(promised), "ready_when_promised": len(kept), "late": late[:10],
                "request_ms": {"p50": q(0.5), "p99": q(0.99)}, "errors": self.errors[:20], "n_errors": len(self.errors)}
