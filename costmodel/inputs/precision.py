"""Precision recipes as Transformer Engine runs them: which tensors are quantized, into how
many bytes, by which passes over HBM, and what each GPU supports.

`--datatype` is Calculon's costing: every weight, stored activation, element-wise pass and
message in one datatype (float8: one byte each). A precision recipe (`--precision`, Megatron-LM's
`--fp8-recipe` / `--fp4-recipe` names) is what Megatron-LM with Transformer Engine runs instead:
only the operands of the blocks' GEMMs are quantized — an amax where the scale needs one, a cast,
and a second (transposed or columnwise) copy for the backward GEMMs — while norms, activation
functions, attention, softmax, residuals, the output layer and every stored activation that is
not a GEMM operand stay BF16. The formulas that use these constants are in costmodel.terms.quantize
(passes), costmodel.terms.block (stored activations), costmodel.terms.comm (sequence-parallel messages),
costmodel.terms.stage_state and costmodel.terms.data_parallel (weights); docs/cost-model.md, "Precision
recipes", gives each term and its source.

Sources, read at these commits (no code copied):
  TE  = NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b
  MLM = NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
  MB  = NVIDIA-NeMo/Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

import costmodel.inputs.limits as limits
from costmodel.errors import InputError
from costmodel.inputs.model import INPUT_CONFIG, RealNumber, within

__all__ = ["BF16_BYTES", "FORMATS", "HADAMARD_FLOPS_PER_ELEM", "MASTER_WEIGHT_BYTES", "OPTIMIZER_STATES",
           "OptimizerState", "Precision", "PrecisionSupport", "RecipeCompute", "RecipeCosts", "RecipeFormat",
           "STOCHASTIC_ROUNDING_FLOPS_PER_ELEM", "bf16_costs", "check_support", "recipe_costs", "supported_precisions",
           "system_recipe"]


class Precision(str, Enum):
    """A precision recipe, by Megatron-LM's `--fp8-recipe` / `--fp4-recipe` names (Transformer
    Engine's recipes, TE transformer_engine/common/recipe/__init__.py): bf16 throughout; FP8
    with delayed (amax-history) scaling (`DelayedScaling`); FP8 with per-tensor current scaling
    (`Float8CurrentScaling`, NVIDIA's "FP8-CS"); FP8 with 1×128 activation and 128×128 weight
    blocks (`Float8BlockScaling`); MXFP8, one E8M0 scale per 32 elements
    (`MXFP8BlockScaling`); NVFP4, FP4 with one E4M3 scale per 16 elements and a per-tensor FP32
    scale (`NVFP4BlockScaling`)."""

    bf16 = "bf16"
    fp8_delayed = "fp8-delayed"
    fp8_tensorwise = "fp8-tensorwise"
    fp8_blockwise = "fp8-blockwise"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"


OptimizerState = Literal["fp32", "bf16"]
OPTIMIZER_STATES: tuple[str, ...] = ("fp32", "bf16")
"""Adam's two moments in fp32 (Megatron-LM's default) or bf16 (MLM `--exp-avg-dtype bf16
--exp-avg-sq-dtype bf16` with `--use-precision-aware-optimizer`; DeepSeek-V3 trained so: "we
adopt the BF16 data format instead of FP32 to track the first and second moments in the AdamW
optimizer", DeepSeek-AI 2024, arXiv:2412.19437 §3.3.3). The fp32 master weights stay."""

BF16_BYTES = 2.0
"""The high-precision type of every recipe: Megatron-Bridge's recipes are all `bf16_with_*`
(MB src/megatron/bridge/training/mixed_precision.py)."""


@dataclass(frozen=True)
class RecipeFormat:
    """What one recipe quantizes into, and the passes its quantization takes (per element)."""

    precision: Precision
    quantized: bool
    """the blocks' GEMM operands are quantized (every recipe but bf16)"""
    element_bytes: float
    """bytes per quantized element: 1 (FP8 E4M3/E5M2), 0.5 (FP4 E2M1)"""
    scale_bytes: float
    """scale bytes per element of a quantized activation or gradient copy"""
    weight_scale_bytes: float
    """scale bytes per element of a quantized weight copy"""
    per_tensor: bool
    """one scale per tensor: the columnwise copy is a plain transpose of the rowwise one, and
    an all-gather carries rowwise data only (TE float8_tensor.py `supports_only_rowwise_all_gather`)"""
    amax_pass: bool
    """an amax kernel reads the input before its cast (current scaling: TE csrc/quantizer.cpp
    `Float8CurrentScalingQuantizer::quantize_impl` calls nvte_compute_amax, then the cast;
    NVFP4's per-tensor scale: `NVFP4Quantizer::quantize_impl`, nvte_hadamard_transform_amax)"""
    norm_amax: bool
    """the norm kernel computes its output's amax, so a norm-fed GEMM input needs no amax pass
    (TE csrc/extensions/normalization.cpp, Impl::FUSED_NORM_AMAX_FP8)"""
    norm_casts: bool
    """the norm kernel writes the quantized copy itself, so a norm-fed input needs no cast pass
    (normalization.cpp, Impl::FULLY_FUSED for Float8Quantizer)"""
    hadamard: bool
    """16×16 random Hadamard transforms before the columnwise quantization of inputs and
    gradients (NVFP4BlockScaling: `random_hadamard_transform` on fp4_quant_fwd_inp and
    fp4_quant_bwd_grad)"""
    stochastic_rounding: bool
    """gradients rounded stochastically (NVFP4BlockScaling's fp4_quant_bwd_grad)"""
    transposable_weights: bool
    """the rowwise weight copy can be transposed into the columnwise one without requantizing
    (per-tensor scales, or 2-D weight blocks: 128×128 FP8, 16×16 NVFP4)"""
    param_gather: bool
    """Megatron-Bridge's recipe keeps weights in this format and all-gathers them so
    (`fp8_param_gather` / `fp4_param_gather`, mixed_precision.py)"""
    projection_keeps_bf16_input: bool = False
    """the attention's output projection keeps its BF16 input (the attention output the fused
    kernel keeps anyway) instead of a quantized copy, and quantizes it again in backward: MLM
    core/transformer/attention.py calls set_save_original_input(linear_proj) for every FP8 recipe
    but delayed (TE refuses save_original_input with delayed scaling) and for FP4"""
    swizzled_scales: bool = False
    """each GEMM operand's block scales are rearranged into the GEMM's interleaved layout by a
    kernel of their own before the GEMM (MXFP8 and NVFP4 on Blackwell: TE pytorch/csrc/util.h
    `swizzle_scaling_factors`, called for both operands in extensions/gemm.cpp; the kernel is
    common/swizzle/swizzle.cu `nvte_swizzle_scaling_factors`)"""
    param_gather_in_bf16: bool = False
    """the low-precision weights are all-gathered in BF16 and quantized after the gather (MXFP8:
    MLM core/distributed/param_and_grad_buffer.py, the param buffer is the gradient buffer viewed
    as bf16, `_post_param_sync` → copy_tensors_to_quantized_params)"""


_FP8 = 1.0
_FP4 = 0.5
_OFF = dict(amax_pass=False, norm_amax=False, norm_casts=False, hadamard=False, stochastic_rounding=False)
FORMATS: dict[Precision, RecipeFormat] = {
    Precision.bf16: RecipeFormat(
        Precision.bf16, quantized=False, element_bytes=BF16_BYTES, scale_bytes=0.0, weight_scale_bytes=0.0,
        per_tensor=True, transposable_weights=True, param_gather=False, **_OFF),
    # DelayedScaling: the scale comes from an amax history (MB bf16_with_fp8_delayed_scaling_mixed:
    # amax_history_len 1024, fp8_param_gather True); the cast kernel records the amax.
    Precision.fp8_delayed: RecipeFormat(
        Precision.fp8_delayed, quantized=True, element_bytes=_FP8, scale_bytes=0.0, weight_scale_bytes=0.0,
        per_tensor=True, transposable_weights=True, param_gather=True, **{**_OFF, "norm_casts": True}),
    # Float8CurrentScaling: amax of each tensor as it is cast (MB bf16_with_fp8_current_scaling_mixed:
    # fp8_param_gather True).
    Precision.fp8_tensorwise: RecipeFormat(
        Precision.fp8_tensorwise, quantized=True, element_bytes=_FP8, scale_bytes=0.0, weight_scale_bytes=0.0,
        per_tensor=True, transposable_weights=True, param_gather=True, projection_keeps_bf16_input=True,
        **{**_OFF, "amax_pass": True, "norm_amax": True}),
    # Float8BlockScaling: an FP32 scale per 1×128 block of activations and gradients, per 128×128
    # block of weights (x/grad_block_scaling_dim 1, w_block_scaling_dim 2), each from its block's
    # own amax in the cast kernel (MB bf16_with_fp8_subchannel_scaling_mixed: fp8_param_gather False).
    Precision.fp8_blockwise: RecipeFormat(
        Precision.fp8_blockwise, quantized=True, element_bytes=_FP8, scale_bytes=4.0 / 128,
        weight_scale_bytes=4.0 / (128 * 128), per_tensor=False, transposable_weights=True, param_gather=False,
        projection_keeps_bf16_input=True, **_OFF),
    # MXFP8BlockScaling: one E8M0 (1-byte) scale per 32 consecutive elements, rowwise and
    # columnwise copies each quantized from the BF16 input (MB bf16_with_mxfp8_mixed:
    # fp8_param_gather True, reuse_grad_buf_for_mxfp8_param_ag True).
    Precision.mxfp8: RecipeFormat(
        Precision.mxfp8, quantized=True, element_bytes=_FP8, scale_bytes=1.0 / 32, weight_scale_bytes=1.0 / 32,
        per_tensor=False, transposable_weights=False, param_gather=True, projection_keeps_bf16_input=True,
        param_gather_in_bf16=True, swizzled_scales=True, **_OFF),
    # NVFP4BlockScaling: E2M1 values, one E4M3 (1-byte) scale per 16 elements (16×16 blocks for
    # weights) and an FP32 per-tensor scale from the tensor's amax; Hadamard transforms and
    # stochastic rounding as above (MB bf16_with_nvfp4_mixed: fp4_param_gather True).
    Precision.nvfp4: RecipeFormat(
        Precision.nvfp4, quantized=True, element_bytes=_FP4, scale_bytes=1.0 / 16, weight_scale_bytes=1.0 / 256,
        per_tensor=False, transposable_weights=True, param_gather=True, projection_keeps_bf16_input=True,
        swizzled_scales=True, **{**_OFF, "amax_pass": True, "hadamard": True, "stochastic_rounding": True}),
}

HADAMARD_FLOPS_PER_ELEM = 32.0
"""A 16×16 Hadamard product per 16 elements: 16 multiply-adds per element. TE runs it on the
tensor cores inside the cast kernel ("we are using MMA hardware for computing RHT", csrc/
quantizer.cpp), so it is not timed on the vector units; the pass's bytes are."""
STOCHASTIC_ROUNDING_FLOPS_PER_ELEM = 15.0
"""Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): 10
rounds of two 32-bit multiplies and four other operations give 4 random numbers, ~15
operations per rounded element, on the vector units of the cast kernel."""


MIN_COMPUTE_CAPABILITY = {
    Precision.bf16: 8.0, Precision.fp8_delayed: 8.9, Precision.fp8_tensorwise: 8.9, Precision.fp8_blockwise: 9.0,
    Precision.mxfp8: 10.0, Precision.nvfp4: 10.0}
"""The lowest CUDA compute capability each recipe runs on, as Transformer Engine checks it
(TE pytorch/quantization.py: check_fp8_support 8.9, check_fp8_block_scaling_support 9.0,
check_mxfp8_support and check_nvfp4_support 10.0; BF16 tensor cores from the A100's 8.0)."""


def recipes_for_capability(capability: float) -> tuple[Precision, ...]:
    """Every recipe a GPU of this compute capability runs."""
    return tuple(p for p, lowest in MIN_COMPUTE_CAPABILITY.items() if capability >= lowest)


class RecipeCompute(BaseModel):
    """How one recipe's GEMMs run on this GPU."""

    model_config = INPUT_CONFIG

    gemm: Literal["float8", "bfloat16"] = Field(
        description="The compute entry whose GEMM model (fit or step curve) the recipe's quantized GEMMs use.")
    gemm_tflops: Annotated[RealNumber, within(limits.TFLOPS)] | None = Field(
        None, gt=0, description="Dense peak of the recipe's GEMMs, TFLOP/s (default: that entry's matrix_tflops; "
                                "NVFP4 states the FP4 peak and runs on the float8 entry's fit at it).")
    weight_grad_efficiency: Annotated[RealNumber, within(limits.EFFICIENCY)] | None = Field(
        None, description="The recipe's weight-gradient GEMMs (dW = Xᵀ·dY, the reduction over the tokens) timed at "
                          "their own shape, at this share of the entry's fitted GEMM efficiency (needs its `gemm` "
                          "fit; default: as long as the forward GEMMs). Fitted on published kernel measurements: "
                          "docs/cost-model.md, \"Weight-gradient GEMMs of FP8 block scaling\".")


class PrecisionSupport(BaseModel):
    """The precision recipes a GPU runs (Transformer Engine's checks, TE pytorch/quantization.py:
    FP8 from compute capability 8.9, FP8 block scaling from 9.0, MXFP8 and NVFP4 from 10.0)."""

    model_config = INPUT_CONFIG

    fp8_gemm_layouts: Literal["tn", "any"] | None = Field(
        None, description="tn: FP8 GEMMs take only TN operands (Hopper), so per-tensor FP8 keeps a transposed copy "
                          "for the backward GEMMs; any: every layout (Blackwell; TE utils.py "
                          "is_non_tn_fp8_gemm_supported). Required with an FP8 or FP4 recipe.")
    recipes: dict[Precision, RecipeCompute] = Field(
        min_length=1, description="Each recipe the GPU runs, and the GEMM model and peak it runs at.")
    compute_capability: Annotated[RealNumber, within(limits.COMPUTE_CAPABILITY)] | None = Field(
        None, description="The GPU's CUDA compute capability (8.0 A100, 9.0 H100/H200/H800, 10.0 B200, 10.3 B300): "
                          "a recipe it lists must run on it, and a refusal names the capability a recipe needs.")


def check_support(support: PrecisionSupport | None, compute_datatypes: list[str]) -> None:
    """A system file's `precision` against its `compute`: each recipe's GEMMs need that entry
    (ValueError, which the system's validator turns into a one-line file error)."""
    if support is None:
        return
    for precision in support.recipes:
        lowest = MIN_COMPUTE_CAPABILITY[precision]
        if support.compute_capability is not None and support.compute_capability < lowest:
            raise ValueError(f"precision.recipes.{precision.value}: needs compute capability {lowest:.1f} "
                             f"(Transformer Engine), the GPU has {support.compute_capability:.1f}")
    quantized = [p.value for p in support.recipes if FORMATS[p].quantized]
    if quantized and support.fp8_gemm_layouts is None:
        raise ValueError(f"precision.fp8_gemm_layouts: required with {', '.join(quantized)} (tn or any)")
    for precision, compute in support.recipes.items():
        if compute.gemm not in compute_datatypes:
            raise ValueError(f"precision.recipes.{precision.value}.gemm: {compute.gemm} has no compute entry "
                             f"(the file has {', '.join(compute_datatypes)})")


def supported_precisions(system) -> tuple[Precision, ...]:
    """The recipes a system runs: its `precision.recipes`, or bf16 alone when the file says
    nothing and has bfloat16 compute (files written before recipes existed)."""
    if system.precision is not None:
        return tuple(system.precision.recipes)
    return (Precision.bf16,) if any(d.value == "bfloat16" for d in system.compute) else ()


def system_recipe(system, precision: Precision) -> RecipeCompute:
    """How `precision`'s GEMMs run on `system` (a costmodel.inputs.system.System); an InputError naming
    the GPU and the recipes it has when it has not this one."""
    have = supported_precisions(system)
    if precision not in have:
        gpu = f"{system.gpu} (system {system.name!r})" if system.gpu else f"system {system.name!r}"
        runs = ", ".join(p.value for p in have) or "none"
        capability = None if system.precision is None else system.precision.compute_capability
        why = ""
        if capability is not None and capability < MIN_COMPUTE_CAPABILITY[precision]:
            why = (f": Transformer Engine runs it from compute capability {MIN_COMPUTE_CAPABILITY[precision]:.1f}, "
                   f"this GPU is {capability:.1f}")
        raise InputError(f"precision {precision.value}: {gpu} does not run it{why} (its precisions: {runs})")
    if system.precision is None:
        return RecipeCompute(gemm="bfloat16")
    return system.precision.recipes[precision]


MASTER_WEIGHT_BYTES = 4.0
"""The fp32 main copy the optimizer updates (and, under current scaling, reads once more for
the amax of the weights it casts: TE pytorch/tensor/utils.py
`_cast_master_weights_to_fp8_current_scaling` calls compute_amax on each master shard)."""


@dataclass(frozen=True)
class RecipeCosts:
    """One recipe on one GPU with one setting of its options: bytes per element and the passes
    of its quantization, as the formulas read them (costmodel.terms.quantize, block, stage_state,
    data_parallel). Built once per problem by `recipe_costs`."""

    format: RecipeFormat
    copy_bytes: float
    """one quantized activation or gradient copy, per element (values and scales)"""
    weight_copy_bytes: float
    """one quantized weight copy, per element"""
    gemm_bytes: float
    """a GEMM operand's bytes in the fitted GEMM model's convention (A, B and C at the GEMM
    datatype's size, as the FP8 microbenchmarks were fitted: docs/cost-model.md)"""
    copies: float
    """quantized copies of an operand its GEMMs need: rowwise for the forward (or dgrad) GEMM and
    columnwise for the other; one for per-tensor FP8 on a GPU whose FP8 GEMMs take any layout"""
    gathered_copies: float
    """copies made before a sequence-parallel all-gather (per-tensor FP8 gathers rowwise only;
    its transpose follows the gather)"""
    transpose_after_gather: bool
    """a transpose pass over the gathered tensor (per-tensor FP8 on a TN-only GPU)"""
    low_precision_param_gather: bool
    weight_storage_bytes: float
    """a block weight as kept (sharded under ZeRO-3): BF16, or the quantized param itself"""
    weight_cache_bytes: float
    """quantized weight copies kept for the whole step beside the storage (TE's weight workspace,
    refreshed on the first microbatch: MLM core/transformer/module.py set_is_first_microbatch)"""
    weight_gather_bytes: float
    """a block weight on the wire of the data-parallel (or ZeRO-3) all-gather"""
    optimizer_weight_bytes: float
    """what the optimizer step writes per parameter (the BF16 weight, or the quantized shard) and
    reads for its amax"""
    weight_step_passes: tuple[float, ...]
    """bytes per weight element of each once-per-step quantization pass (cast, transpose) of a
    quantized block (the BF16 blocks' share is mixed in by costmodel.terms.block_terms)"""
    bf16_block_share: float
    """the share of blocks kept in BF16 (first and last N)"""


def recipe_peak_name(precision: Precision, fmt: RecipeFormat) -> str:
    """The peak MFU divides by under `precision`: that of the datatype its GEMMs run (FP8 for the
    fp8-* recipes and MXFP8, FP4 for NVFP4, BF16 for bf16), whose TFLOP/s the system file's
    recipe states (`gemm` / `gemm_tflops`)."""
    datatype = "bfloat16" if not fmt.quantized else "float4" if fmt.element_bytes < 1 else "float8"
    return f"{datatype} dense matrix peak ({precision.value} recipe)"


def recipe_costs(precision: Precision, fp8_gemm_layouts: str, low_precision_param_gather: bool,
                 bf16_block_share: float = 0.0) -> RecipeCosts:
    """The per-element constants of `precision` on a GPU whose FP8 GEMMs take `fp8_gemm_layouts`
    ("tn" or "any"), weights kept and gathered in the recipe's format or not, with
    `bf16_block_share` of the blocks in BF16 (those blocks' weights count at BF16 here; their
    compute is mixed in by costmodel.terms.block_terms)."""
    fmt = FORMATS[precision]
    hp = BF16_BYTES
    copy = fmt.element_bytes + fmt.scale_bytes
    weight_copy = fmt.element_bytes + fmt.weight_scale_bytes
    one_copy = fmt.per_tensor and fmt.quantized and fp8_gemm_layouts == "any"
    copies = 1.0 if one_copy else 2.0
    lpg = low_precision_param_gather and fmt.quantized
    if not fmt.quantized:
        storage, cache, gather, write, passes = hp, 0.0, hp, hp, ()
    elif lpg:
        storage = weight_copy
        cache = (copies - 1) * weight_copy            # the columnwise copy beside the param
        gather = hp if fmt.param_gather_in_bf16 else weight_copy
        amax = MASTER_WEIGHT_BYTES if fmt.amax_pass or precision is Precision.fp8_blockwise else 0.0
        write = (hp if fmt.param_gather_in_bf16 else weight_copy) + amax
        if fmt.param_gather_in_bf16:                  # MXFP8: both copies quantized after the bf16 gather
            passes = (hp + copies * weight_copy,)
        elif copies > 1 and fmt.transposable_weights:  # the columnwise copy transposed from the param
            passes = (2 * weight_copy,)
        else:
            passes = ()
    else:
        storage, cache, gather, write = hp, copies * weight_copy, hp, hp
        passes = ((hp,) if fmt.amax_pass else ()) + (hp + copies * weight_copy,)
    share = bf16_block_share if fmt.quantized else 0.0
    return RecipeCosts(
        format=fmt, copy_bytes=copy if fmt.quantized else hp, weight_copy_bytes=weight_copy if fmt.quantized else hp,
        gemm_bytes=fmt.element_bytes, copies=copies, gathered_copies=1.0 if fmt.per_tensor else copies,
        transpose_after_gather=fmt.quantized and fmt.per_tensor and not one_copy,
        low_precision_param_gather=lpg,
        weight_storage_bytes=(1 - share) * storage + share * hp, weight_cache_bytes=(1 - share) * cache,
        weight_gather_bytes=(1 - share) * gather + share * hp,
        optimizer_weight_bytes=(1 - share) * write + share * hp,
        weight_step_passes=passes, bf16_block_share=share)


def bf16_costs() -> RecipeCosts:
    """The bf16 recipe's constants: the blocks a recipe keeps in BF16 are costed with these."""
    return recipe_costs(Precision.bf16, "tn", False)
