"""A layer pattern's own layer as a cost record (costmodel.terms.layers.LayerCost): a Mamba-2
mixer (costmodel.inputs.mamba). The attention, MLP and MoE layers that a pattern places on
their own (each a pre-norm residual layer, Megatron-Core's MambaStack / Nemotron-H's
NemotronHBlock) are a transformer block's layers (costmodel.terms.block.BLOCK_KINDS), their
stored bytes those layers' records.

The Mamba-2 layer, one microbatch, one GPU (T = b·s tokens; tensor parallelism splits heads
and groups, so every width below D, G, H is over tp):

    in_proj    GEMM T × (2D + 2GN + H)/tp × h        (column-parallel)
    conv1d     element-wise over T·(D + 2GN)/tp: 2·K FLOP per element, read and write
    SSD scan   the chunked scan's products (costmodel.inputs.mamba, Dao & Gu 2024 §6): batched
               matrix products on tensor cores, timed as one GEMM of the same FLOPs with
               T rows, D/tp columns and the scan's FLOPs per row and column as its depth
    norm       RMSNormGated over T·D/tp: read y and z, write the output
    out_proj   GEMM T × h × D/tp                      (row-parallel)

Backward: twice forward's work (costmodel.inputs.mamba): the projections' activation and
weight gradients, the scan's backward kernels (activation gradient only: it has no weights)
at twice its forward, the element-wise passes twice; and, as a fused attention kernel's scores
(LayerCost.kernel_recompute_s), the conv and the scan's C·Bᵀ, chunk states and state passing
that the fused kernel's backward reruns.

Stored (costmodel.inputs.mamba.mamba_stored_bytes_per_token, the tensors Megatron-Core and
mamba_ssm save): in_proj's input, the pre-norm's output (gathered under sequence parallelism
unless the all-gather is redone), in_proj's output and the three D-wide tensors over tp; the
layer's input and its residual's dropout mask are the block's norm and residual records.
No recompute module drops any of it; full recomputation keeps the block's input.
"""

from __future__ import annotations

from costmodel.terms.context import Context
from costmodel.terms.layer_time import RMSNORM_FLOPS_PER_ELEM, eltwise_s, matmul_s, weight_grad_s
from costmodel.terms.layers import LayerCost, layer_tokens, stored_gemm_input_bytes
from costmodel.inputs.mamba import (mamba_scan_flops_per_token, mamba_scan_recompute_flops_per_token,
                                   mamba_stored_bytes_per_token)
from costmodel.terms.quantize import GemmOperands

__all__ = ["mamba_layer"]


def mamba_layer(c: Context, m, xp) -> LayerCost:
    """One Mamba-2 mixer: its two projections, conv, chunked scan and gated norm (above)."""
    shape, h, t = c.model.mamba, c.model.hidden, m.tp
    tokens, ln_tokens = layer_tokens(c, m, xp)
    in_cols, inner = shape.in_proj_cols / t, shape.inner / t
    projections = matmul_s(c, xp, tokens, in_cols, h) + matmul_s(c, xp, tokens, h, inner)
    weight_grads = weight_grad_s(c, xp, ((tokens, in_cols, h), (tokens, h, inner)))
    scan_flops = tokens * mamba_scan_flops_per_token(shape, c.model.seq) / t
    scan = matmul_s(c, xp, tokens, inner, scan_flops / (2 * tokens * inner))
    e = c.precision.elem_bytes
    conv = eltwise_s(c, xp, tokens * shape.conv_channels / t, 2.0 * shape.conv_kernel, 2 * e)
    # RMSNormGated: the RMSNorm of y times SiLU(z), one multiply more per element than an RMSNorm
    # (megatron/core/ssm/mamba_mixer.py, norm(y, z)); it reads y and z and writes the output
    gated_norm = eltwise_s(c, xp, tokens * inner, RMSNORM_FLOPS_PER_ELEM + 1.0, 3 * e)
    flops = 2 * tokens * h * (in_cols + inner) + scan_flops
    gathered = m.seq_par
    gemms = (GemmOperands(ln_tokens * h, tokens * in_cols, h * in_cols, gathered, False, t, norm_fed=True),
             GemmOperands(tokens * inner, ln_tokens * h, inner * h, False, gathered, t))
    eltwise = conv + gated_norm
    # the fused kernel's backward reruns the conv and part of the scan (costmodel.inputs.mamba)
    rerun_flops = tokens * mamba_scan_recompute_flops_per_token(shape, c.model.seq) / t
    rerun = conv + matmul_s(c, xp, tokens, inner, rerun_flops / (2 * tokens * inner))
    parts = mamba_stored_bytes_per_token(shape, h, e, t, gemm_input_bytes=stored_gemm_input_bytes(c))
    return LayerCost("mamba", gemm_s=projections + scan, eltwise_s=eltwise, matrix_flops=flops, tp_regions=1.0,
                     gemms=gemms, activation_grad_s=projections + 2 * scan + 2 * eltwise,
                     weight_grad_s=projections if weight_grads is None else weight_grads,
                     kernel_recompute_s=rerun, kernel_recompute_flops=rerun_flops,
                     stored_bytes=tokens * (parts["in_proj_out"] + parts["scan_out"] + parts["norm_in"]
                                            + parts["out_proj_in"]),
                     stored_gathered_bytes=tokens * parts["norm"])
