"""Domain schema only (pydantic): validation, no behaviour."""

from .catalog import Catalog, ModelSpec, MoESpec
from .cluster import GB, Cluster, Gpu, GpuKind, Node
from .errors import InputError
from .plan import Op, Plan
from .report import Dist, PolicyReport, Report
from .trace import Cancel, Hint, Program, Trace, TraceHeader, TraceNode

__all__ = ["Catalog", "ModelSpec", "MoESpec", "GB", "Cluster", "Gpu", "GpuKind", "Node", "InputError",
           "Op", "Plan", "Dist", "PolicyReport", "Report", "Cancel", "Hint", "Program", "Trace",
           "TraceHeader", "TraceNode"]
