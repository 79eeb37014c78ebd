"""The attention core with grouped key/value heads against causal attention measured on an
H100 (problems/measurements/h100-sxm-80g-gqa-attention.json, provenance inside).

Measured, grouping the key/value heads (8 for 32 query heads) leaves the fused kernel's
forward time within 0.5-1.5 % of multi-head attention's: its work follows the query heads,
and K and V are a small part of its traffic. The cost model's treatment — FLOP by query
heads, K/V bytes by key/value heads — must show the same.
"""

import json
from pathlib import Path

import pytest

from costmodel.terms.block import block_forward_times
from costmodel.terms.context import Context
from costmodel.evaluate import _scalar_fields
from costmodel.inputs.load import load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.inputs.system import Datatype

ROOT = Path(__file__).resolve().parents[1]
POINTS = json.loads((ROOT / "problems/measurements/h100-sxm-80g-gqa-attention.json").read_text())["points"]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")


def core_forward_s(point: dict, kv_heads: int) -> float:
    """The modelled fused attention core's forward time for a measured shape."""
    heads, head_dim, batch = point["heads"], point["head_dim"], point["batch"]
    model = Model(hidden=heads * head_dim, feedforward=4 * heads * head_dim, seq_size=point["seq"],
                  attn_heads=heads, attn_size=head_dim, num_blocks=1, kv_heads=kv_heads)
    c = Context.build(model, H100, Datatype.bfloat16)
    m = _scalar_fields(Mapping(num_procs=1, tensor_par=1, pipeline_par=1, data_par=1, batch_size=batch,
                               microbatch_size=batch))
    return block_forward_times(c, m, ScalarOps).attention_core_s


def pairs():
    mha = {(p["seq"], p["heads"]): p for p in POINTS if p["heads"] == p["kv_heads"]}
    return [(p, mha[(p["seq"], p["heads"])]) for p in POINTS
            if p["kv_heads"] < p["heads"] and (p["seq"], p["heads"]) in mha]


@pytest.mark.parametrize("gqa, mha", pairs(), ids=lambda p: f"s{p['seq']}-a{p['heads']}-g{p['kv_heads']}")
def test_grouping_key_value_heads_changes_the_attention_core_as_little_as_measured(gqa, mha):
    measured = gqa["fwd_ms"] / mha["fwd_ms"]
    modelled = core_forward_s(gqa, gqa["kv_heads"]) / core_forward_s(mha, mha["kv_heads"])
    assert 0.98 <= measured <= 1.0
    assert modelled <= 1.0
    assert modelled == pytest.approx(measured, abs=0.02)
