import pytest

from statebudget.cli import render


def _oracle_out(p95: float) -> dict:
    return {"oracle": {"bound": 1.0, "status": "OPTIMAL", "objective": 1.0, "gap": 0.0, "solve_s": 0.1},
            "windows": [], "waits": 0, "calls": 3, "trace_calls": 3, "handoff_stall_s": {"p95": p95},
            "handoffs": 2, "greedy_vs_oracle": None, "violations": []}


@pytest.mark.parametrize("p95", [-0.0, -1e-12, 0.0])
def test_the_oracle_line_never_prints_a_negative_stall(p95, capsys):
    render.print_oracle(_oracle_out(p95))
    line = capsys.readouterr().out
    assert "handoff stall p95 0.000 s over 2 handoffs" in line and "-0.000" not in line


def test_the_oracle_line_prints_a_positive_stall_as_it_is(capsys):
    render.print_oracle(_oracle_out(1.25))
    assert "handoff stall p95 1.250 s over 2 handoffs" in capsys.readouterr().out
