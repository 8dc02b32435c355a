"""Engine adapters: the processes beside an engine that poll the planner's plan, execute its ops
and report them (DESIGN.md §7). One protocol (`base.Adapter`), one registry keyed by kind."""


def adapter_class(kind: str):
    """The adapter class for `kind`: local, vllm, sglang or lmcache (imported on demand: the local
    data plane needs torch, the HTTP adapters only httpx)."""
    import importlib

    names = {"local": ("local", "LocalAdapter"), "vllm": ("vllm", "VllmAdapter"),
             "sglang": ("sglang", "SglangAdapter"), "lmcache": ("lmcache", "LMCacheAdapter")}
    if kind not in names:
        raise ValueError(f"unknown adapter kind {kind!r}; known: {', '.join(names)}")
    module, cls = names[kind]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
