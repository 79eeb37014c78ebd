"""The quantization passes of a precision recipe: element-wise HBM traffic before the
quantized GEMMs of one block, one microbatch, one GPU (costmodel.inputs.precision says what each
recipe quantizes into; docs/cost-model.md, "Precision recipes", gives each pass and its source).

For each GEMM of the block, the three operands are quantized by their own kernels (Transformer
Engine's quantizers, TE csrc/quantizer.cpp; module/linear.py, layernorm_linear.py):

    input X (forward)        amax pass (current scaling) · cast pass writing the rowwise copy
                             for this GEMM and the columnwise one for the weight-gradient GEMM
    output gradient dY (bwd) the same, rowwise for the activation-gradient GEMM, columnwise for
                             the weight-gradient GEMM; NVFP4 rounds it stochastically
    weight W (once a step)   cast (and transpose), cached for every microbatch of the step

An amax pass reads the BF16 tensor; a cast pass reads it and writes each quantized copy (values
and scales). With sequence parallelism the GEMM input of a column-parallel layer (QKV, MLP up)
and the output gradient of a row-parallel one (projection, MLP down) are quantized on this GPU's
shard and all-gathered quantized (TE distributed.py gather_along_first_dim with a quantizer);
per-tensor FP8 gathers the rowwise copy only, and on a TN-only GPU transposes the gathered tensor
in backward. A norm that feeds a GEMM computes its output's amax (current scaling) or writes the
FP8 copy itself (delayed scaling). Each pass is a kernel of its own: `eltwise_s`, latency and all.

Written against costmodel.ops: element counts may be scalars or numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.context import Context
from costmodel.terms.layer_time import eltwise_s
from costmodel.inputs.precision import STOCHASTIC_ROUNDING_FLOPS_PER_ELEM

__all__ = ["GemmOperands", "QuantizePasses", "quantize_passes"]


@dataclass(frozen=True)
class GemmOperands:
    """One quantized GEMM of a block on one GPU, one microbatch (element counts)."""

    inputs: object
    """elements of X as this GPU quantizes it (the shard, when gathered after)"""
    outputs: object
    """elements of dY as this GPU quantizes it (the shard, when gathered after)"""
    weights: object
    """elements of W on this GPU"""
    input_gathered: object = False
    """X is all-gathered after its cast (a sequence-parallel column-parallel input)"""
    output_gathered: object = False
    """dY is all-gathered after its cast (a sequence-parallel row-parallel output)"""
    group: object = 1.0
    """GPUs of that all-gather (tp)"""
    norm_fed: bool = False
    """X is a norm's output (QKV and the dense MLP's up projection)"""
    projection: bool = False
    """the attention's output projection: under most recipes it keeps X in BF16 and quantizes
    it again, columnwise, in backward (RecipeFormat.projection_keeps_bf16_input)"""


@dataclass(frozen=True)
class QuantizePasses:
    """Seconds of a block's quantization passes (each a scalar or an array)."""

    forward_s: object
    """the inputs' amax and cast passes, per microbatch"""
    backward_s: object
    """the output gradients' passes, and transposes after backward gathers, per microbatch"""
    weight_step_s: object
    """the weights' cast and transpose passes, once per step"""


def _operand_s(c: Context, xp, elems, copies, amax: bool, flops_per_elem: float = 0.0):
    """An operand's amax pass (when `amax`) and its cast pass writing `copies` copies; per-tensor
    current scaling turns the amax into a scale in a kernel of its own between the two
    (nvte_compute_scale_from_amax, TE csrc/quantizer.cpp), which costs its fixed latency."""
    hp = c.precision.elem_bytes
    cast = eltwise_s(c, xp, elems, flops_per_elem, hp + copies * c.precision.recipe.copy_bytes)
    scale = c.memory.hbm_latency_s if c.precision.recipe.format.amax_pass and c.precision.recipe.format.per_tensor else 0.0
    return cast + scale + (eltwise_s(c, xp, elems, 0.0, hp) if amax else 0.0)


def _transpose_s(c: Context, xp, elems, gathered):
    """A transpose of a gathered per-tensor FP8 tensor (`elems` after the gather), where needed."""
    if not c.precision.recipe.transpose_after_gather:
        return 0.0
    return xp.where(gathered, eltwise_s(c, xp, elems, 0.0, 2 * c.precision.recipe.copy_bytes), 0.0)


def _swizzle_s(c: Context, xp, elems, scale_bytes: float):
    """The kernel rearranging one operand's block scales (`elems` elements, `scale_bytes` of
    scale per element) into the GEMM's layout: its scales read and written once."""
    return eltwise_s(c, xp, elems * scale_bytes, 0.0, 2.0)


def quantize_passes(c: Context, xp, gemms: tuple[GemmOperands, ...]) -> QuantizePasses:
    """The quantization passes of `gemms` under the problem's recipe (all 0 without a quantized
    one: Calculon's datatype costing, or bf16)."""
    recipe = c.precision.recipe
    if recipe is None or not recipe.format.quantized:
        return QuantizePasses(0.0, 0.0, 0.0)
    fmt = recipe.format
    rounding = STOCHASTIC_ROUNDING_FLOPS_PER_ELEM if fmt.stochastic_rounding else 0.0
    forward, backward, weights = 0.0, 0.0, 0.0
    for g in gemms:
        in_copies = xp.where(g.input_gathered, recipe.gathered_copies, recipe.copies)
        if g.projection and fmt.projection_keeps_bf16_input:
            # rowwise for the forward GEMM now, columnwise from the kept BF16 input in backward
            forward = forward + _operand_s(c, xp, g.inputs, 1.0, fmt.amax_pass)
            backward = backward + _operand_s(c, xp, g.inputs, 1.0, fmt.amax_pass)
        elif g.norm_fed and fmt.norm_casts:
            # The norm wrote the rowwise copy (block.py counts its write at FP8); the columnwise
            # copy of an ungathered input is a transpose of it.
            transpose = eltwise_s(c, xp, g.inputs, 0.0, 2 * recipe.copy_bytes)
            forward = forward + xp.where(in_copies > 1, transpose, 0.0)
        else:
            amax = fmt.amax_pass and not (g.norm_fed and fmt.norm_amax)
            forward = forward + _operand_s(c, xp, g.inputs, in_copies, amax)
        out_copies = xp.where(g.output_gathered, recipe.gathered_copies, recipe.copies)
        backward = (backward + _operand_s(c, xp, g.outputs, out_copies, fmt.amax_pass, rounding)
                    + _transpose_s(c, xp, g.inputs * g.group, g.input_gathered)
                    + _transpose_s(c, xp, g.outputs * g.group, g.output_gathered))
        for pass_bytes in recipe.weight_step_passes:
            weights = weights + eltwise_s(c, xp, g.weights, 0.0, pass_bytes)
        if fmt.swizzled_scales:
            # forward GEMM: X and W; activation gradient: dY and Wᵀ; weight gradient: Xᵀ and dYᵀ
            x_scales = _swizzle_s(c, xp, xp.where(g.input_gathered, g.inputs * g.group, g.inputs), fmt.scale_bytes)
            dy_scales = _swizzle_s(c, xp, xp.where(g.output_gathered, g.outputs * g.group, g.outputs), fmt.scale_bytes)
            w_scales = _swizzle_s(c, xp, g.weights, fmt.weight_scale_bytes)
            forward = forward + x_scales + w_scales
            backward = backward + x_scales + 2 * dy_scales + w_scales
    return QuantizePasses(forward, backward, weights)
