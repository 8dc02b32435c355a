"""Chaos on the live stack (`statebudget serve`, two `adapter local` processes, the runtime driver):
an adapter SIGKILLed with ops in flight and started again, an engine losing its GPU memory
(SIGUSR1 to the local adapter), and the server SIGKILLed three times under drive. After each, the
invariants: the books equal the adapters' inventories, no acknowledged event or op is lost, no op
is executed twice, and an idle planner plans nothing (no failure loop)."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from statebudget.api.driver import Driver
from statebudget.models.load import parse_trace
from tests.helpers import toy_trace_jsonl, wait_until
from tests.test_e2e_service import TOKENS, Stack, _check_books

pytestmark = pytest.mark.xdist_group("e2e")


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path)
    yield s
    s.stop()


class AckDriver(Driver):
    """The driver, recording each event the planner acknowledged (200)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.acked: list[dict] = []

    async def _event(self, client, **body):
        out = await super()._event(client, **body)
        if out is not None:
            self.acked.append(body)
        return out


def start_adapter(stack: Stack, node: str):
    stack.adapters.append(stack.cli("adapter", "local", "--planner", stack.url, "--node", node,
                                    "--root", str(stack.tmp / "data"), "--arena-mb", "400",
                                    "--inventory", str(stack.tmp / f"inv-{node}.json"), "--catalog", "toy",
                                    "--wait-s", "1", "--log-level", "warning", log=f"adapter-{node}.log",
                                    token=TOKENS[node]))
    wait_until(lambda: (stack.tmp / f"inv-{node}.json").exists(), 120, f"adapter {node} to poll")
    return stack.adapters[-1]


def settled(stack: Stack) -> None:
    """Wait until no op is open and the adapters' inventories (written after each poll) agree
    with the books; fail with the last disagreement if they never do."""
    last = []

    def agree():
        if stack.admin("/v1/residency")["open_ops"]:
            return False
        try:
            _check_books(stack)
        except AssertionError as e:
            last[:] = [str(e)]
            return False
        return True
    try:
        wait_until(agree, 90, "no open op and books equal to the adapters' inventories")
    except AssertionError:
        raise AssertionError(last[0] if last else "open ops never drained") from None


def decisions(stack: Stack) -> float:
    text = httpx.get(stack.url + "/metrics", headers={"Authorization": f"Bearer {TOKENS['admin']}"}, timeout=10).text
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "statebudget_decisions")
    return next(s.value for s in fam.samples if s.name.endswith("_total"))


def assert_no_failure_loop(stack: Stack) -> None:
    """Over the next six planning steps of an idle planner, no op is made."""
    ops = stack.ledger("SELECT COUNT(*) FROM ops")[0][0]
    d0 = decisions(stack)
    wait_until(lambda: decisions(stack) >= d0 + 6, 30, "six planning steps")
    assert stack.ledger("SELECT COUNT(*) FROM ops")[0][0] == ops, stack.ledger(
        "SELECT op_id, status, reason FROM ops ORDER BY rowid DESC LIMIT 5")


def test_an_adapter_killed_mid_op_and_restarted_leaves_books_equal_to_what_it_holds(stack):
    stack.start_server()
    stack.start_adapters()
    trace = parse_trace(toy_trace_jsonl(seed=6, hours=0.04), "toy trace")
    driver = Driver(stack.url, TOKENS["runtime"], speed=30.0, call_s=0.02)

    async def run():
        replay = asyncio.create_task(driver.replay(trace))
        await asyncio.to_thread(wait_until, lambda: stack.ledger(
            "SELECT COUNT(*) FROM ops WHERE node = 'n0' AND status = 'done'")[0][0] >= 3, 120, "n0 to run some ops")
        n0 = stack.adapters[0]
        n0.send_signal(signal.SIGKILL)
        n0.wait()
        before = stack.inventory("n0")
        (stack.tmp / "inv-n0.json").unlink()
        await asyncio.to_thread(start_adapter, stack, "n0")
        await replay
        return before

    before = asyncio.run(run())
    assert driver.errors == [], driver.errors
    settled(stack)  # books == inventories, one content per object, no op executed twice by one process
    again = set(before["executed"]) & set(stack.inventory("n0")["executed"])
    assert not again, f"ops executed by the killed adapter and again by the new one: {sorted(again)}"
    closed = stack.ledger("SELECT COUNT(*) FROM ops WHERE status = 'failed' AND reason LIKE '%inventory%'")[0][0]
    failed = stack.ledger("SELECT COUNT(*) FROM ops WHERE status = 'failed'")[0][0]
    assert failed == closed  # the only failures: the ops the restart closed, none looping after
    assert_no_failure_loop(stack)


def test_an_engine_that_loses_its_gpu_memory_is_reconciled(stack):
    stack.start_server()
    stack.start_adapters()
    trace = parse_trace(toy_trace_jsonl(seed=7, hours=0.04), "toy trace")
    driver = Driver(stack.url, TOKENS["runtime"], speed=30.0, call_s=0.02)

    def holds_hbm():
        return any(c["tier"].startswith("gpu:") for c in stack.inventory("n0")["copies"])

    async def run():
        replay = asyncio.create_task(driver.replay(trace))
        await asyncio.to_thread(wait_until, holds_hbm, 120, "n0 to hold copies in HBM")
        stack.adapters[0].send_signal(signal.SIGUSR1)
        await asyncio.to_thread(wait_until, lambda: "copies in HBM lost" in (stack.tmp / "adapter-n0.log").read_text(),
                                30, "the engine crash")
        await replay

    asyncio.run(run())
    log = (stack.tmp / "adapter-n0.log").read_text()
    lost = int(log.split("SIGUSR1: ", 1)[1].split(" ", 1)[0])
    assert lost > 0, log[-2000:]
    settled(stack)  # the planner no longer counts the lost copies as ready in n0's HBM
    assert driver.errors == [], driver.errors
    assert_no_failure_loop(stack)


def test_the_server_killed_three_times_under_drive_loses_no_acknowledged_event(stack):
    stack.start_server()
    stack.start_adapters()
    trace = parse_trace(toy_trace_jsonl(seed=8, hours=0.05), "toy trace")
    driver = AckDriver(stack.url, TOKENS["runtime"], speed=30.0, call_s=0.02, retry_s=90)

    async def run():
        replay = asyncio.create_task(driver.replay(trace))
        for k in range(3):
            await asyncio.to_thread(wait_until, lambda: len(driver.acked) >= 30 * (k + 1), 120, f"events before kill {k}")
            await asyncio.to_thread(stack.kill_server)
        await replay

    asyncio.run(run())
    assert driver.errors == [], driver.errors
    settled(stack)
    programs = {json.loads(b)["program"]: json.loads(b) for (b,) in stack.ledger("SELECT body FROM programs")}
    for ev in driver.acked:  # every acknowledged event's effect is in the ledger
        rec = programs[ev["program"]]
        if ev["type"] == "program_finished":
            assert rec["status"] == "finished", ev
        elif ev["type"] == "call_finished":
            assert rec["calls"][ev["call"]]["status"] == "finished", ev
        elif ev["type"] == "call_arrived":
            assert ev["call"] in rec["calls"], ev
    assert_no_failure_loop(stack)
