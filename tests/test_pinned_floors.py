"""The block floors of a question pinning one flag, taken from the unpinned space's tensors
(solver.search.cpsat.block_floors.PinnedFloors, what `mapsat explain` ranks blocks by), equal
block_lower_bounds computed anew for the pinned space, exactly, and rank the blocks in the same
order, for every value of every flag the floors read, on small spaces: with offload, with FP8,
and with blocks of several kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

import solver.search.cpsat.block_floors as block_floors
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.mamba import MambaShape
from costmodel.inputs.system import Datatype
from solver.search.explain import FLOOR_FLAGS, Explorer, _value_of
from solver.search.solve import SolverConfig
from solver.space.count import count_mappings
from solver.space.declaration import get_space
from solver.space.pins import pinned

ROOT = Path(__file__).resolve().parents[1]
A100 = load_system(ROOT / "problems/systems/a100-80g-selene.yaml")
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
MODEL = Model(name="m", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=16)
HYBRID = Model(name="hybrid", hidden=1024, feedforward=4096, seq_size=2048, attn_heads=8, kv_heads=8, attn_size=128,
               num_blocks=8, layer_pattern="M*-EM*-E", norm="rmsnorm", position="none", bias=False, dropout=False,
               mlp="squared_relu", mamba=MambaShape(heads=32, head_dim=64, state_size=64, groups=4),
               num_experts=8, experts_per_token=2, expert_feedforward=1024, vocab_size=32000)

CASES = [
    ("a100-offload", MODEL, A100.with_overrides(offload_gib=128, offload_gbps=50), 16, 64, Datatype.bfloat16, "full"),
    ("h100-fp8-calculon", MODEL, H100, 32, 128, Datatype.float8, "calculon-2023"),
    ("hybrid-kinds", HYBRID, H100, 16, 64, Datatype.bfloat16, "full"),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_pinned_floors_equal_the_pinned_space_computed_anew(case, monkeypatch):
    _, model, system, gpus, cap, datatype, space_name = case
    space = get_space(space_name)
    explorer = Explorer(model, system, gpus, cap, datatype, space, Kernels(), SolverConfig())
    args = (explorer.tables, explorer.c, space, explorer.plan.skeletons, explorer.local_batch,
            explorer.c.memory.offload_capacity_bytes > 0, len(system.networks), explorer.c.memory.hbm_capacity_bytes)
    memo = block_floors.PinnedFloors(*args)
    counted = count_mappings(model, system, gpus, cap, space)
    anew = block_floors.block_lower_bounds
    pins = [(name, _value_of(name, label)) for name in FLOOR_FLAGS for label in counted.by_dimension.get(name, {})]
    assert len(pins) > len(FLOOR_FLAGS)
    for name, value in pins:
        narrowed = pinned(space, ((name, (value,)),))
        expected = anew(*args[:2], narrowed, *args[3:])
        with monkeypatch.context() as patch:             # the memo's answer, not a fallback to computing anew
            patch.setattr(block_floors, "block_lower_bounds", None)
            floors, ranked = memo.of(narrowed), memo.ranked(narrowed)
        assert list(floors) == list(expected), (name, value)
        assert floors == expected, (name, value)
        assert ranked == block_floors.ranking(expected), (name, value)
