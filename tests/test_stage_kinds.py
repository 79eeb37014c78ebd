"""A pipeline stage is the sum of its own blocks: each stage holds the kinds of block its
layout gives it (dense-first, moe_every, a layer pattern), its time and memory are the sums of
those blocks' per-kind costs (no model-wide mean block), the search stays exact over models
whose kinds spread unevenly over the stages (solve = brute force, certified; every block
floor below the exact time), and a model of one kind keeps every stage's block the kind's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import assert_block_floors_below_exact, plain, solve_equals_brute_force

from costmodel.evaluate import _scalar_fields, evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.mamba import MambaShape
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype
from costmodel.ops import ScalarOps
from costmodel.terms.block_terms import kind_block_terms
from costmodel.terms.context import Context
from costmodel.terms.iteration import iteration_terms, output_layer_s
from costmodel.terms.pipeline_time import Stages
from costmodel.terms.stage_costs import stage_blocks_terms
from costmodel.terms.stage_kinds import block_order, stage_kind_counts
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")

# 8 blocks, the first 3 dense (first_k_dense_replace): on 2 stages 3 dense + 1 MoE, then 4 MoE
DENSE_FIRST = Model(name="dense-first", hidden=512, feedforward=2048, seq_size=1024, attn_heads=8, kv_heads=8,
                    attn_size=64, num_blocks=8, vocab_size=32000, mlp="swiglu", norm="rmsnorm", position="rope",
                    bias=False, dropout=False, num_experts=8, experts_per_token=2, expert_feedforward=512,
                    first_dense_blocks=3)
# a pattern whose Mamba layers all fall on the first of 2 stages, the MLP and MoE on the second
HYBRID = Model(name="hybrid-uneven", hidden=1024, feedforward=4096, seq_size=2048, attn_heads=8, kv_heads=8,
               attn_size=128, num_blocks=8, layer_pattern="MMM*-E-E", norm="rmsnorm", position="none", bias=False,
               dropout=False, mlp="squared_relu", mamba=MambaShape(heads=32, head_dim=64, state_size=64, groups=4),
               num_experts=8, experts_per_token=2, expert_feedforward=1024, vocab_size=32000)
LLAMA_LIKE = Model(name="one-kind", hidden=512, feedforward=2048, seq_size=1024, attn_heads=8, kv_heads=8,
                   attn_size=64, num_blocks=8, vocab_size=32000, mlp="swiglu", norm="rmsnorm", position="rope",
                   bias=False, dropout=False)


def _mapping(model: Model, pp: int, interleaving: int = 1, **fields) -> Mapping:
    return Mapping(**{"num_procs": pp, "tensor_par": 1, "pipeline_par": pp, "data_par": 1, "batch_size": 8,
                      "microbatch_size": 1, "pipeline_interleaving": interleaving, "tensor_par_net": 0,
                      "pipeline_par_net": 0, "data_par_net": 0, "activation_recompute": "none",
                      **({"expert_par": 1, "expert_tensor_par": 1} if model.num_experts else {}), **fields})


def test_the_block_order_places_the_kinds():
    assert block_order(DENSE_FIRST) == ("dense",) * 3 + ("moe",) * 5
    every_other = DENSE_FIRST.model_copy(update={"first_dense_blocks": 0, "moe_every": 2})
    assert block_order(every_other) == ("dense", "moe") * 4          # blocks 2, 4, 6, 8 (from 1) have experts
    assert block_order(HYBRID) == ("mamba",) * 3 + ("attention_layer", "mlp_layer", "moe_layer",
                                                     "mlp_layer", "moe_layer")


def test_each_stage_counts_its_own_kinds():
    order = block_order(DENSE_FIRST)
    # 1F1B on 2 stages: blocks 0-3 and 4-7
    assert stage_kind_counts(order, ("dense", "moe"), 2, 1).tolist() == [[3, 1], [0, 4]]
    # interleaved, 2 chunks of 2: stage 0 holds blocks 0, 1, 4, 5 and stage 1 blocks 2, 3, 6, 7
    assert stage_kind_counts(order, ("dense", "moe"), 2, 2).tolist() == [[2, 2], [1, 3]]
    # 4 stages of 2, and a short last chunk: 8 blocks on 3 stages of ⌈8/3⌉ = 3 are 3, 3, 2
    assert stage_kind_counts(order, ("dense", "moe"), 4, 1).tolist() == [[2, 0], [1, 1], [0, 2], [0, 2]]
    assert stage_kind_counts(order, ("dense", "moe"), 3, 1).tolist() == [[3, 0], [0, 3], [0, 2]]


def _independent_stages(model: Model, mapping: Mapping, counts_by_stage: list[dict]):
    """Each stage's microbatch (forward + backward + recompute + exposed offload) and forward
    compute, summed here over its blocks from the per-kind block costs; the output layer on
    the last."""
    c = Context.build(model, H100, mapping.datatype, mapping.kernels)
    m = _scalar_fields(mapping)
    per_kind = dict(zip((kind for kind, _ in c.model.block_kinds), kind_block_terms(c, m, ScalarOps).terms))
    head = output_layer_s(c, m, ScalarOps)
    micro, forward = [], []
    for rank, counts in enumerate(counts_by_stage):
        blocks = [(per_kind[kind], n) for kind, n in counts.items()]
        micro.append(sum(n * (b.block_fwd_s + b.offload_fwd_s + b.block_bwd_s + b.recompute_s + b.offload_bwd_s)
                         for b, n in blocks) + (3 * head if rank == len(counts_by_stage) - 1 else 0.0))
        forward.append(sum(n * b.compute_fwd_s for b, n in blocks) + (head if rank == len(counts_by_stage) - 1
                                                                       else 0.0))
    return c, m, micro, forward


@pytest.mark.parametrize("model, counts_by_stage", [
    (DENSE_FIRST, [{"dense": 3, "moe": 1}, {"moe": 4}]),
    (HYBRID, [{"mamba": 3, "attention_layer": 1}, {"mlp_layer": 2, "moe_layer": 2}]),
], ids=["dense-first", "hybrid-pattern"])
def test_a_stage_is_the_sum_of_its_blocks(model, counts_by_stage):
    mapping = _mapping(model, pp=2)
    c, m, micro, forward = _independent_stages(model, mapping, counts_by_stage)
    terms = iteration_terms(c, m, ScalarOps)
    pace = max(range(2), key=lambda rank: (micro[rank], rank))         # the last on a tie
    n = 8                                                               # microbatches: batch 8 of 1
    assert terms.forward_s == pytest.approx(n * forward[pace], rel=1e-12)
    sends = terms.pp_comm_s / n
    # 1F1B, p = 2, n ≥ p: (p - 1) microbatches of the slowest stage in the bubble
    assert terms.bubble_s == pytest.approx(micro[pace] + sends, rel=1e-12)
    # the model-wide mean block times a stage's blocks is not what either stage takes
    mean = kind_block_terms(c, m, ScalarOps).mean
    mean_micro = 4 * (mean.block_fwd_s + mean.block_bwd_s + mean.recompute_s) + 3 * output_layer_s(c, m, ScalarOps)
    assert not math.isclose(mean_micro, max(micro), rel_tol=1e-3)


@pytest.mark.parametrize("model", [DENSE_FIRST, HYBRID], ids=["dense-first", "hybrid-pattern"])
def test_the_block_tables_mean_fields_are_the_mean_blocks(model):
    """The block grid mixes only the fields it reads of the mean block of several kinds
    (kind_floors.MEAN_FIELDS, kinds_mean): each equals the mean record's own, exactly."""
    from costmodel.terms.block_terms import kinds_mean
    from solver.search.cpsat.kind_floors import MEAN_FIELDS

    mapping = _mapping(model, pp=2)
    c = Context.build(model, H100, mapping.datatype, mapping.kernels)
    m = _scalar_fields(mapping)
    kinds = kind_block_terms(c, m, ScalarOps)
    assert len(kinds.terms) > 1 and kind_block_terms(c, m, ScalarOps, mean=False).mean is None
    for name in MEAN_FIELDS:
        assert kinds_mean(c, [getattr(blk, name) for blk in kinds.terms]) == getattr(kinds.mean, name), name
    assert len({blk.block_fwd_s for blk in kinds.terms}) > 1       # (the kinds differ)


def test_each_stage_holds_its_own_weights():
    mapping = _mapping(DENSE_FIRST, pp=2, sharding_stage=0)
    c = Context.build(DENSE_FIRST, H100, mapping.datatype, mapping.kernels)
    terms = iteration_terms(c, _scalar_fields(mapping), ScalarOps)
    # BF16 weights, tp = ep = 1, no sharding: the first stage's 3 dense blocks and 1 MoE block
    assert terms.weights_bytes == pytest.approx(2.0 * (3 * DENSE_FIRST.block_params + DENSE_FIRST.moe_block_params),
                                                rel=1e-12)


def test_the_scalar_and_array_paths_agree_on_uneven_kinds():
    from costmodel.evaluate import evaluate_arrays
    from solver.space.enumerate import enumerate_all

    space = plain(get_space("full"))
    arrays = enumerate_all(DENSE_FIRST, H100, 4, 4, space)
    result = evaluate_arrays(DENSE_FIRST, H100, arrays, Datatype.bfloat16)
    for row in range(0, len(arrays), max(1, len(arrays) // 7)):
        scalar = evaluate(DENSE_FIRST, H100, arrays.to_mapping(row, Datatype.bfloat16))
        assert scalar.iteration_time_s == pytest.approx(result.iteration_time_s[row], rel=1e-12)
        assert scalar.hbm_bytes == pytest.approx(result.hbm_bytes[row], rel=1e-12)


SMALL = H100.with_overrides(hbm_gib=6, nvlink_size=2)


@pytest.mark.parametrize("model", [DENSE_FIRST, HYBRID], ids=["dense-first", "hybrid-pattern"])
def test_solve_equals_brute_force_where_kinds_spread_unevenly(model):
    solve_equals_brute_force(model, SMALL, 4, 8, plain(get_space("full")), Datatype.bfloat16, Kernels(), top_k=3)


def test_every_block_floor_is_below_the_exact_time_where_kinds_spread_unevenly():
    # (the floors certify and cut blocks: each stage's own kinds' floors, kind_floors)
    assert assert_block_floors_below_exact(DENSE_FIRST, SMALL, 2, 4, Datatype.bfloat16, plain(get_space("full")))


@pytest.mark.slow      # every block of the space scored: ~10 s on 2 shared cores
@pytest.mark.parametrize("model", [DENSE_FIRST, HYBRID], ids=["dense-first", "hybrid-pattern"])
def test_every_block_floor_is_below_the_exact_time_on_the_larger_batch(model):
    assert assert_block_floors_below_exact(model, SMALL, 4, 8, Datatype.bfloat16, plain(get_space("full")))


def test_a_model_of_one_kind_keeps_one_block_for_every_stage():
    n, head_of = 8, lambda c, m: output_layer_s(c, m, ScalarOps)
    for pp, il, pace_blocks in ((2, 1, 4.0), (2, 2, 4.0), (4, 1, 2.0)):
        mapping = _mapping(LLAMA_LIKE, pp=pp, interleaving=il)
        c = Context.build(LLAMA_LIKE, H100, mapping.datatype, mapping.kernels)
        m = _scalar_fields(mapping)
        kinds = kind_block_terms(c, m, ScalarOps)
        stages = stage_blocks_terms(c, m, ScalarOps, kinds, Stages.of(c, m, ScalarOps))
        assert stages.uniform and stages.first.block is kinds.terms[0] is kinds.mean
        # even stages: the last paces, its blocks times the one block and the output layer
        terms = iteration_terms(c, m, ScalarOps, kinds)
        assert terms.forward_s == n * (pace_blocks * kinds.mean.compute_fwd_s + head_of(c, m))
