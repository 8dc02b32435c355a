"""StateBudget: decides where LLM serving state (weights, KV, MoE expert pages) lives across
GPU HBM, host DRAM and NVMe on a small heterogeneous cluster, and measures it."""

__version__ = "0.1.0"
