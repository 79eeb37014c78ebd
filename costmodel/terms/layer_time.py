"""Kernel time helpers and per-element FLOP constants shared by the block (costmodel.terms.block)
and the mixture-of-experts layer (costmodel.terms.moe): a GEMM on the system's fitted model or
roofline, a GEMM with its operands moved once, and an element-wise layer's roofline.
Both modules import them from here, so neither imports the other's helpers (no cycle)."""

from __future__ import annotations

from costmodel.terms.context import Context
from costmodel.terms.kernel_time import gemm_time_s

# FLOP per element of the element-wise layers (forward): layer norm = mean, variance,
# normalize, scale, shift (~8); softmax with scale and causal mask (~6: scale, mask, max,
# subtract-exp, sum, divide); dropout (2: compare, multiply); residual add + dropout (3);
# GeLU in its tanh form (~8). These only matter when a layer is compute bound, which
# element-wise layers rarely are.
LAYERNORM_FLOPS_PER_ELEM = 8.0
SOFTMAX_FLOPS_PER_ELEM = 6.0
DROPOUT_FLOPS_PER_ELEM = 2.0
RESIDUAL_FLOPS_PER_ELEM = 3.0
GELU_FLOPS_PER_ELEM = 8.0
# RMSNorm (Zhang & Sennrich 2019): square, sum, reciprocal square root, scale (~5; no mean,
# no shift).
RMSNORM_FLOPS_PER_ELEM = 5.0
# Activations per element of the f-wide output: squared ReLU (max, multiply: 2); the gates
# (Shazeer 2020) Swish(x)·y (x·sigmoid(x) ~5, times y: 6) and GeLU(x)·y (8 + 1: 9).
SQUARED_RELU_FLOPS_PER_ELEM = 2.0
SWIGLU_FLOPS_PER_ELEM = 6.0
GEGLU_FLOPS_PER_ELEM = 9.0
# Rotary position embedding (Su et al. 2021) on Q and K: x·cos + rotate(x)·sin (3 per element).
ROPE_FLOPS_PER_ELEM = 3.0
ACTIVATION_FLOPS_PER_ELEM = {"gelu": GELU_FLOPS_PER_ELEM, "squared_relu": SQUARED_RELU_FLOPS_PER_ELEM,
                             "swiglu": SWIGLU_FLOPS_PER_ELEM, "geglu": GEGLU_FLOPS_PER_ELEM}
# FlashAttention keeps one fp32 log-sum-exp per query row and head for its backward pass.
SOFTMAX_STATS_BYTES = 4.0


def gemm_s(c: Context, xp, rows, cols, depth, num_bytes, batch=1.0, high_precision=False):
    """Time of `batch` matrix multiplies C[rows, cols] = A[rows, depth] · B[depth, cols] moving
    `num_bytes`: the system's fitted shape-aware model when it has one
    (costmodel.terms.kernel_time.gemm_time_s), else the roofline on the step curves by FLOP; either
    pays the whole-step launch gap (in the fitted model's launch, costmodel.terms.step_terms). Under a
    precision recipe the blocks' GEMMs run at its rate, and `high_precision` ones (attention,
    the output layer, the router) at BF16's (costmodel.terms.context)."""
    peak, curve, fit = c.compute.matrix_flops_per_s, c.compute.matrix_curve, c.compute.gemm
    if high_precision and c.compute.hp_matrix_flops_per_s is not None:
        peak, curve, fit = c.compute.hp_matrix_flops_per_s, c.compute.hp_matrix_curve, c.compute.hp_gemm
    if fit is not None:
        return gemm_time_s(fit, xp, rows, cols, depth, num_bytes, peak, c.memory.hbm_bytes_per_s, batch)
    flops = 2 * batch * rows * cols * depth
    compute = flops / (peak * xp.lookup(curve, flops))
    memory = num_bytes / (c.memory.hbm_bytes_per_s * xp.lookup(c.memory.hbm_curve, num_bytes))
    return xp.maximum(compute, memory) + c.step.kernel_gap_s


def matmul_s(c: Context, xp, rows, cols, inner, high_precision=False):
    """Time of C[rows, cols] = A[rows, inner]·B[inner, cols] (M = rows, the tokens; N = cols,
    the output columns; K = inner, the reduction): `gemm_s` with A, B and C moved once in the
    GEMM's datatype (a recipe's quantized operands, or BF16 when `high_precision`)."""
    e = c.precision.elem_bytes if high_precision else c.precision.gemm_elem_bytes
    return gemm_s(c, xp, rows, cols, inner, e * (rows * inner + inner * cols + rows * cols),
                  high_precision=high_precision)


def weight_grad_s(c: Context, xp, shapes, experts=1.0):
    """Backward's weight-gradient time of quantized GEMMs C[rows, cols] = A[rows, inner]·B[inner,
    cols] (`shapes`: (rows, cols, inner) each; `experts` of each in one grouped kernel), where the
    recipe times them on their own (ComputeRates.weight_grad_gemm): dW[inner, cols] = Aᵀ·dC at
    its own shape, the reduction over the rows, its operands and result moved once in the
    GEMM's datatype. None where the recipe does not: each is as long as its forward GEMM
    (LayerCost.weight_grad_s's default)."""
    timing = c.compute.weight_grad_gemm
    if timing is None:
        return None
    e, total = c.precision.gemm_elem_bytes, 0.0
    for rows, cols, inner in shapes:
        num_bytes = e * experts * (rows * inner + rows * cols + inner * cols)
        total = total + gemm_time_s(timing, xp, inner, cols, rows, num_bytes, c.compute.matrix_flops_per_s,
                                    c.memory.hbm_bytes_per_s, experts)
    return total


def eltwise_s(c: Context, xp, elems, flops_per_elem, bytes_per_elem):
    """Roofline time of an element-wise layer over `elems` elements; its memory side pays the
    HBM's fixed per-kernel cost (0 unless the system file is calibrated)."""
    flops = elems * flops_per_elem
    num_bytes = elems * bytes_per_elem
    compute = flops / (c.compute.vector_flops_per_s * xp.lookup(c.compute.vector_curve, flops))
    memory = c.memory.hbm_latency_s + num_bytes / (c.memory.hbm_bytes_per_s * xp.lookup(c.memory.hbm_curve, num_bytes))
    return xp.maximum(compute, memory)
