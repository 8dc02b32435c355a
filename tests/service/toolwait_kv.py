"""What the service's tool-wait KV tests share: the toy planner's KV after one call, a live
planner on a fake clock with one tool-wait rule, and the events that start a tool."""

from tests.helpers import Clock, report_op
from statebudget.models.load import load_catalog, load_cluster
from statebudget.planner.config import lease_config
from statebudget.service.live import LivePlanner
from statebudget.core.waits import ToolWaitModel

KV = ("kv", "p1", "planner")
TOKENS = 20_000
KV_BYTES = TOKENS * 4096  # the toy planner's KV


# The tool-wait rule alone: the planner's own speculative promotes (a program's KV prepared on
# another group) would add ops these tests do not count.
NO_SPECULATION = lease_config(promote_min_p=1.01)


def planner(rule, waits=None):
    clock = Clock()
    p = LivePlanner(load_cluster("toy2"), load_catalog("toy"), clock=clock, kv_rule=rule, config=NO_SPECULATION)
    if waits is not None:
        p.kvw.waits = ToolWaitModel(waits)
    return p, clock


def kv_ops(p):
    return [r for r in p.ops.values() if tuple(r.op.object) == KV]


def after_a_call(p, clock, tokens=TOKENS, prog="p1"):
    """`prog` ran one planner call whose KV stays in HBM; the engine reported every op it was given."""
    p.event("a", {"type": "program_started", "program": prog})
    p.event("a", {"type": "call_arrived", "program": prog, "call": "c1", "model": "planner"})
    p.event("a", {"type": "call_started", "program": prog, "call": "c1"})
    clock.t = 1.0
    p.event("a", {"type": "call_finished", "program": prog, "call": "c1", "tokens": tokens})
    for rec in list(p.ops.values()):
        report_op(p, rec.op)
    (group,) = p.tiers.groups_of[("kv", prog, "planner")]
    assert p.tiers.gpu[(("kv", prog, "planner"), group)].ready
    return group


def start_tool(p, tool_name="build", tid="t1", prog="p1"):
    p.event("a", {"type": "tool_started", "program": prog, "tool": tool_name, "call": tid})
