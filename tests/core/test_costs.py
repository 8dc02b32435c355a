"""The cost model's prefill and decode take arrays (the simulator re-reads a queue's runs in one
pass, `sim/waiting.py`): each element must be exactly what the scalar call gives, zero and negative
token counts and measured prefill rates included."""

import numpy as np
import pytest

from statebudget.core.costs import CostModel
from statebudget.models.load import load_catalog, load_cluster


@pytest.mark.parametrize("measured", [False, True])
def test_array_prefill_and_decode_are_the_scalar_ones(measured):
    cl, cat = load_cluster("hetero16"), load_catalog("agent-team")
    m = cat.models[0]
    cost = CostModel(cl, cat, profile={"prefill_tok_s": {m.name: 12_345.0}} if measured else None)
    tokens = np.array([-5.0, 0.0, 1.0, 333.0, 8191.0, 120_000.0])
    outs = np.array([0.0, -1.0, 7.0, 250.0, 1024.0, 4096.0])
    for group in ((0,), tuple(range(4))):
        pre = cost.prefill_s(m, tokens, group)
        dec = cost.decode_s(m, outs, tokens, group)
        assert pre.tolist() == [cost.prefill_s(m, float(t), group) for t in tokens]
        assert dec.tolist() == [cost.decode_s(m, float(o), float(t), group) for o, t in zip(outs, tokens)]
        assert pre[0] == pre[1] == dec[0] == dec[1] == 0.0 and pre[-1] > pre[-2] > 0
    # one group per element (a queue waiting on several groups): each element is its group's
    groups = [(0,), tuple(range(4)), (12,), (0,), (8, 9), tuple(range(4))]
    pre = cost.prefill_s(m, tokens, groups)
    dec = cost.decode_s(m, outs, tokens, groups)
    assert pre.tolist() == [cost.prefill_s(m, float(t), g) for t, g in zip(tokens, groups)]
    assert dec.tolist() == [cost.decode_s(m, float(o), float(t), g) for o, t, g in zip(outs, tokens, groups)]
