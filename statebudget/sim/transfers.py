"""Transfers: the simulator's side of the Mechanism (`core/decisions.py`). Bytes move as flows on
the links (`flows.py`); a copy in HBM is usable only once whole. Promotions, demotions, loads for
calls, host copies and their spills to NVMe, and the cancels that stop half-moved state all go
through here, and only here are the books (`Tiers`) written for copies."""

from __future__ import annotations

from ..core.books import Engine, GpuCopy, HostCopy
from ..core.decisions import Cancel, Demote, Promote, PromoteHost
from ..core.toolwait import BACKGROUND_SHARE
from ..models.state import describe
from .loop import PRIO_FLOW, PRIO_TIMER


class Transfer:
    """The flows that move one copy; cancelling it stops them, including those not yet started.
    `weight` is theirs on the links (below 1: a background transfer), also for those not yet started.
    `moving`: bytes are still on their way over a link (not a recompute, not only a wake-up left)."""
    __slots__ = ("fids", "cancelled", "weight", "moving")

    def __init__(self, weight: float = 1.0, moving: bool = True):
        self.fids: list[int] = []
        self.cancelled = False
        self.weight = weight
        self.moving = moving


class _Barrier:
    """Runs `fn` once `n` things have finished."""
    __slots__ = ("n", "fn")

    def __init__(self, n, fn):
        self.n, self.fn = n, fn

    def hit(self, now):
        self.n -= 1
        return self.fn(now) if self.n == 0 else None


class TransfersMixin:
    """Loads into HBM, evictions and demotions, host copies, flows, and the policy's promote,
    promote_host, demote and cancel decisions."""

    def _foreground(self, copy: GpuCopy) -> None:
        """A background load (a tool-wait swap-in, speculation) that a call or a lease now needs
        goes on at full weight on its links."""
        if not copy.background:
            return
        copy.background = False
        if copy.transfer is not None:
            copy.transfer.weight = 1.0
            for fid in copy.transfer.fids:
                self._push_all(self._flow_events(self.flows.reweight(self.now, fid, 1.0)))

    def _new_gpu_copy(self, key, group, prefetch: bool, cause: str = "") -> GpuCopy:
        per_gpu = self.size_of(key) / len(group)
        wake = False
        if key[0] == "w":
            wake = self.tiers.asleep_on(key, group)
            self.recorder.weights_event(self.now, "prefetch" if prefetch else "load", key[1], group,
                                        engine="wake" if wake else "cold", cause=cause)
            self.tiers.start_engine(key, group, self.now)
        ok = self.tiers.alloc_gpu(group, per_gpu)
        assert ok, "allocation planned by plan_eviction must succeed"
        copy = GpuCopy(key, group, per_gpu, False, self.now, self.now, from_prefetch=prefetch, wake=wake)
        self.tiers.add_gpu_copy(copy)
        if key[0] == "kv":
            self.kv_of_program[key[1]].add(key)
        return copy

    def _after(self, drains: list[HostCopy], fn):
        """Run `fn(now)` once the given host copies are written (now if none): HBM that a demotion
        frees is not overwritten before its bytes are out."""
        if not drains:
            return fn(self.now)
        barrier = _Barrier(len(drains), fn)
        for hc in drains:
            hc.waiters.append(barrier.hit)
        return None

    def _start_loads(self, loads: list[GpuCopy]):
        events = []
        for copy in loads:
            events += self._load_copy(copy)
        return events

    def _load_copy(self, copy: GpuCopy) -> list:
        if copy.transfer is not None and copy.transfer.cancelled:
            return []
        key, group = copy.key, copy.group
        src = self.best_source(key, group)
        kind = src.split(":", 1)[0]
        # A background swap-in yields the link; a recompute batches with its model's calls at full weight.
        copy.transfer = token = Transfer(BACKGROUND_SHARE if copy.background and kind != "none" else 1.0,
                                         moving=kind != "none")
        if kind == "none":  # KV recompute: a prefill of the tokens it held, on the group
            m = self.catalog.by_name[key[2]]
            self.recorder.recomputed_tokens += self.kv_tokens.get(key, 0)
            amount = self.cost.prefill_s(m, self.kv_tokens.get(key, 0), group)
            return self.flows_add(amount, tuple(f"gpu:{i}" for i in group), lambda now: self._copy_ready(copy), key[2],
                                  token=token)
        if kind == "host":
            self.tiers.host[(key, src.split(":", 1)[1])].last_use = self.now
        delay = self.cost.reconfig_s(group, kind, wake=copy.wake) if key[0] == "w" else 0.0
        src_gpu_copy = None
        if kind == "gpu":
            src_group = next(g for g in sorted(self.tiers.groups_of[key]) if g[0] == int(src.split(":")[1]))
            src_gpu_copy = self.tiers.gpu[(key, src_group)]
            src_gpu_copy.pins += 1

        copy.src_copy = src_gpu_copy

        def done(now):
            token.moving = False  # every byte is in; at most a wake-up is left
            if src_gpu_copy is not None:  # a KV move: the old copy goes once the new one is whole
                copy.src_copy = None
                src_gpu_copy.pins -= 1
                if src_gpu_copy.pins == 0 and (key, src_gpu_copy.group) in self.tiers.gpu:
                    self._drop_gpu_copy(src_gpu_copy)
            if delay > 0:
                return [(now + delay, PRIO_TIMER, self._copy_ready, (copy,))]
            return self._copy_ready(copy)

        barrier = _Barrier(len(group), done)
        events = []
        tier_pair = f"{kind}->gpu"
        for i in group:
            path = self.cost.path(src, f"gpu:{i}")
            events += self.flows_add(copy.per_gpu, path, barrier.hit, None, latency=self.cost.latency_s(src),
                                     tag=tier_pair, token=token)
        return events

    def flows_add(self, amount, resources, on_done, share_key, latency: float = 0.0, tag=None, token=None) -> list:
        """Start a flow now, or after `latency` (a transfer's fixed set-up time). `tag` names the
        tier pair its bytes count under; `token` lets the owner cancel it, and its weight below 1
        makes it a background flow (`flows.py`)."""
        if latency > 0:
            return [(self.now + latency, PRIO_TIMER, self._start_flow, (amount, resources, on_done, share_key, tag, token))]
        return self._start_flow(amount, resources, on_done, share_key, tag, token)

    def _start_flow(self, amount, resources, on_done, share_key, tag=None, token=None):
        weight = 1.0
        if token is not None:
            if token.cancelled:
                return None
            token.fids.append(self.flows._next)
            weight = token.weight
        return self._flow_events(self.flows.add(self.now, amount, resources, on_done, share_key, tag, weight))

    def _flow_events(self, evs) -> list:
        """The flow table's completion estimates `(eta, fid, version)` as events to schedule."""
        return [(t, PRIO_FLOW, self._flow_done, (fid, v)) for t, fid, v in evs]

    def _flow_done(self, fid, version):
        events, f = self.flows.finish(self.now, fid, version)
        out = self._flow_events(events)
        if f is None:
            self.recorder.stale_events += 1  # a completion superseded by a re-pricing of its flow
        else:
            if f.tag is not None:
                self.recorder.bytes_by_pair[f.tag] += f.done
            r = f.on_done(self.now)
            if r:
                out += r
        return out

    def cancel_transfer(self, token: Transfer) -> float:
        """Stop a transfer; returns the bytes its flows had moved."""
        token.cancelled = True
        done = 0.0
        for fid in token.fids:
            events, f = self.flows.cancel(self.now, fid)
            if f is not None and f.tag is not None:
                done += f.done
                self.recorder.bytes_by_pair[f.tag] += f.done
            self._push_all(self._flow_events(events))
        return done

    def cancel_load(self, copy: GpuCopy, cause: str = "") -> bool:
        """Abandon a copy still being written into HBM that no call waits for: its flows stop, its
        space is freed, and it never becomes ready (half-moved state is never usable)."""
        if copy.ready or copy.pins > 0 or self.tiers.gpu.get((copy.key, copy.group)) is not copy:
            return False
        if copy.key[0] == "w":  # its engine, started for it, stops with it
            self.recorder.weights_event(self.now, "cancel", copy.key[1], copy.group, cause=cause)
        moved = self.cancel_transfer(copy.transfer) if copy.transfer is not None else 0.0
        if copy.transfer is None:
            copy.transfer = Transfer()
            copy.transfer.cancelled = True  # waiting for drains: never start
        if copy.src_copy is not None:
            copy.src_copy.pins -= 1
            copy.src_copy = None
        self.recorder.wasted_bytes += moved
        self._remove_copy(copy)
        self.recorder.dirty = True
        return True

    def _copy_ready(self, copy: GpuCopy):
        if (copy.key, copy.group) not in self.tiers.gpu or self.tiers.gpu[(copy.key, copy.group)] is not copy:
            return None  # dropped while loading (its call was cancelled)
        copy.ready = True
        self.recorder.dirty = True
        if copy.lease is not None:
            self._apply(self._hook("on_copy_ready", copy))
        events = []
        waiters, copy.waiters = copy.waiters, []
        for c in waiters:
            if c.state != "loading":
                continue
            c.waiting_on -= 1
            if c.waiting_on == 0:
                c.last_load = copy.key[0]
                events += self._on_ready(c, start=False)  # all the calls this copy completes queue first,
        events += self._start_queued()                    # then the discipline picks among them
        self._retry_waiting()  # a copy that was loading can now be evicted for a waiting call
        return events

    def _evict(self, copy: GpuCopy, to: str, weight: float = 1.0, cause: str = "") -> list[HostCopy]:
        """Demote a copy out of HBM (`host` or `none`); returns the host copies being written,
        which must be whole before the freed HBM is written. `weight` < 1: a background copy-out.
        `cause`: who needed the room, for the timeline."""
        if isinstance(copy, Engine):  # an asleep engine stops; its host copy stays, as a cache
            self.recorder.weights_event(self.now, "engine-stop", copy.key[1], copy.group, cause=cause)
            self.tiers.stop_engine(copy.key, copy.group)
            return []
        if not copy.used:
            self.recorder.wasted_bytes += copy.nbytes
        key = copy.key
        node = self.gpus[copy.group[0]].node
        drains = []
        if to == "host":
            hc = self.tiers.host.get((key, node))
            if hc is None:
                hc = self._new_host_copy(key, node, copy.nbytes)
            elif key[0] == "w" and hc.ready and hc.engine is None:
                # The engine writes its weights into its own pinned buffer, over the node's page
                # cache copy: that copy stands for both (one DRAM count, a simplification).
                hc.ready = False
            else:
                hc = None  # already there, being written, or another engine's pinned copy
            if hc is not None:
                self._copy_out(copy, hc, node, weight)
                drains.append(hc)
                if key[0] == "w":  # the engine sleeps on its group (vLLM sleep level 1)
                    self.tiers.sleep_engine(key, copy.group, hc)
        self._remove_copy(copy)
        if key[0] == "w":  # an engine not put to sleep stopped with its copy
            self.recorder.weights_event(self.now, "evict", key[1], copy.group, to=to, cause=cause,
                                        engine="asleep" if (key, copy.group) in self.tiers.engines else "stopped")
        self.recorder.dirty = True
        return drains

    def _new_host_copy(self, key, node: str, nbytes: float) -> HostCopy | None:
        """A host copy about to be written, where the node's DRAM has or can make room."""
        if not self._make_host_room(node, nbytes):
            return None
        self.tiers.alloc_host(node, nbytes)
        hc = self.tiers.host[(key, node)] = HostCopy(key, node, nbytes, False, self.now)
        return hc

    def _copy_out(self, copy: GpuCopy, hc: HostCopy, node: str, weight: float) -> None:
        """The flows that write an HBM copy into host copy `hc`, one per GPU of its group."""
        barrier = _Barrier(len(copy.group), lambda now: self._host_ready(hc))
        token = Transfer(weight)
        if weight < 1.0:  # a tool-wait swap-out: a call that comes back may stop it (`_keep_kv`)
            hc.source = (token, copy)
        for i in copy.group:
            self._push_all(self.flows_add(copy.per_gpu, self.cost.path(f"gpu:{i}", f"host:{node}"),
                                          barrier.hit, None, latency=self.cost.latency_s("gpu"), tag="gpu->host",
                                          token=token))

    def _remove_copy(self, copy: GpuCopy) -> None:
        """Every HBM copy leaves through here: suspended KV stops counting its byte-seconds."""
        self._end_suspension(copy)
        self.tiers.remove_gpu_copy(copy)

    def _end_suspension(self, copy: GpuCopy) -> None:
        """A suspended KV copy stops being suspended: its byte-seconds in HBM are counted."""
        if copy.suspended_since is not None:
            self.recorder.kv_hbm_byte_s += copy.nbytes * (self.now - copy.suspended_since)
            copy.suspended_since = None

    def _host_ready(self, hc: HostCopy):
        hc.source = None
        if self.tiers.host.get((hc.key, hc.node)) is hc:
            hc.ready = True
        events = []
        waiters, hc.waiters = hc.waiters, []
        for fn in waiters:
            events += fn(self.now) or []
        return events

    def _remove_host(self, hc: HostCopy):
        """Drop a host copy; whoever waits for it being written stops waiting."""
        self.tiers.remove_host_copy(hc)
        waiters, hc.waiters = hc.waiters, []
        for fn in waiters:
            self._push_all(fn(self.now))

    def _make_host_room(self, node: str, nbytes: float) -> bool:
        """Make room in a node's DRAM by dropping ready host copies, least recently used first
        (weights and experts stay in the NVMe store; KV goes to NVMe when it has room)."""
        free = self.tiers.host_cap[node] - self.tiers.host_used[node]
        if free >= nbytes:
            return True
        cands = sorted((hc for (k, n), hc in self.tiers.host.items() if n == node and hc.ready),
                       key=lambda hc: (hc.last_use, hc.key))
        if free + sum(hc.nbytes for hc in cands) < nbytes:
            return False
        for hc in cands:
            if free >= nbytes:
                break
            if hc.engine is not None:  # the engine asleep on this copy stops with it
                self.recorder.weights_event(self.now, "engine-stop", hc.key[1], hc.engine,
                                            cause=f"host DRAM room on {node}")
            self.tiers.remove_host_copy(hc)
            free += hc.nbytes
            if hc.key[0] == "kv" and (hc.key, node) not in self.tiers.nvme and self.tiers.alloc_nvme(hc.key, node, hc.nbytes):
                self._push_all(self.flows_add(hc.nbytes, self.cost.path(f"host:{node}", f"nvme:{node}"),
                                              lambda now: None, None, latency=self.cost.latency_s("host"), tag="host->nvme"))
        return True

    def _drop_gpu_copy(self, copy: GpuCopy):
        if not copy.used:
            self.recorder.wasted_bytes += copy.nbytes
        self._remove_copy(copy)
        self.recorder.dirty = True

    def _drop_stale_kv(self, kvk, keep: GpuCopy):
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            copy = self.tiers.gpu[(kvk, g)]
            if copy is not keep and copy.pins == 0:
                if not copy.ready:
                    self.cancel_load(copy)
                else:
                    self._drop_gpu_copy(copy)
        for (k, n), hc in list(self.tiers.host.items()):
            if k == kvk:
                self._remove_host(hc)
        for (k, n) in [kn for kn in self.tiers.nvme if kn[0] == kvk]:
            self.tiers.remove_nvme(k, n)

    def _drop_everywhere(self, kvk):
        for g in sorted(self.tiers.groups_of.get(kvk, ())):
            copy = self.tiers.gpu[(kvk, g)]
            copy.used = True  # KV of a finished program is not a wasted promotion
            if not copy.ready and copy.transfer is not None:
                self.cancel_transfer(copy.transfer)
            self._remove_copy(copy)
        for (k, n), hc in list(self.tiers.host.items()):
            if k == kvk:
                self._remove_host(hc)
        for (k, n) in [kn for kn in self.tiers.nvme if kn[0] == kvk]:
            self.tiers.remove_nvme(k, n)
        self.kv_tokens.pop(kvk, None)
        self.recorder.dirty = True

    # ---- the Mechanism (core/decisions.py): a policy's decisions carried out ---------------------
    def promote(self, d: Promote) -> None:
        self._prefetch(d.key, d.group, d.lease_id)

    def promote_host(self, d: PromoteHost) -> None:
        self._prefetch_host(d.key, d.node)

    def demote(self, d: Demote) -> None:
        """A copy leaves HBM. The room it frees is free in the books at once, but a load into it
        waits until its bytes are out (`_outgoing`), as for an eviction."""
        copy = self.tiers.gpu.get((d.key, d.group))
        if copy is not None and copy.pins == 0 and copy.ready:
            for hc in self._evict(copy, d.to, cause="the policy demoted it"):
                for i in copy.group:
                    self._draining.setdefault(i, []).append(hc)

    def _outgoing(self, group, drains: list[HostCopy]) -> list[HostCopy]:
        """`drains` plus the host copies a policy's demotion still writes out of `group`'s HBM: a
        load into that room waits for them too."""
        out = list(drains)
        for i in group:
            left = [hc for hc in self._draining.get(i, ()) if not hc.ready and self.tiers.host.get((hc.key, hc.node)) is hc]
            if left:
                self._draining[i] = left
                out += [hc for hc in left if hc not in out]
            else:
                self._draining.pop(i, None)
        return out

    def cancel(self, d: Cancel) -> None:
        """Stop a load nobody waits for."""
        copy = self.tiers.gpu.get((d.key, d.group))
        if copy is not None:
            self.cancel_load(copy, cause="the policy cancelled it")

    def _prefetch(self, key, group, lease=None, background: bool = False) -> bool:
        """Bring a copy into HBM ahead of use, evicting only what the policy allows. A lease id
        rides on the copy: the policy hears when the copy is whole (`on_copy_ready`). A
        `background` load (a tool-wait swap-in) evicts nothing and yields the link (BACKGROUND_SHARE).
        Under a policy whose speculation yields (`Policy.speculation_yields`), a promote no lease
        asked for also loads in the background, and a call that needs its room may cancel it
        while its bytes are still moving (`_cancel_rule`)."""
        existing = self.tiers.gpu.get((key, group))
        if existing is not None:
            if lease is not None:
                existing.lease = (existing.lease or ()) + (lease,)
                if self.policy.speculation_yields:  # a lease's deadline rides on it now: no longer speculation
                    self._foreground(existing)
                if existing.ready:
                    self._apply(self._hook("on_copy_ready", existing))
            return False
        if key[0] == "kv" and self.kv_tokens.get(key, 0) == 0:
            return False
        per_gpu = self.size_of(key) / len(group) + self.tiers.engine_need(key, group)
        if self._held_for_another(group):
            return False
        allow = (lambda v: False) if background else (lambda v: self.policy.may_evict_for_prefetch(self, v, key, group))
        victims = self.plan_eviction(group, per_gpu, protect={(key, group)}, allow=allow)
        if victims is None:
            return False
        drains = []
        why = f"prefetch of {describe(key)}" + (f" (lease {lease})" if lease is not None else "")
        for v in victims:
            drains += self._evict(v, self.policy.demote_tier(self, v), cause=why)
        copy = self._new_gpu_copy(key, group, prefetch=True, cause=f"lease {lease}" if lease is not None else "promote")
        copy.background = background or (lease is None and self.policy.speculation_yields)
        if lease is not None:
            copy.lease = (lease,)
        drains = self._outgoing(group, drains)
        load = self._load_drained if drains else self._load_copy
        self._push_all(self._after(drains, lambda now: load(copy)))
        return True

    def _load_drained(self, copy: GpuCopy) -> list:
        """A promote's load starts once its victims' bytes are out. Calls waiting for room look
        again: a speculative load may be cancelled only from now on (`_cancel_rule`)."""
        events = self._load_copy(copy)
        if self.policy.speculation_yields and not copy.transfer.cancelled:
            self._retry_waiting()
        return events

    def _prefetch_host(self, key, node) -> bool:
        if (key, node) in self.tiers.host or key[0] == "kv":
            return False
        nbytes = self.size_of(key)
        if self.tiers.host_cap[node] - self.tiers.host_used[node] < nbytes:
            return False
        self.tiers.alloc_host(node, nbytes)
        hc = HostCopy(key, node, nbytes, False, self.now)
        self.tiers.host[(key, node)] = hc
        self._push_all(self.flows_add(nbytes, self.cost.path(f"nvme:{node}", f"host:{node}"),
                                      lambda now: self._host_ready(hc), None, latency=self.cost.latency_s("nvme"),
                                      tag="nvme->host"))
        return True

    def link_backlog(self) -> dict[str, float]:
        """Bytes still queued on each link by transfers in flight."""
        out: dict[str, float] = {}
        now = self.now
        for f in self.flows.flows.values():
            if f.tag is None:
                continue
            rem = f.remaining - f.rate * (now - f.t_last)
            if rem > 0:
                for r in f.resources:
                    out[r] = out.get(r, 0.0) + rem
        return out
