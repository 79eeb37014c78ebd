"""A layer pattern in the search: a block's cost is the sum of its own layers' records (a
Mamba-2 layer's LayerCost and stored bytes), the closed-form count equals the enumeration and
CP-SAT's count with a pattern, solve equals brute force on a small hybrid space, the degrees
Megatron-Core allows a Mamba layer, and `mapsat solve` certifies Nemotron 3 Nano on 64 H100s
and Nemotron-H 56B on 512 (8K tokens)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import cp_sat_solution_count, plain, solve_equals_brute_force
from ortools.sat.python import cp_model

from costmodel.terms.context import Context
from costmodel.evaluate import evaluate_arrays
from costmodel.inputs.load import load_system
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.inputs.system import Datatype
from costmodel.terms.block import block_forward_times
from costmodel.inputs.mamba import MambaShape, mamba_scan_flops_per_token
from solver.cli.app import cli
from solver.search.cpsat.constraints import STRUCTURE, Problem
from solver.search.cpsat.variables import Variables
from solver.space.count import count_mappings
from solver.space.declaration import get_space, skeletons
from solver.space.enumerate import enumerate_all

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
HYBRID = Model(name="hybrid", hidden=1024, feedforward=4096, seq_size=2048, attn_heads=8, kv_heads=8, attn_size=128,
               num_blocks=8, layer_pattern="M*-EM*-E", norm="rmsnorm", position="none", bias=False, dropout=False,
               mlp="squared_relu", mamba=MambaShape(heads=32, head_dim=64, state_size=64, groups=4),
               num_experts=8, experts_per_token=2, expert_feedforward=1024, vocab_size=32000)


def _view(tp=1, microbatch=1):
    from types import SimpleNamespace
    return SimpleNamespace(tp=tp, cp=1, ep=1, etp=1, microbatch=microbatch, seq_par=False, cp_comm_a2a=False,
                           recompute_modules=None)


def test_a_mamba_block_is_the_sum_of_its_layers():
    c = Context.of(HYBRID, H100, Datatype.bfloat16)
    block = block_forward_times(c, _view(tp=2), ScalarOps, "mamba")
    assert [layer.name for layer in block.layers] == ["norm", "mamba", "residual"]
    assert block.forward_s == pytest.approx(sum(layer.forward_s for layer in block.layers), rel=1e-12)
    mamba = block.layers[1]
    # its matrix FLOPs: both projections and the scan, split tp ways (2048 tokens)
    shape, h, tokens = HYBRID.mamba, 1024, 2048
    expected = (2 * tokens * h * (shape.in_proj_cols + shape.inner) + tokens * mamba_scan_flops_per_token(shape, 2048)) / 2
    assert mamba.matrix_flops == pytest.approx(expected, rel=1e-12)
    assert mamba.backward_s == pytest.approx(2 * mamba.forward_s, rel=1e-12)


def test_pattern_context_counts_each_kind():
    c = Context.of(HYBRID, H100, Datatype.bfloat16)
    assert dict(c.model.block_kinds) == {"mamba": 2.0, "attention_layer": 2.0, "mlp_layer": 2.0, "moe_layer": 2.0}
    params = dict(c.model.kind_params)
    assert params["mamba"] == HYBRID.pattern_layer_params("M") and c.model.moe_block_params == HYBRID.pattern_layer_params("E")
    assert sum(count * (params.get(kind) or c.model.moe_block_params) for kind, count in c.model.block_kinds) \
        + HYBRID.embedding_params + HYBRID.output_params == HYBRID.total_params


@pytest.mark.slow      # CP-SAT enumerates every solution: minutes on 2 shared cores
def test_count_equals_enumeration_and_cp_sat_with_a_pattern():
    space = plain(get_space("full"))
    system = H100.with_overrides(offload_gib=64, offload_gbps=50)
    counted = count_mappings(HYBRID, system, 4, 8, space)
    everything = enumerate_all(HYBRID, system, 4, 8, space)
    assert counted.mappings == len(everything) > 0
    assert set(np.unique(everything.columns["cp"]).tolist()) == {1}        # cp > 1 refused with a pattern
    m = cp_model.CpModel()
    v = Variables(m, space, skeletons(HYBRID, 4, 8, space), 4, len(system.networks))
    for constraint in STRUCTURE:
        constraint.add(m, v, Problem(HYBRID, system, 4, 8, space))
    assert cp_sat_solution_count(m) == counted.mappings


def test_solve_equals_brute_force_on_a_small_hybrid_space():
    system = H100.with_overrides(hbm_gib=6, nvlink_size=2)
    solve_equals_brute_force(HYBRID, system, 4, 8, plain(get_space("full")), Datatype.bfloat16, Kernels(), top_k=3)


def test_mamba_heads_and_groups_bound_tp():
    space = plain(get_space("full"))
    narrow = HYBRID.model_copy(update={"mamba": MambaShape(heads=32, head_dim=64, state_size=64, groups=2)})
    everything = enumerate_all(narrow, H100, 8, 8, space)
    assert set(np.unique(everything.columns["tp"]).tolist()) == {1, 2}     # tp divides 2 groups


def test_a_pattern_evaluates_vector_as_scalar():
    arrays = enumerate_all(HYBRID, H100, 4, 8, plain(get_space("full")))
    result = evaluate_arrays(HYBRID, H100, arrays, Datatype.bfloat16)
    assert np.isfinite(result.iteration_time_s).all() and result.feasible.any()


@pytest.mark.parametrize("name,gpus", [("nemotron-3-nano-30b-a3b", 64), ("nemotron-h-56b", 512)])
def test_solve_certifies_the_hybrid_models(name, gpus):
    out = CliRunner().invoke(cli, ["solve", "--model", str(ROOT / f"problems/models/{name}/config.json"),
                                   "--seq-size", "8192", "--system", str(ROOT / "problems/systems/h100-80g-nvl8.yaml"),
                                   "--gpus", str(gpus), "--datatype", "bfloat16", "--json"])
    assert out.exit_code == 0, out.output
    assert '"certified_optimal": true' in out.output
