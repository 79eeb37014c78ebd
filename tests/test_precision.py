"""Precision recipes (costmodel.inputs.precision, costmodel.terms.quantize): each recipe's bytes and passes
against a hand computation, stored activations, messages and weights by hand, scalar = array for
every recipe, the datatype's costing unchanged (--datatype float8 is Calculon's all-FP8 still),
and one-line errors for recipes a GPU does not run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.terms.block import block_forward_times
from costmodel.terms.block_memory import block_stored_activation_bytes
from costmodel.terms.block_terms import block_terms
from costmodel.terms.context import Context
from costmodel.encoding import MappingArrays
from costmodel.errors import InputError
from costmodel.evaluate import _scalar_fields, evaluate, evaluate_arrays
from costmodel.terms.iteration import MEMORY_TERMS, TIME_TERMS
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.inputs.precision import FORMATS, Precision, PrecisionSupport, RecipeCompute, recipe_costs
from costmodel.inputs.system import Datatype
from tests.strategies import mappings, models, systems

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ROOT / "problems" / "systems"
H100 = load_system(SYSTEMS / "h100-80g-nvl8.yaml")
B200 = load_system(SYSTEMS / "b200-180g-nvl8.yaml")
GB200 = load_system(SYSTEMS / "gb200-186g-nvl72.yaml")
A100 = load_system(SYSTEMS / "a100-80g-selene.yaml")

# A small Llama-shaped model: T = 1024 tokens, h = 1024, 8 query heads of 128, 2 key/value heads,
# SwiGLU of 2816, 4 blocks.
SMALL = Model(name="small-llama", hidden=1024, feedforward=2816, seq_size=1024, attn_heads=8, attn_size=128,
              num_blocks=4, kv_heads=2, mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False,
              vocab_size=32000)
# tp 2 with sequence parallelism (the all-gather redone in backward), one microbatch of one sequence
TP2_SP = dict(num_procs=2, tensor_par=2, pipeline_par=1, data_par=1, batch_size=1, microbatch_size=1,
              tensor_par_comm_type="rs_ag", seq_par_ag_redo=True)


def mapping(**fields) -> Mapping:
    return Mapping.model_validate({**TP2_SP, **fields})


def context(system, precision=None, **kernels) -> Context:
    return Context.build(SMALL, system, Datatype.bfloat16, Kernels(precision=precision, **kernels))


HBM_EFFICIENCY = {2250e12: 0.6, 989e12: 0.702}
"""Each file's HBM efficiency by its BF16 peak: the B200's (pytorch/ao's B200 cast kernels) and
the H100's (its measured fit)."""


def pass_s(c: Context, elems: float, bytes_per_elem: float) -> float:
    """One HBM-bound kernel by hand: the files' latency + bytes / (bandwidth × efficiency)."""
    efficiency = HBM_EFFICIENCY[c.compute.hp_matrix_flops_per_s if c.precision.recipe is not None else c.compute.matrix_flops_per_s]
    return c.memory.hbm_latency_s + elems * bytes_per_elem / (c.memory.hbm_bytes_per_s * efficiency)


def swizzles_s(c: Context, gathered: list, scale_bytes: float, weight_scale_bytes: float) -> tuple[float, float]:
    """The scale-swizzle kernels of block-scaled GEMMs on Blackwell (TE gemm.cpp
    swizzle_scaling_factors): per GEMM, X and W before the forward GEMM; dY and Wᵀ before the
    activation gradient, Xᵀ and dYᵀ before the weight gradient. Each reads and writes its scales
    (`gathered`: (X elements, dY elements, W elements) as the GEMM takes them)."""
    forward = backward = 0.0
    for x, dy, w in gathered:
        xs, dys, ws = (pass_s(c, e * b, 2) for e, b in ((x, scale_bytes), (dy, scale_bytes), (w, weight_scale_bytes)))
        forward += xs + ws
        backward += xs + 2 * dys + ws
    return forward, backward


# The GEMM operands as the GEMMs take them (tp 2, sequence parallel: gathered to the whole 1024 tokens).
GEMM_OPERANDS = [(1024 * 1024, 1024 * 768, 1024 * 768), (1024 * 512, 1024 * 1024, 512 * 1024),
                 (1024 * 1024, 1024 * 2816, 1024 * 2816), (1024 * 1408, 1024 * 1024, 1408 * 1024)]


# ---------------------------------------------------------------- bytes per element, by hand

# (recipe, GEMM layouts) -> copy bytes, weight copy bytes, copies, gathered copies, transpose after gather
RECIPE_BYTES = {
    (Precision.fp8_delayed, "tn"): (1.0, 1.0, 2, 1, True),
    (Precision.fp8_tensorwise, "tn"): (1.0, 1.0, 2, 1, True),
    (Precision.fp8_tensorwise, "any"): (1.0, 1.0, 1, 1, False),   # Blackwell: one copy serves every layout
    (Precision.fp8_blockwise, "tn"): (1 + 4 / 128, 1 + 4 / 128**2, 2, 2, False),   # fp32 scale per 1×128, 128×128
    (Precision.mxfp8, "any"): (1 + 1 / 32, 1 + 1 / 32, 2, 2, False),               # E8M0 per 32
    (Precision.nvfp4, "any"): (0.5 + 1 / 16, 0.5 + 1 / 256, 2, 2, False),          # E4M3 per 16, 16×16 weights
}

# (recipe, layouts, low-precision param gather) -> weight stored, cached, gathered, optimizer write, step passes
WEIGHT_BYTES = {
    # per-tensor FP8 params (1 B) and their transpose (1 B); gathered in FP8; the optimizer writes
    # the FP8 shard, reading the fp32 master once more for its amax (current scaling only)
    (Precision.fp8_tensorwise, "tn", True): (1.0, 1.0, 1.0, 1.0 + 4.0, (2.0,)),
    (Precision.fp8_delayed, "tn", True): (1.0, 1.0, 1.0, 1.0, (2.0,)),
    (Precision.fp8_tensorwise, "any", True): (1.0, 0.0, 1.0, 5.0, ()),
    # BF16 params; two cached FP8 copies refreshed once a step: amax read (2) and cast (2 + 1 + 1)
    (Precision.fp8_tensorwise, "tn", False): (2.0, 2.0, 2.0, 2.0, (2.0, 4.0)),
    (Precision.fp8_blockwise, "tn", False): (2.0, 2 * (1 + 4 / 128**2), 2.0, 2.0, (2.0 + 2 * (1 + 4 / 128**2),)),
    # MXFP8 params gathered in BF16 and both copies quantized after the gather
    (Precision.mxfp8, "any", True): (1 + 1 / 32, 1 + 1 / 32, 2.0, 2.0, (2.0 + 2 * (1 + 1 / 32),)),
    (Precision.nvfp4, "any", True): (0.5 + 1 / 256, 0.5 + 1 / 256, 0.5 + 1 / 256, 0.5 + 1 / 256 + 4.0,
                                     (2 * (0.5 + 1 / 256),)),
}


@pytest.mark.parametrize("key", RECIPE_BYTES, ids=lambda k: f"{k[0].value}-{k[1]}")
def test_each_recipe_copies_by_hand(key):
    costs = recipe_costs(key[0], key[1], FORMATS[key[0]].param_gather)
    copy, weight_copy, copies, gathered, transpose = RECIPE_BYTES[key]
    assert costs.copy_bytes == pytest.approx(copy) and costs.weight_copy_bytes == pytest.approx(weight_copy)
    assert (costs.copies, costs.gathered_copies, costs.transpose_after_gather) == (copies, gathered, transpose)
    assert costs.gemm_bytes == FORMATS[key[0]].element_bytes


@pytest.mark.parametrize("key", WEIGHT_BYTES, ids=lambda k: f"{k[0].value}-{k[1]}-{'lp' if k[2] else 'bf16'}")
def test_each_recipe_weights_by_hand(key):
    costs = recipe_costs(*key)
    stored, cached, gathered, written, passes = WEIGHT_BYTES[key]
    assert costs.weight_storage_bytes == pytest.approx(stored)
    assert costs.weight_cache_bytes == pytest.approx(cached)
    assert costs.weight_gather_bytes == pytest.approx(gathered)
    assert costs.optimizer_weight_bytes == pytest.approx(written)
    assert costs.weight_step_passes == pytest.approx(passes)


def test_bf16_blocks_count_their_weights_in_bf16():
    half = recipe_costs(Precision.fp8_tensorwise, "tn", True, bf16_block_share=0.5)
    assert half.weight_storage_bytes == pytest.approx(0.5 * 1 + 0.5 * 2)
    assert half.weight_cache_bytes == pytest.approx(0.5 * 1)
    assert half.weight_gather_bytes == pytest.approx(0.5 * 1 + 0.5 * 2)


# ---------------------------------------------------------------- the passes of one block, by hand

# Elements of the block's quantized operands on one GPU (tp 2, sequence parallel): the shard of a
# gathered operand is T/t·h = 512·1024.
SHARD = 512 * 1024
QKV_X, QKV_DY = SHARD, 1024 * 768          # 768 = (8 + 2·2)/2 heads of 128
PROJ_X, PROJ_DY = 1024 * 512, SHARD
FC1_X, FC1_DY = SHARD, 1024 * 2816         # gate and up, 2·2816/2
FC2_X, FC2_DY = 1024 * 1408, SHARD
WEIGHTS = (1024 * 768, 512 * 1024, 1024 * 2816, 1408 * 1024)


def test_fp8_tensorwise_passes_on_a_tn_gpu_by_hand():
    c = context(H100, Precision.fp8_tensorwise)
    scale = c.memory.hbm_latency_s      # the scale-from-amax kernel of per-tensor current scaling
    # forward: the norm-fed inputs need no amax (the norm computes it) and are cast once before
    # the FP8 gather; the projection casts its input once (it keeps the BF16 input for backward);
    # the MLP's down projection reads its input (amax) and casts both copies
    forward = (pass_s(c, QKV_X, 2 + 1) + scale
               + pass_s(c, PROJ_X, 2) + scale + pass_s(c, PROJ_X, 2 + 1)
               + pass_s(c, FC1_X, 2 + 1) + scale
               + pass_s(c, FC2_X, 2) + scale + pass_s(c, FC2_X, 2 + 2))
    # backward: every output gradient's amax and cast (two copies, or one before a gather and a
    # transpose of the gathered tensor after it), the projection's input cast again, and the
    # transposes of the re-gathered QKV and MLP inputs
    gathered = 2 * SHARD
    backward = (pass_s(c, QKV_DY, 2) + scale + pass_s(c, QKV_DY, 4) + pass_s(c, gathered, 2)
                + pass_s(c, PROJ_X, 2) + scale + pass_s(c, PROJ_X, 3)
                + pass_s(c, PROJ_DY, 2) + scale + pass_s(c, PROJ_DY, 3) + pass_s(c, gathered, 2)
                + pass_s(c, FC1_DY, 2) + scale + pass_s(c, FC1_DY, 4) + pass_s(c, gathered, 2)
                + pass_s(c, FC2_DY, 2) + scale + pass_s(c, FC2_DY, 3) + pass_s(c, gathered, 2))
    weights = sum(pass_s(c, w, 2) for w in WEIGHTS)      # the FP8 params' transposes, once a step
    fw = block_forward_times(c, _scalar_fields(mapping(precision="fp8-tensorwise")), ScalarOps)
    assert fw.quantize_fwd_s == pytest.approx(forward, rel=1e-12)
    assert fw.quantize_bwd_s == pytest.approx(backward, rel=1e-12)
    assert fw.weight_quantize_s == pytest.approx(weights, rel=1e-12)


def test_mxfp8_passes_on_blackwell_by_hand():
    c = context(B200, Precision.mxfp8)
    two = 2 + 2 * (1 + 1 / 32)     # read BF16, write rowwise and columnwise copies with their scales
    one = 2 + (1 + 1 / 32)
    forward = pass_s(c, QKV_X, two) + pass_s(c, PROJ_X, one) + pass_s(c, FC1_X, two) + pass_s(c, FC2_X, two)
    backward = (pass_s(c, QKV_DY, two) + pass_s(c, PROJ_X, one) + pass_s(c, PROJ_DY, two)
                + pass_s(c, FC1_DY, two) + pass_s(c, FC2_DY, two))
    weights = sum(pass_s(c, w, two) for w in WEIGHTS)     # gathered in BF16, quantized both ways after
    swizzle_fwd, swizzle_bwd = swizzles_s(c, GEMM_OPERANDS, 1 / 32, 1 / 32)
    forward, backward = forward + swizzle_fwd, backward + swizzle_bwd
    fw = block_forward_times(c, _scalar_fields(mapping(precision="mxfp8")), ScalarOps)
    assert fw.quantize_fwd_s == pytest.approx(forward, rel=1e-12)
    assert fw.quantize_bwd_s == pytest.approx(backward, rel=1e-12)
    assert fw.weight_quantize_s == pytest.approx(weights, rel=1e-12)


def test_fp8_blockwise_passes_on_a_tn_gpu_by_hand():
    c = context(H100, Precision.fp8_blockwise)
    copy = 1 + 4 / 128                      # an FP8 element and its share of a 1×128 block's fp32 scale
    two, one = 2 + 2 * copy, 2 + copy       # both copies quantized from BF16 (block scales do not transpose)
    forward = pass_s(c, QKV_X, two) + pass_s(c, PROJ_X, one) + pass_s(c, FC1_X, two) + pass_s(c, FC2_X, two)
    backward = (pass_s(c, QKV_DY, two) + pass_s(c, PROJ_X, one) + pass_s(c, PROJ_DY, two)
                + pass_s(c, FC1_DY, two) + pass_s(c, FC2_DY, two))
    # BF16 weights (no low-precision gather in this recipe): both 128×128-scaled copies, once a step
    weights = sum(pass_s(c, w, 2 + 2 * (1 + 4 / 128**2)) for w in WEIGHTS)
    fw = block_forward_times(c, _scalar_fields(mapping(precision="fp8-blockwise")), ScalarOps)
    assert fw.quantize_fwd_s == pytest.approx(forward, rel=1e-12)
    assert fw.quantize_bwd_s == pytest.approx(backward, rel=1e-12)
    assert fw.weight_quantize_s == pytest.approx(weights, rel=1e-12)


def test_nvfp4_passes_by_hand():
    c = context(B200, Precision.nvfp4)
    copy = 0.5 + 1 / 16                     # an FP4 element and its share of a 16-element block's E4M3 scale
    two, one = 2 + 2 * copy, 2 + copy
    amax = lambda elems: pass_s(c, elems, 2)     # noqa: E731 - the per-tensor amax (after the Hadamard transform)
    forward = sum(amax(x) + pass_s(c, x, two) for x in (QKV_X, FC1_X, FC2_X)) + amax(PROJ_X) + pass_s(c, PROJ_X, one)
    backward = (sum(amax(dy) + pass_s(c, dy, two) for dy in (QKV_DY, PROJ_DY, FC1_DY, FC2_DY))
                + amax(PROJ_X) + pass_s(c, PROJ_X, one))
    weights = sum(pass_s(c, w, 2 * (0.5 + 1 / 256)) for w in WEIGHTS)   # FP4 params: the 16×16 blocks transposed
    swizzle_fwd, swizzle_bwd = swizzles_s(c, GEMM_OPERANDS, 1 / 16, 1 / 256)
    forward, backward = forward + swizzle_fwd, backward + swizzle_bwd
    fw = block_forward_times(c, _scalar_fields(mapping(precision="nvfp4")), ScalarOps)
    assert fw.quantize_fwd_s == pytest.approx(forward, rel=1e-12)
    assert fw.quantize_bwd_s == pytest.approx(backward, rel=1e-12)
    assert fw.weight_quantize_s == pytest.approx(weights, rel=1e-12)


def test_fp8_delayed_casts_in_the_norm_and_has_no_amax_pass():
    c = context(H100, Precision.fp8_delayed)
    # the norm-fed inputs: the norm writes the FP8 copy; gathered, nothing more until backward
    forward = pass_s(c, PROJ_X, 2 + 2) + pass_s(c, FC2_X, 2 + 2)
    fw = block_forward_times(c, _scalar_fields(mapping(precision="fp8-delayed")), ScalarOps)
    assert fw.quantize_fwd_s == pytest.approx(forward, rel=1e-12)
    bf16 = block_forward_times(context(H100, Precision.bf16), _scalar_fields(mapping(precision="bf16")), ScalarOps)
    norm_saving = 2 * (pass_s(c, SHARD, 4) - pass_s(c, SHARD, 3))     # each norm writes 1 byte, not 2
    assert fw.eltwise_s == pytest.approx(bf16.eltwise_s - norm_saving, rel=1e-12)


def test_nvfp4_rounds_gradients_stochastically_on_the_vector_units():
    """The rounding's ~15 operations per element ride in the cast kernels of the gradients: hidden
    behind their bytes on a B200, visible on slow vector units; the inputs are not rounded."""
    def passes(vector_tflops):
        compute = {**B200.compute, Datatype.bfloat16: B200.compute[Datatype.bfloat16].model_copy(
            update={"vector_tflops": vector_tflops})}
        c = Context.build(SMALL, B200.model_copy(update={"compute": compute}), Datatype.bfloat16,
                          Kernels(precision=Precision.nvfp4))
        return block_forward_times(c, _scalar_fields(mapping(precision="nvfp4")), ScalarOps)
    b200, fast, slow = passes(150.0), passes(1e5), passes(1.0)
    assert b200.quantize_bwd_s == fast.quantize_bwd_s < slow.quantize_bwd_s
    assert fast.quantize_fwd_s == slow.quantize_fwd_s


# ---------------------------------------------------------------- stored activations, messages, weights

def test_stored_activations_by_hand():
    T, h, t = 1024, 1024, 2
    fused_core = 4 * 1 * 4 * 1024          # fp32 log-sum-exp per row of 4 heads
    common = 2 * 2 * T * h / t + 2 * 1 * T * h / t + fused_core    # norm inputs (BF16) and the dropout masks
    qkv = 2 * T * (512 + 2 * 128)
    expected = {
        # the GEMM inputs as their FP8 shards; the attention output once in BF16; the gate's input
        # in BF16 and its output as the down projection's FP8 copy
        "fp8-tensorwise": common + 2 * 1 * T * h / t + qkv + 2 * T * 512 + (2 * 2 + 1) * T * 2816 / t,
        # delayed scaling: the projection keeps its own FP8 copy beside the kernel's BF16 output
        "fp8-delayed": common + 2 * 1 * T * h / t + qkv + (2 + 1) * T * 512 + (2 * 2 + 1) * T * 2816 / t,
        "bf16": common + 2 * 2 * T * h / t + qkv + 2 * T * 512 + 3 * 2 * T * 2816 / t,
    }
    for name, value in expected.items():
        stored = block_stored_activation_bytes(context(H100, Precision(name)), _scalar_fields(mapping(precision=name)),
                                               ScalarOps)
        assert stored.stored == pytest.approx(value, rel=1e-12), name


def test_sequence_parallel_gathers_travel_quantized_and_scatters_in_bf16():
    m = _scalar_fields(mapping(precision="fp8-tensorwise", tensor_par_net=0))
    c = context(H100, Precision.fp8_tensorwise)
    blk = block_terms(c, m, ScalarOps)
    nvlink = H100.networks[0]
    rate, latency = nvlink.bandwidth_bytes_per_s * nvlink.efficiency, nvlink.latency_s
    message = 1024 * 1024                  # T·h elements
    gather, scatter = latency + 1 * message / 2 / rate, latency + 2 * message / 2 / rate
    amax = latency + 4 * 2 * 1 / 2 / rate  # one fp32 all-reduced per gathered operand
    # two regions, each an all-gather (FP8) and a reduce-scatter (BF16); backward mirrors them and
    # redoes the two gathers; nothing overlaps; the amax all-reduces are blocking
    assert blk.tp_fwd_s == pytest.approx(2 * (gather + scatter) + 2 * amax, rel=1e-12)
    assert blk.tp_bwd_s == pytest.approx(2 * (gather + scatter) + 2 * gather + 2 * amax, rel=1e-12)


@pytest.mark.parametrize("system, name, per_param", [
    (H100, "fp8-tensorwise", 2.0), (H100, "fp8-blockwise", 2 + 2 * (1 + 4 / 128**2)), (B200, "fp8-tensorwise", 1.0),
    (B200, "mxfp8", 2 * (1 + 1 / 32)), (B200, "nvfp4", 2 * (0.5 + 1 / 256)), (H100, "bf16", 2.0)])
def test_block_weights_in_memory_by_hand(system, name, per_param):
    ev = evaluate(SMALL, system, mapping(precision=name))
    block_params = SMALL.block_params / 2
    assert ev.memory.weights_bytes == pytest.approx(4 * block_params * per_param, rel=1e-12)


def test_bf16_adam_moments_save_four_bytes_a_parameter():
    fp32 = evaluate(SMALL, H100, mapping(precision="fp8-tensorwise"))
    bf16 = evaluate(SMALL, H100, mapping(precision="fp8-tensorwise", optimizer_state="bf16"))
    assert fp32.memory.optimizer_bytes / bf16.memory.optimizer_bytes == pytest.approx(12 / 8)


# ---------------------------------------------------------------- the recipes beside the datatype's costing

def test_bf16_recipe_is_the_bfloat16_datatype_to_the_bit():
    for fields in (TP2_SP, dict(TP2_SP, tensor_par_comm_type="ar", activation_recompute="full"),
                   dict(TP2_SP, sharding_stage=3, num_procs=4, data_par=2, batch_size=4)):
        plain = evaluate(SMALL, H100, Mapping.model_validate(fields))
        recipe = evaluate(SMALL, H100, Mapping.model_validate({**fields, "precision": "bf16"}))
        assert plain.time == recipe.time and plain.memory == recipe.memory


def test_float8_datatype_is_calculons_all_fp8_as_before():
    """Numbers of the shipped FP8 mapping before the recipes existed (Calculon's costing), on
    the H100's kernels alone (its whole-step terms came later and change the time)."""
    model = load_model(ROOT / "problems/models/gpt3-175b.yaml")
    ev = evaluate(model, H100.model_copy(update={"step": None}), Mapping.model_validate_json(
        (ROOT / "problems/mappings/gpt3-175b-h100-fp8-512gpu.json").read_text()))
    assert ev.iteration_time_s == pytest.approx(GOLDEN_FP8_ITERATION_S, rel=1e-12)
    assert ev.hbm_bytes == pytest.approx(GOLDEN_FP8_HBM_BYTES, rel=1e-12)


GOLDEN_FP8_ITERATION_S = 6.665188492804205     # computed before costmodel.inputs.precision existed
GOLDEN_FP8_HBM_BYTES = 27380532224.0


def test_a_recipe_costs_more_than_all_fp8_and_less_than_bf16():
    llama = load_model(ROOT / "problems/models/llama-3.1-8b/config.json", seq_size=8192)
    fields = dict(TP2_SP, num_procs=8, data_par=4, batch_size=32, sharding_stage=1)
    for system, name in ((H100, "fp8-tensorwise"), (B200, "mxfp8"), (GB200, "fp8-delayed"), (B200, "nvfp4")):
        fp8 = evaluate(llama, system, Mapping.model_validate({**fields, "datatype": "float8"}))
        recipe = evaluate(llama, system, Mapping.model_validate({**fields, "precision": name}))
        bf16 = evaluate(llama, system, Mapping.model_validate(fields))
        if name != "nvfp4":       # FP4 GEMMs run at twice FP8's rate
            assert fp8.iteration_time_s < recipe.iteration_time_s < bf16.iteration_time_s, name
        assert fp8.memory.activations_bytes < recipe.memory.activations_bytes < \
            bf16.memory.activations_bytes, name


def test_bf16_first_and_last_blocks_mix_in_by_their_share():
    half = evaluate(SMALL, H100, mapping(precision="fp8-tensorwise", bf16_first_last_blocks=1))
    none = evaluate(SMALL, H100, mapping(precision="fp8-tensorwise"))
    bf16 = evaluate(SMALL, H100, mapping(precision="bf16"))
    # 2 of 4 blocks in BF16: the forward pass is halfway (the output layer is BF16 in all three)
    assert half.time.forward_s == pytest.approx((none.time.forward_s + bf16.time.forward_s) / 2)


# ---------------------------------------------------------------- scalar = array, every recipe

@st.composite
def recipe_problems(draw):
    model = draw(models())
    system = draw(systems())
    support = PrecisionSupport(fp8_gemm_layouts=draw(st.sampled_from(["tn", "any"])), recipes={
        **{p: RecipeCompute(gemm="float8") for p in Precision if p is not Precision.bf16},
        Precision.bf16: RecipeCompute(gemm="bfloat16"),
        Precision.nvfp4: RecipeCompute(gemm="float8", gemm_tflops=2 * system.compute[Datatype.float8].matrix_tflops)})
    system = system.model_copy(update={"precision": support})
    kernels = Kernels(precision=draw(st.sampled_from(list(Precision))), fused_attention=draw(st.booleans()),
                      optimizer_state=draw(st.sampled_from(["fp32", "bf16"])))
    if FORMATS[kernels.precision].quantized:
        kernels = Kernels(precision=kernels.precision, fused_attention=kernels.fused_attention,
                          optimizer_state=kernels.optimizer_state,
                          low_precision_param_gather=draw(st.sampled_from([None, True, False])),
                          bf16_first_last_blocks=draw(st.integers(0, 2)))
    batch = [draw(mappings(model, system)).model_copy(update={"datatype": Datatype.bfloat16,
                                                              "fused_attention": kernels.fused_attention,
                                                              "grad_datatype": "float32",
                                                              **kernels.precision_settings})
             for _ in range(draw(st.integers(1, 5)))]
    # the problem's other settings (one Kernels for the arrays): as the first mapping's
    same = {name: getattr(batch[0], name) for name in ("fused_activation", "cuda_graphs", "fused_cross_entropy")}
    return model, system, kernels, [m.model_copy(update=same) for m in batch]


@settings(max_examples=60, deadline=None)
@given(recipe_problems())
def test_scalar_and_array_agree_for_every_recipe(problem):
    model, system, kernels, batch = problem
    arrays = evaluate_arrays(model, system, MappingArrays.from_mappings(batch), Datatype.bfloat16,
                             batch[0].kernels)
    for i, m in enumerate(batch):
        ev = evaluate(model, system, m)
        assert ev.feasible == bool(arrays.feasible[i])
        for name in TIME_TERMS:
            assert math.isclose(getattr(ev.time, name), float(getattr(arrays.terms, name)[i]), rel_tol=1e-12, abs_tol=1e-12)
        for name in MEMORY_TERMS:
            value = float(np.broadcast_to(getattr(arrays.terms, name), (len(batch),))[i])
            assert math.isclose(getattr(ev.memory, name), value, rel_tol=1e-12, abs_tol=1e-6), name
        assert math.isclose(sum(ev.time.as_dict().values()), ev.iteration_time_s, rel_tol=1e-9)


@pytest.mark.parametrize("name", ["fp8-tensorwise", "mxfp8", "nvfp4"])
def test_scalar_and_array_agree_for_mixture_of_experts_under_a_recipe(name):
    """Qwen1.5-MoE (60 experts, shared experts, MoE in every block) on B200s: the experts' grouped
    GEMMs and the shared experts are quantized, the router is not."""
    model = load_model(ROOT / "problems/models/qwen1.5-moe-a2.7b/config.json", seq_size=4096)
    batch = [Mapping.model_validate({**TP2_SP, "num_procs": 2 * ep, "data_par": ep, "expert_par": ep,
                                     "batch_size": 2 * ep, "precision": name, "bf16_first_last_blocks": 2})
             for ep in (1, 2, 4)]
    arrays = evaluate_arrays(model, B200, MappingArrays.from_mappings(batch, moe=True), Datatype.bfloat16,
                             batch[0].kernels)
    for i, m in enumerate(batch):
        ev = evaluate(model, B200, m)
        assert ev.iteration_time_s == pytest.approx(float(arrays.iteration_time_s[i]), rel=1e-12)
        assert ev.hbm_bytes == pytest.approx(float(arrays.hbm_bytes[i]), rel=1e-12)
    c = Context.build(model, B200, Datatype.bfloat16, batch[0].kernels)
    fw = block_forward_times(c, _scalar_fields(batch[0], moe=True), ScalarOps, "moe")
    assert fw.quantize_fwd_s > 0 and fw.quantize_bwd_s > 0
    # per-tensor FP8 params on Blackwell need no second copy; MXFP8 and NVFP4 make one each step
    assert (fw.weight_quantize_s > 0) == (name != "fp8-tensorwise")


# ---------------------------------------------------------------- errors

def test_a_recipe_the_gpu_does_not_run_names_the_gpu_and_its_precisions():
    with pytest.raises(InputError, match=r"^precision mxfp8: NVIDIA H100 SXM5 80GB \(system 'h100-80g-nvl8'\) does "
                                         r"not run it: Transformer Engine runs it from compute capability 10.0, this GPU is "
                                         r"9.0 \(its precisions: bf16, fp8-delayed, fp8-tensorwise, fp8-blockwise\)$"):
        context(H100, Precision.mxfp8)
    with pytest.raises(InputError, match=r"NVIDIA A100 SXM4 80GB .* \(its precisions: bf16\)$"):
        context(A100, Precision.fp8_tensorwise)


def test_a_recipe_keeps_bfloat16_beside_it():
    with pytest.raises(InputError, match="datatype float8 cannot go with it"):
        Context.build(SMALL, H100, Datatype.float8, Kernels(precision=Precision.fp8_tensorwise))


def test_recipe_options_need_a_quantized_recipe():
    with pytest.raises(InputError, match="bf16_first_last_blocks needs an FP8 or FP4 precision recipe, not bf16"):
        Kernels(precision=Precision.bf16, bf16_first_last_blocks=1)
    with pytest.raises(InputError, match="low_precision_param_gather needs .* not none"):
        Kernels(low_precision_param_gather=True)
    with pytest.raises(ValueError, match="bf16_first_last_blocks needs"):
        mapping(bf16_first_last_blocks=2)


def test_a_system_file_without_precision_runs_bf16_alone():
    old = H100.model_copy(update={"precision": None, "gpu": None})
    assert context(old, Precision.bf16).precision.recipe.format.precision is Precision.bf16
    with pytest.raises(InputError, match=r"^precision fp8-tensorwise: system 'h100-80g-nvl8' does not run it "
                                         r"\(its precisions: bf16\)$"):
        context(old, Precision.fp8_tensorwise)
