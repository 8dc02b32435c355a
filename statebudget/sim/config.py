"""The knobs of one simulated run, in one frozen object that the CLI, the runner, the sweep and
the simulator pass along unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.programs import ADMIT_STARVE_S

START_MODES = ("cold", "warm")  # SimConfig.start, DESIGN.md §4
KV_RESERVES = ("asked", "written", "paged")  # SimConfig.kv_reserve


@dataclass(frozen=True)
class SimConfig:
    """How the simulator runs a trace; the cluster, catalog, trace and policy are given apart.

    seed: draws the expert pages each call touches and which call attempts fail.
    check_invariants: check the books (`Tiers.check`) after every event that changed them (slow).
    max_batch: calls a GPU runs at once (an engine's max_num_seqs); later ones queue for compute.
    sample_dt: seconds between two samples of the bytes in HBM (`SimResult.hbm_samples`).
    queue: the compute and admission queue discipline (`core/programs.py`: fcfs, plas, atlas, auto).
    kv_rule: what a tool wait does to its program's KV (`core/toolwait.py`); None: the policy's own.
    prefill_slots: prefills a GPU runs at once (None: any number, sharing its FLOP/s). With a limit,
        calls queue for compute and the discipline decides who goes first, as vLLM's token budget
        per step serialises prefills.
    admit_starve_s: a call that has waited this long for HBM holds its GPUs (no other admission,
        no prefetch there) until it is in; None: no reservation.
    call_failure_rate: the chance that a call attempt fails while it runs (an engine error, a lost
        worker), at a uniform point of its uncontended run, drawn per (program, node, attempt) from
        the seed. Its KV on that group is lost; the call is retried at once.
    retry_keeps_service: the program keeps the service a failed attempt attained; False only for the
        ablation in which a retry comes back as a new program id, starting from no service.
    start: the state at t = 0 (DESIGN.md §4): `cold`, every model's weights on NVMe only (and the
        cluster's `preload:` models in host DRAM); `warm`, every model's weights and expert pages
        also in host DRAM of every node that can hold them (a page cache, no engine awake).
    warmup_s: the first seconds the run simulates but no metric counts: the calls of programs
        that start before it are left out (by program start, as `metrics.counted_calls`); bytes
        and the warm tax count from it on.
    timeline: keep every change of where models' weights live (`SimResult.timeline`): loads,
        evictions and engine stops, each with its cause. Decides nothing.
    kv_reserve: the KV room an admitted call holds for what it will write. `asked` (the default, the
        fair table's): its `max_tokens`, as an engine that must never run out mid-call. `written`:
        the tokens it will write (at most `max_tokens`), as a paged engine (vLLM, SGLang) that
        allocates blocks as tokens come and never has to preempt: optimistic, no preemption is
        modelled. Placement and room estimates (`expected_need`, `could_ever_fit`) use
        `max_tokens` either way, but free HBM, which policies read, then counts each running
        call's final KV from its admission, where an engine shows only what it has written so far:
        an experiment, not fair ground. `paged`: close to an engine with paged KV (vLLM): a call
        is admitted with room for its context and one chunk of `KV_CHUNK_TOKENS` output tokens,
        takes the next chunk from free HBM as its decode reaches it, and where there is none the
        engine preempts its newest running call (that call's attempt starts again and it comes
        back holding room for all of `max_tokens`; `preemptions`). Free HBM then shows what calls
        have written, to a chunk. Either way a report carries no lower bound (docs/model.md).
    """

    seed: int = 0
    check_invariants: bool = False
    max_batch: int = 32
    sample_dt: float = 15.0
    queue: str = "fcfs"
    kv_rule: str | None = None
    prefill_slots: int | None = None
    admit_starve_s: float | None = ADMIT_STARVE_S
    call_failure_rate: float = 0.0
    retry_keeps_service: bool = True
    start: str = "cold"
    warmup_s: float = 0.0
    timeline: bool = False
    kv_reserve: str = "asked"

    def __post_init__(self):
        if self.start not in START_MODES:
            raise ValueError(f"start must be one of {', '.join(START_MODES)}, got {self.start!r}")
        if self.kv_reserve not in KV_RESERVES:
            raise ValueError(f"kv_reserve must be one of {', '.join(KV_RESERVES)}, got {self.kv_reserve!r}")
        if not self.warmup_s >= 0.0:
            raise ValueError(f"warmup_s must be >= 0 seconds, got {self.warmup_s}")
        if not 0.0 <= self.call_failure_rate < 1.0:
            raise ValueError(f"call_failure_rate must be in [0, 1), got {self.call_failure_rate}")
