"""A block is the sum of its layers' cost records (costmodel.terms.layers): each layer kind is
costed once per evaluation whatever the mixes (recompute and offload shares, a recipe's BF16
blocks, dense and MoE blocks), and adding a layer kind is its function and its place in a
block's layers."""

from __future__ import annotations

from dataclasses import replace

import pytest

import costmodel.terms.block as block
from costmodel.terms.context import Context
from costmodel.evaluate import _context_for, _scalar_fields, evaluate
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.inputs.load import load_system
from costmodel.inputs.system import Datatype
from costmodel.terms.block import BLOCK_KINDS, LAYER_KINDS, block_forward_times, block_layers
from costmodel.terms.block_terms import block_terms
from costmodel.terms.layer_time import eltwise_s
from costmodel.terms.layers import LayerCost
from tests.conftest import SYSTEMS_DIR

REL = 1e-12

# Every other block has experts: two block kinds, dense and MoE.
MIXED_MOE = Model(hidden=1024, feedforward=4096, seq_size=2048, attn_heads=16, attn_size=64, num_blocks=8,
                  mlp="swiglu", num_experts=8, experts_per_token=2, expert_feedforward=1024, moe_every=2)
# ... under FP8 with its first and last blocks in BF16, 1 of each chunk's 2 blocks recomputed
# and 2 of a stage's 4 blocks offloading their activations: 2 × 2 × 2 × 2 = 16 block variants.
MIXED_MAPPING = {"num_procs": 8, "tensor_par": 2, "pipeline_par": 2, "data_par": 2, "expert_par": 2,
                 "batch_size": 8, "microbatch_size": 1, "activation_recompute": "full", "recompute_blocks": 1,
                 "pipeline_interleaving": 2, "tensor_par_comm_type": "rs_ag", "activations_offload": True,
                 "activation_offload_blocks": 2, "precision": "fp8-tensorwise", "bf16_first_last_blocks": 1}


@pytest.fixture(scope="module")
def h100():
    return load_system(SYSTEMS_DIR / "h100-80g-nvl8.yaml").with_overrides(offload_gib=512, offload_gbps=100)


def _counting(monkeypatch) -> dict[str, int]:
    calls: dict[str, int] = {}
    for kind, function in dict(LAYER_KINDS).items():
        def counted(c, m, xp, _kind=kind, _function=function):
            calls[_kind] = calls.get(_kind, 0) + 1
            return _function(c, m, xp)
        monkeypatch.setitem(LAYER_KINDS, kind, counted)
    return calls


def test_each_layer_kind_is_costed_once_per_block_kind(monkeypatch, h100):
    # The mix over recompute and offload shares used to re-cost every block kind for each of
    # its 4 variants (16 block evaluations); the forward is now costed once per block kind:
    # dense and MoE, each quantized and in BF16. Attention and norms run in both block kinds.
    mapping = Mapping.model_validate(MIXED_MAPPING)
    evaluate(MIXED_MOE, h100, mapping)
    c = _context_for(MIXED_MOE, h100, mapping)
    calls = _counting(monkeypatch)
    block_terms(c, _scalar_fields(mapping.with_model_defaults(True)), ScalarOps)
    assert calls == {"norm": 4, "attention": 4, "residual": 4, "mlp": 2, "moe": 2}


def test_a_block_is_the_sum_of_its_layers(h100):
    c = Context.build(MIXED_MOE, h100, Datatype.bfloat16)
    plain = {k: v for k, v in MIXED_MAPPING.items()
             if k not in ("precision", "bf16_first_last_blocks", "recompute_blocks", "activation_offload_blocks")}
    m = _scalar_fields(Mapping.model_validate(plain).with_model_defaults(True))
    for kind in ("dense", "moe"):
        layers = block_layers(c, m, ScalarOps, kind)
        fw = block_forward_times(c, m, ScalarOps, kind)
        assert [layer.name for layer in layers.layers] == list(BLOCK_KINDS[kind])
        assert fw.gemm_s == pytest.approx(sum(layer.gemm_s for layer in layers.layers), rel=REL)
        assert fw.eltwise_s == pytest.approx(sum(layer.eltwise_s for layer in layers.layers), rel=REL)
        assert fw.matrix_flops == pytest.approx(sum(layer.matrix_flops for layer in layers.layers), rel=REL)
        # backward: activation gradient (GEMMs + 2 × element-wise; an MoE layer's untimed kernels
        # at their own backward count, costmodel.terms.moe_kernels) and weight gradient (GEMMs)
        extra = sum(layer.activation_grad_s - layer.gemm_s - 2 * layer.eltwise_s for layer in layers.layers)
        assert (abs(extra) < 1e-15) == (kind == "dense")
        assert fw.backward_s == pytest.approx(2 * (fw.gemm_s + fw.eltwise_s) + extra, rel=REL)


def test_a_probe_layer_kind_joins_a_block_by_its_function_and_its_place(monkeypatch, h100):
    # A new kind of layer is its function (here a LayerNorm-sized element-wise pass over the
    # h-wide activation) and its place in a block's layers: the block's time grows by the
    # probe's forward, its backward by twice that, and nothing else is touched.
    mapping = Mapping.model_validate({"num_procs": 8, "tensor_par": 2, "pipeline_par": 2, "data_par": 2,
                                      "batch_size": 8, "microbatch_size": 1, "activation_recompute": "none"})
    dense = MIXED_MOE.model_copy(update={"num_experts": 0, "experts_per_token": 0, "expert_feedforward": 0,
                                         "moe_every": None})
    c = _context_for(dense, h100, mapping)
    m = _scalar_fields(mapping.with_model_defaults(False))
    before = block_terms(c, m, ScalarOps)

    def probe_layer(c, m, xp):
        tokens = m.microbatch * c.model.seq / m.cp
        return LayerCost("probe", eltwise_s=eltwise_s(c, xp, tokens * c.model.hidden, 1.0, 2 * c.precision.elem_bytes))

    monkeypatch.setitem(LAYER_KINDS, "probe", probe_layer)
    monkeypatch.setitem(BLOCK_KINDS, "dense", (*BLOCK_KINDS["dense"], "probe"))
    after = block_terms(c, m, ScalarOps)
    probe = probe_layer(c, m, ScalarOps).eltwise_s
    assert probe > 0
    assert after.compute_fwd_s - before.compute_fwd_s == pytest.approx(probe, rel=1e-9)
    assert after.compute_bwd_s - before.compute_bwd_s == pytest.approx(2 * probe, rel=1e-9)
    assert [layer.name for layer in after.forward.layers][-1] == "probe"
    assert after.forward.matrix_flops == before.forward.matrix_flops


def test_mixed_blocks_keep_each_kinds_layers_weighted(h100):
    # The average block of a model with dense and MoE blocks lists both kinds' layers, each
    # weighted by its kind's share: their sum is the mixed block's forward.
    c = Context.build(MIXED_MOE, h100, Datatype.bfloat16)
    m = _scalar_fields(Mapping.model_validate({"num_procs": 8, "tensor_par": 2, "pipeline_par": 2, "data_par": 2,
                                               "expert_par": 2, "batch_size": 8, "microbatch_size": 1,
                                               "activation_recompute": "none"}).with_model_defaults(True))
    mixed = block_terms(c, m, ScalarOps).forward
    assert {layer.name for layer in mixed.layers} == {"norm", "attention", "residual", "mlp", "moe"}
    assert mixed.gemm_s == pytest.approx(sum(layer.gemm_s for layer in mixed.layers), rel=REL)
    dense = block.block_forward_times(c, m, ScalarOps, "dense")
    moe = block.block_forward_times(c, m, ScalarOps, "moe")
    assert mixed.gemm_s == pytest.approx((dense.gemm_s + moe.gemm_s) / 2, rel=REL)


def test_a_third_block_kind_joins_the_average_block_by_its_count(monkeypatch, h100):
    # A kind of block beyond dense and MoE (here a dense block with the probe layer after its
    # MLP) is its layers in BLOCK_KINDS and its count in the model's kinds: the average block
    # weights each kind by its count, 4 dense, 2 MoE, 2 probe blocks of 8.
    def probe_layer(c, m, xp):
        return LayerCost("probe", eltwise_s=eltwise_s(c, xp, m.microbatch * c.model.seq / m.cp * c.model.hidden, 1.0, 4.0))

    monkeypatch.setitem(LAYER_KINDS, "probe", probe_layer)
    monkeypatch.setitem(BLOCK_KINDS, "probed", (*BLOCK_KINDS["dense"], "probe"))
    c = Context.build(MIXED_MOE, h100, Datatype.bfloat16)
    m = _scalar_fields(Mapping.model_validate({"num_procs": 8, "tensor_par": 2, "pipeline_par": 2, "data_par": 2,
                                               "expert_par": 2, "batch_size": 8, "microbatch_size": 1,
                                               "activation_recompute": "none"}).with_model_defaults(True))
    three = replace(c, model=replace(c.model, kind_counts=(("dense", 4.0), ("moe", 2.0), ("probed", 2.0))))
    mixed = block_terms(three, m, ScalarOps)
    by_kind = {kind: block.block_forward_times(c, m, ScalarOps, kind) for kind in ("dense", "moe", "probed")}
    expected = (4 * by_kind["dense"].eltwise_s + 2 * by_kind["moe"].eltwise_s + 2 * by_kind["probed"].eltwise_s) / 8
    assert mixed.forward.eltwise_s == pytest.approx(expected, rel=REL)
    assert by_kind["probed"].eltwise_s > by_kind["dense"].eltwise_s
