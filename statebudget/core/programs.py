"""Program-aware serving (seed 003): which waiting call goes first. Pure functions over what the
mechanism knows; the simulator and the service both call them (the tool-wait KV rules are in
`toolwait.py`).

Queue disciplines (a sort key, lowest first):

    fcfs   arrival time
    plas   the program's attained service (compute seconds of its finished calls): a new call
           inherits its program's service, so short programs overtake long ones (§4). Service
           counts in doubling levels (`service_level`): like-sized programs stay FCFS
    atlas  the attained service along the call's critical path in the program's DAG, so a thread
           of a wide fork/join program is not penalised for its siblings (§6)
    auto   atlas while the programs that finished are heavy-tailed in attained service, fcfs
           while they are not (`ProgramSizes`): least-attained-service order pays only when a
           program that has run a while is likely to run much longer (decreasing hazard); for
           light tails FCFS's P95 is lower (BENCHMARKS.md, queue disciplines)

Both plas and atlas age: every second a call waits takes `aging` seconds off its key; and a call
that has waited `starve_s + starve_ratio x L(c)` since it arrived, where L(c) is its service level,
is promoted above every non-promoted call, FCFS among the promoted (Autellix's anti-starvation
rule: a program starves when its wait exceeds beta times its service). The allowance grows with
what the program has had: a fixed allowance of 30 s promotes nearly every call as soon as a real
queue forms, and PLAS then runs as FCFS. Together they bound how far a call can
be overtaken:

    under plas and atlas, a call c is only ever started after a call d that arrived later if
        arrive(d) - arrive(c) < min(starve_s + starve_ratio L(c), (L(c) + URGENCY_CAP_S + 2 TENANT_SCALE_S) / aging)

(past that window c's key stays below d's: both age at the same rate and the bounded urgency and
tenant terms can close at most URGENCY_CAP_S + 2 TENANT_SCALE_S of the gap; or c is promoted
first). With the defaults the window is 30 s + 2 L(c) <= 30 s + 2 x service(c): a program waits
for later arrivals at most twice what it has had, plus 30 s, so its slowdown from overtaking is
bounded. c waits at most the window plus the FCFS wait of a call arriving that much after it.

That bounds the wait for compute. The wait for HBM (admission) is bounded by a reservation,
under every discipline: the oldest call that has waited ADMIT_STARVE_S without fitting holds its
GPUs, and no other call is admitted and nothing is prefetched there until it is in, except calls
that should end before the ones already there (backfill, against a deadline fixed when the
reservation is made). So the oldest starving call waits at most ADMIT_STARVE_S plus the time the
calls admitted there take to finish, plus its own load (`sim/admission.py`, `_reserve`). There is
one reservation at a time: a second starving call gets its own once the first is in.
Tests check the window on every pair of calls of a loaded replay, and on a long program facing a
stream of short ones.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from .toolwait import KV_RULES

QUEUES = ("fcfs", "plas", "atlas", "auto")
AGING = 0.5     # seconds of key per second waited
STARVE_S = 30.0  # a call waiting this long, plus STARVE_RATIO x its service level, goes ahead of every call not starving
STARVE_RATIO = 2.0  # seconds of wait allowed per second of attained service before a call starves (Autellix's beta)
URGENCY_CAP_S = 10.0  # the most key a call's shrinking TTFT slack takes off (§19): bounded, so it cannot starve
TENANT_SCALE_S = 10.0  # key added per unit of a tenant's service share above its weighted fair share (§20)
ADMIT_STARVE_S = 60.0  # a call waiting this long for HBM reserves its GPUs until it is admitted
SERVICE_QUANTUM_S = 10.0  # attained service counts in levels 0, 10, 20, 40, 80 ... s (`service_level`)
AUTO_WINDOW = 500   # `auto` judges the tail on the attained service of the last this many finished programs,
AUTO_MIN = 50       # from this many on (fcfs before),
AUTO_HEAVY_CV = 0.9  # and goes to atlas once their coefficient of variation reaches this,
AUTO_LIGHT_CV = 0.8  # back to fcfs once it falls below this


def parse_spec(spec: str, known_policies) -> tuple[str, str, str | None]:
    """`POLICY[:QUEUE[:KV]]` -> (policy, queue, kv rule or None for the policy's own)."""
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0]:
        raise ValueError(f"policy spec {spec!r}: expected POLICY[:QUEUE[:KV]]")
    policy = parts[0]
    if policy not in known_policies:
        raise ValueError(f"policy spec {spec!r}: unknown policy {policy!r} (known: {', '.join(known_policies)})")
    queue = parts[1] if len(parts) > 1 and parts[1] else "fcfs"
    if queue not in QUEUES:
        raise ValueError(f"policy spec {spec!r}: unknown queue discipline {queue!r} (known: {', '.join(QUEUES)})")
    kv = parts[2] if len(parts) > 2 and parts[2] else None
    if kv is not None and kv not in KV_RULES:
        raise ValueError(f"policy spec {spec!r}: unknown tool-wait KV rule {kv!r} (known: {', '.join(KV_RULES)})")
    return policy, queue, kv


class ProgramSizes:
    """What `auto` knows of the workload: the attained service (seconds its calls ran) of the last
    AUTO_WINDOW programs that finished, and whether they are heavy-tailed. Heavy means a
    coefficient of variation of at least AUTO_HEAVY_CV (until it falls below AUTO_LIGHT_CV):
    the exponential, where every order that ignores sizes ties, has 1. The threshold sits below
    1 because finished programs under-count the long ones, which are still running: on
    `long-tail` (CV 2.3 over a whole hour) the first 50 to finish show 0.9-1.0, while the
    light-tailed presets stay within 0.37-0.67 from the first 30 on (BENCHMARKS.md). The order
    feeds back on it: under atlas the long programs finish later still, so the window holds fewer
    of them and the CV falls, which the hysteresis damps (one of ten long-tail runs went back to
    fcfs for three minutes). Both mechanisms feed it the same finished programs, so they switch
    at the same one."""

    def __init__(self, window: int = AUTO_WINDOW):
        if window < AUTO_MIN:
            raise ValueError(f"ProgramSizes: a window of {window} programs never reaches the {AUTO_MIN} it judges from")
        self.service = deque(maxlen=window)
        self.heavy = False
        self.seen = 0
        self.changes: list[dict] = []  # each switch: {at_s, programs (finished so far), to (what auto orders by)}

    def observe(self, service_s: float, now: float) -> None:
        """A program finished at `now` with `service_s` of attained service (a value that is not
        a finite number is left out; a negative one counts as 0)."""
        if not math.isfinite(service_s):
            return
        self.service.append(max(0.0, service_s))
        self.seen += 1
        cv = self.cv
        if cv is not None and (cv >= AUTO_LIGHT_CV if self.heavy else cv >= AUTO_HEAVY_CV) != self.heavy:
            self.heavy = not self.heavy
            self.changes.append({"at_s": round(now, 6), "programs": self.seen, "to": self.discipline("auto")})

    @property
    def cv(self) -> float | None:
        """The coefficient of variation of the window, or None below AUTO_MIN programs."""
        if len(self.service) < AUTO_MIN:
            return None
        v = np.fromiter(self.service, float, len(self.service))
        mean = v.mean()
        return float(v.std() / mean) if mean > 0 else 0.0

    def discipline(self, queue: str) -> str:
        """The discipline `queue` orders by now: itself, or for `auto` atlas or fcfs."""
        if queue != "auto":
            return queue
        return "atlas" if self.heavy else "fcfs"


def parse_admit_starve(text: str) -> float | None:
    """`--admit-starve`: seconds (>= 0) a call waits for HBM before it holds its GPUs, or 'none'."""
    if text.strip().lower() == "none":
        return None
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"--admit-starve: expected seconds or 'none', got {text!r}") from None
    if not v >= 0:
        raise ValueError(f"--admit-starve: must be >= 0 seconds, got {text!r}")
    return v


def queue_key(discipline: str, arrive: float, now: float, program_service: float, path_service: float,
              slack_s: float | None = None, tenant_excess: float = 0.0,
              aging: float = AGING, starve_s: float = STARVE_S, starve_ratio: float = STARVE_RATIO) -> tuple:
    """Sort key of a waiting call, lowest first: (class, key, arrival). Class 0 is FCFS: every call
    under fcfs, and the starving ones under plas and atlas. Class 1 is seed 003 §20's score:

        attained service - AGING x waiting - urgency + TENANT_SCALE_S x tenant excess

    urgency = URGENCY_CAP_S - slack while 0 <= slack < URGENCY_CAP_S (else 0), where slack is the
    time left to the call's TTFT bound after its predicted prefill (§19). The tenant excess is the tenant's share of the service
    given so far minus its weighted fair share, in [-1, 1]. Both terms are bounded, and the
    starvation promotion ignores them, so the overtaking window of the module docstring
    (`overtaking_window_s`) holds."""
    if discipline == "fcfs":
        return (0, 0.0, arrive)
    service = service_level(program_service if discipline == "plas" else path_service)
    if now - arrive >= starve_s + starve_ratio * service:
        return (0, 0.0, arrive)
    # A call that can still make its TTFT bound gains up to URGENCY_CAP_S as its slack runs out; one
    # already late gains nothing (boosting it would not save its SLO): PLAS and aging decide (§19).
    urgency = URGENCY_CAP_S - slack_s if slack_s is not None and 0.0 <= slack_s < URGENCY_CAP_S else 0.0
    return (1, service - aging * (now - arrive) - urgency + TENANT_SCALE_S * tenant_excess, arrive)


def arrival_priority(discipline: str, arrive: float, epoch: float, program_service: float, path_service: float,
                     slack_s: float | None = None, tenant_excess: float = 0.0) -> float:
    """`queue_key` as one number fixed when a call arrives, for an engine that orders its queue by a
    priority it never changes (vLLM's `priority`, lower first; ties by arrival). The aging term
    counts from `epoch` instead of from now: -AGING x (now - arrive) = AGING x (arrive - epoch) -
    AGING x (now - epoch), and the last term is the same for every call waiting at `now`. So two
    waiting calls keep the simulator's order, save the starvation promotion and the urgency that
    grows as a call's slack runs out, which a fixed number cannot follow. 0 for fcfs (arrival order)."""
    if discipline == "fcfs":
        return 0.0
    _, score, _ = queue_key(discipline, arrive, arrive, program_service, path_service, slack_s, tenant_excess)
    return score + AGING * (arrive - epoch)


def parse_tenant_weights(text: str) -> dict[str, float]:
    """`--tenant-weights dev=3,batch=1` -> {"dev": 3.0, "batch": 1.0}; '' -> {} (every tenant 1)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            w = float(value) if sep and name.strip() else float("nan")
        except ValueError:
            w = float("nan")
        if not w > 0:
            raise ValueError(f"--tenant-weights: expected TENANT=WEIGHT (> 0) items separated by commas, got {part!r}")
        out[name.strip()] = w
    return out


def service_level(service: float, quantum: float = SERVICE_QUANTUM_S) -> float:
    """Attained service rounded down to a level: 0 below `quantum`, then quantum x 2^k (Tiresias's
    discretised LAS). Programs of like size share a level and go FCFS among themselves (the aging
    term orders them by arrival); only a program that has had twice as much service as another
    falls behind it. Never above the service itself, so the overtaking bound of the module
    docstring holds as it is."""
    if service < quantum:
        return 0.0
    return quantum * 2.0 ** math.floor(math.log2(service / quantum))


def tenant_excess(service: dict[str, float], weights: dict[str, float], tenant: str) -> float:
    """A tenant's share of the service given so far minus its weighted fair share among the
    tenants seen (weight 1 unless the trace header's `tenant_weights` says otherwise)."""
    total = sum(service.values())
    if total <= 0:
        return 0.0
    w = sum(weights.get(t, 1.0) for t in service)
    return service.get(tenant, 0.0) / total - weights.get(tenant, 1.0) / w


def overtaking_window_s(service: float, aging: float = AGING, starve_s: float = STARVE_S,
                        starve_ratio: float = STARVE_RATIO) -> float:
    """How much later than a call another may arrive and still start before it (module docstring)."""
    level = service_level(service)
    return min(starve_s + starve_ratio * level, (level + URGENCY_CAP_S + 2 * TENANT_SCALE_S) / aging)
