"""Measure THIS machine's data paths and prefill rate into a profile the cost model reads
(`CostModel(profile=...)`, the `--profile` options), instead of the cluster file's nominal figures.

What is measured, each the median of `repeats` probes of `size_mb` MiB of pseudo-random bytes:

    host_to_file    a fresh safetensors file written and fsync'ed          -> nvme_w:<node>
    file_to_host    that file read back into host memory (pinned with      -> nvme_r:<node>
                    CUDA) through a memory map. The page cache cannot be
                    dropped without root, so this is mostly the page
                    cache's speed, an upper bound on the disk's.
    host_to_device  pinned host -> GPU (`.to('cuda', non_blocking=True)`,  -> h2d:<gpu>
                    then synchronize); without a GPU, host -> a fresh RAM
                    buffer, which is what the local adapter's arena does
    device_to_host  GPU -> pinned host (copy_ + synchronize); without a    -> d2h:<gpu>
                    GPU, a RAM copy as above
    (root complex)  root:<node> = the node's best per-GPU figure x its GPU count: one transfer at a
                    time cannot show the root complex's shared limit, so the profile assumes it does
                    not bind and the per-GPU links do
    prefill         tokens/s of a small random-weight transformer (`torch.nn.TransformerEncoder`,
                    d_model 256, 2 layers, 1 x 512 tokens, fp32, `torch.inference_mode()`), on the
                    GPU when there is one

Every node and GPU of the given cluster gets these figures (the profile describes a cluster built
of machines like this one); with several CUDA devices, cluster GPU i gets local device i mod n.
Per-model prefill rates (with a catalog) scale the small model's rate by parameters:
`tok/s(model) = tok/s(small) x params(small) / active_params(model) x tp`, i.e. the FLOP/s the small
model reaches, spread over the model's tensor-parallel GPUs. A rough figure: a small model uses a
GPU less well than a large one (pessimistic there), and attention's share is ignored.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ...models.catalog import Catalog
from ...models.cluster import GB, Cluster
from ...models.errors import InputError
from .files import make_bytes, read_safetensors, write_safetensors

PROFILE_FORMAT = 1
MiB = 1 << 20
WORD_ALIGN = 8  # probe sizes are whole 8-byte words
PREFILL_TOKENS, PREFILL_D_MODEL, PREFILL_LAYERS = 512, 256, 2


def nominal_links(cluster: Cluster) -> dict[str, float]:
    """Every link of `cluster` with its bytes/s from the cluster file (the names CostModel uses)."""
    bw: dict[str, float] = {}
    for n in cluster.nodes:
        bw[f"nvme_r:{n.name}"] = n.nvme_read_gbps * GB
        bw[f"nvme_w:{n.name}"] = n.nvme_write_gbps * GB
        bw[f"root:{n.name}"] = n.root_gbps * GB
    for g in cluster.gpus:
        k = cluster.gpu_kinds[g.kind]
        bw[f"h2d:{g.id}"] = k.h2d_gbps * GB
        bw[f"d2h:{g.id}"] = k.d2h_gbps * GB
    return bw


def _timed(fn, cuda_device: int | None = None) -> float:
    t0 = time.perf_counter()
    fn()
    if cuda_device is not None:
        torch.cuda.synchronize(cuda_device)
    return max(time.perf_counter() - t0, 1e-9)


def measure_prefill(device: str = "cpu", repeats: int = 3) -> tuple[float, int]:
    """(tokens/s, parameters) of the small transformer's prefill of 1 x 512 tokens."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(PREFILL_D_MODEL, nhead=4, dim_feedforward=4 * PREFILL_D_MODEL,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, PREFILL_LAYERS, enable_nested_tensor=False).to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(1, PREFILL_TOKENS, PREFILL_D_MODEL, device=device)
    sync = (torch.device(device).index or 0) if device.startswith("cuda") else None
    with torch.inference_mode():
        model(x)  # warm-up: kernels, allocator
        times = [_timed(lambda: model(x), sync) for _ in range(max(repeats, 3))]
    return PREFILL_TOKENS / statistics.median(times), params


def measure_profile(cluster: Cluster, size_mb: float = 256, repeats: int = 3,
                    progress: Callable[[str, int, int], None] | None = None, catalog: Catalog | None = None,
                    workdir: str | Path | None = None, use_cuda: bool | None = None) -> dict:
    """Measure this machine (see the module docstring) and return the profile dict:
    `{"statebudget_profile": 1, "machine", "measured", "links", "prefill_tok_s"}`.
    `progress(step, done, total)` is called after each probe; files go to a temporary folder
    under `workdir` (default: the system's)."""
    if size_mb <= 0 or repeats < 1:
        raise ValueError(f"size_mb must be positive and repeats at least 1 (got {size_mb}, {repeats})")
    cuda = torch.cuda.is_available() if use_cuda is None else use_cuda
    n = max(WORD_ALIGN, int(size_mb * MiB) // WORD_ALIGN * WORD_ALIGN)
    devices = list(range(torch.cuda.device_count())) if cuda else [None]
    total = 2 * repeats + 2 * repeats * len(devices) + 1
    done = 0

    def tick(step: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(step, done, total)

    data = make_bytes(("statebudget-profile",), n)  # incompressible
    if cuda:
        data = data.pin_memory()

    # files: write (fsync'ed), then read back through a memory map into host memory
    writes, reads = [], []
    with tempfile.TemporaryDirectory(prefix="statebudget-profile-", dir=workdir) as d:
        for r in range(repeats):
            path = Path(d) / f"probe{r}.safetensors"
            writes.append(_timed(lambda: write_safetensors(path, data, {}, fsync=True)))
            tick("host -> file")
            host = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
            reads.append(_timed(lambda: host.copy_(read_safetensors(path)[0])))
            tick("file -> host")
            path.unlink()

    # host <-> device
    per_device = []
    for dev in devices:
        h2d, d2h = [], []
        if dev is None:  # the arena: a fresh RAM buffer each time, as the local adapter allocates it
            for _ in range(repeats):
                arena = torch.empty(n, dtype=torch.uint8)
                h2d.append(_timed(lambda: torch.empty(n, dtype=torch.uint8).copy_(data)))
                tick("host -> device")
                arena.copy_(data)
                d2h.append(_timed(lambda: torch.empty(n, dtype=torch.uint8).copy_(arena)))
                tick("device -> host")
        else:
            target = f"cuda:{dev}"
            data.to(target, non_blocking=True)  # warm-up: context, allocator
            torch.cuda.synchronize(dev)
            back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            on_device: list[torch.Tensor] = []
            for _ in range(repeats):
                on_device.clear()
                h2d.append(_timed(lambda: on_device.append(data.to(target, non_blocking=True)), dev))
                tick("host -> device")
                d2h.append(_timed(lambda: back.copy_(on_device[0], non_blocking=True), dev))
                tick("device -> host")
        per_device.append({"device": "arena" if dev is None else f"cuda:{dev}",
                           "h2d_Bps": n / statistics.median(h2d), "d2h_Bps": n / statistics.median(d2h)})

    prefill_device = "cuda:0" if cuda else "cpu"
    tok_s, params = measure_prefill(prefill_device, repeats)
    tick("prefill")

    measured = {
        "file_to_host_Bps": n / statistics.median(reads),
        "host_to_device_Bps": per_device[0]["h2d_Bps"],
        "device_to_host_Bps": per_device[0]["d2h_Bps"],
        "host_to_file_Bps": n / statistics.median(writes),
        "prefill_tok_s_small": tok_s,
        "small_model_params": params,
        "devices": per_device,
    }
    links: dict[str, float] = {}
    for node in cluster.nodes:
        links[f"nvme_r:{node.name}"] = measured["file_to_host_Bps"]
        links[f"nvme_w:{node.name}"] = measured["host_to_file_Bps"]
    for g in cluster.gpus:
        dev = per_device[g.index % len(per_device)]
        links[f"h2d:{g.id}"] = dev["h2d_Bps"]
        links[f"d2h:{g.id}"] = dev["d2h_Bps"]
    for node in cluster.nodes:
        ids = [g.id for g in cluster.gpus if g.node == node.name]
        best = max((max(links[f"h2d:{i}"], links[f"d2h:{i}"]) for i in ids), default=per_device[0]["h2d_Bps"])
        links[f"root:{node.name}"] = best * max(1, len(ids))

    out = {
        "statebudget_profile": PROFILE_FORMAT,
        "cluster": cluster.name,
        "machine": {
            "hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": "cuda" if cuda else "arena",
            "gpus": [torch.cuda.get_device_name(d) for d in devices if d is not None],
            "size_mb": n / MiB, "repeats": repeats,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "measured": measured,
        "links": links,
        "prefill_tok_s": {},
    }
    if catalog is not None:
        out["catalog"] = catalog.name
        out["prefill_tok_s"] = {m.name: tok_s * params / (m.active_params_b * 1e9) * m.tp for m in catalog.models}
    return out



def _positive_figures(table, source: str, section: str) -> None:
    if not isinstance(table, dict):
        raise InputError(source, section, f"expected a mapping of name -> number, got {type(table).__name__}")
    for name, v in table.items():
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if not ok:
            unit = "bytes/s" if section == "links" else "tokens/s"
            raise InputError(source, f"{section}.{name}", f"must be a positive number of {unit}, got {v!r}")


def load_profile(path: str | Path, cluster: Cluster | None = None) -> dict:
    """Read a profile written by `statebudget profile`, checked: a JSON object with
    `statebudget_profile: 1`, `links` (positive bytes/s) and optional `prefill_tok_s` (positive
    tokens/s). With `cluster`, every link named must be one of its links (a profile measured for
    another cluster would otherwise be silently ignored)."""
    p = Path(path)
    source = str(p)
    if not p.is_file():
        raise InputError(source, "", "no such profile file (write one with `statebudget profile`)")
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise InputError(source, "", f"cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = f"{e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise InputError(source, line, f"not JSON: {getattr(e, 'msg', e)}") from None
    if not isinstance(data, dict):
        raise InputError(source, "", "expected a JSON object at the top level")
    if "statebudget_profile" not in data:
        raise InputError(source, "", "missing key 'statebudget_profile' (not a file written by `statebudget profile`?)")
    if data["statebudget_profile"] != PROFILE_FORMAT:
        raise InputError(source, "statebudget_profile",
                         f"unsupported profile format {data['statebudget_profile']!r} (this reads {PROFILE_FORMAT})")
    if "links" not in data:
        raise InputError(source, "", "missing key 'links'")
    _positive_figures(data["links"], source, "links")
    _positive_figures(data.setdefault("prefill_tok_s", {}), source, "prefill_tok_s")
    if cluster is not None:
        known = nominal_links(cluster)
        for name in data["links"]:
            if name not in known:
                raise InputError(source, f"links.{name}",
                                 f"no such link in cluster {cluster.name!r} (the profile was measured for "
                                 f"{data.get('cluster', 'another cluster')!r}; links look like {next(iter(known))})")
    return data
