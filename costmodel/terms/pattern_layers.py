"""A layer pattern's layers as cost records (costmodel.terms.layers.LayerCost) and what each
keeps for backward: a Mamba-2 mixer (costmodel.inputs.mamba), and the attention, MLP and MoE
layers that a pattern places on their own (each a pre-norm residual layer, Megatron-Core's
MambaStack / Nemotron-H's NemotronHBlock).

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
"""

from __future__ import annotations

from dataclasses import replace

from costmodel.terms.context import MASK_BYTES, Context
from costmodel.terms.block_memory import StoredActivations, block_stored_activation_bytes
from costmodel.terms.layer_time import RMSNORM_FLOPS_PER_ELEM, eltwise_s, matmul_s
from costmodel.terms.layers import LayerCost, layer_tokens
from costmodel.inputs.mamba import (mamba_scan_flops_per_token, mamba_scan_recompute_flops_per_token,
                                   mamba_stored_bytes_per_token)
from costmodel.terms.quantize import GemmOperands

__all__ = ["mamba_layer", "PATTERN_STORED"]


def mamba_layer(c: Context, m, xp) -> LayerCost:
    """One Mamba-2 mixer: its two projections, conv, chunked scan and gated norm (above)."""
    shape, h, t = c.model.mamba, c.model.hidden, m.tp
    tokens, ln_tokens = layer_tokens(c, m, xp)
    in_cols, inner = shape.in_proj_cols / t, shape.inner / t
    projections = matmul_s(c, xp, tokens, in_cols, h) + matmul_s(c, xp, tokens, h, inner)
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
    return LayerCost("mamba", gemm_s=projections + scan, eltwise_s=eltwise, matrix_flops=flops, tp_regions=1.0,
                     gemms=gemms, activation_grad_s=projections + 2 * scan + 2 * eltwise, weight_grad_s=projections,
                     kernel_recompute_s=rerun, kernel_recompute_flops=rerun_flops)


def _mamba_stored(c: Context, m, xp) -> StoredActivations:
    """A Mamba layer's stored bytes (costmodel.inputs.mamba.mamba_stored_bytes_per_token): its
    input and norm output on the sequence-parallel shard (in_proj's input gathered unless the
    all-gather is redone), in_proj's output and the three D-wide tensors over tp, and the
    residual add's dropout mask (MambaLayer's hidden_dropout) when the model trains with dropout.
    Full recomputation keeps the input only, and its backward needs the layer's whole set again."""
    tokens, _ = layer_tokens(c, m, xp)
    q = c.precision.recipe.copy_bytes if c.precision.quantized else c.precision.elem_bytes
    parts = mamba_stored_bytes_per_token(c.model.mamba, c.model.hidden, c.precision.elem_bytes, m.tp, gemm_input_bytes=q)
    sp_split = xp.where(m.seq_par, m.tp, 1.0)
    gemm_split = xp.where(m.seq_par & m.seq_par_ag_redo, m.tp, 1.0)
    layer_input = tokens * parts["input"] / sp_split
    mask = (MASK_BYTES if c.model.dropout else 0.0) * tokens * c.model.hidden / sp_split
    full = (layer_input + mask + tokens * parts["norm"] / gemm_split
            + tokens * (parts["in_proj_out"] + parts["scan_out"] + parts["norm_in"] + parts["out_proj_in"]))
    return StoredActivations(stored=xp.where(m.recompute_full, layer_input, full), full=full,
                             workspace=xp.where(m.recompute_full, full, 0.0))


def _mlp_side(c: Context, m, xp):
    """What a transformer block stores for its MLP half beside the MLP's own tensors: the
    second norm's input, the second dropout mask, the up projection's input (gathered)."""
    tokens, _ = layer_tokens(c, m, xp)
    q = c.precision.recipe.copy_bytes if c.precision.quantized else c.precision.elem_bytes
    sp_split = xp.where(m.seq_par, m.tp, 1.0)
    gemm_split = xp.where(m.seq_par & m.seq_par_ag_redo, m.tp, 1.0)
    mask = MASK_BYTES if c.model.dropout else 0.0
    return (c.precision.elem_bytes + mask) * tokens * c.model.hidden / sp_split + q * tokens * c.model.hidden / gemm_split


def _attention_part(c: Context, m, xp) -> tuple:
    """(the attention half of a transformer block's StoredActivations, the MLP side's bytes): a
    block with no MLP (feedforward 0) less its second norm, mask and up-projection input."""
    whole = block_stored_activation_bytes(replace(c, model=replace(c.model, feedforward=0.0)), m, xp)
    return whole, _mlp_side(c, m, xp)


def _attention_stored(c: Context, m, xp) -> StoredActivations:
    """An attention layer of a pattern: the attention half of block_stored_activation_bytes."""
    whole, side = _attention_part(c, m, xp)
    return StoredActivations(stored=xp.where(m.recompute_full, whole.stored, whole.stored - side),
                             full=whole.full - side, workspace=whole.workspace - xp.where(m.recompute_full, side, 0.0))


def _mlp_half(c: Context, m, xp, moe: bool) -> StoredActivations:
    """An MLP or MoE layer of a pattern: a transformer block's bytes less its attention half."""
    block = block_stored_activation_bytes(c, m, xp, moe)
    attention, side = _attention_part(c, m, xp)
    tokens, _ = layer_tokens(c, m, xp)
    layer_input = c.precision.elem_bytes * tokens * c.model.hidden / xp.where(m.seq_par, m.tp, 1.0)
    kept = block.stored - attention.stored + side
    return StoredActivations(stored=xp.where(m.recompute_full, layer_input, kept),
                             full=block.full - attention.full + side,
                             workspace=block.workspace - attention.workspace + xp.where(m.recompute_full, side, 0.0))


PATTERN_STORED = {
    "mamba": _mamba_stored,
    "attention_layer": _attention_stored,
    "mlp_layer": lambda c, m, xp: _mlp_half(c, m, xp, False),
    "moe_layer": lambda c, m, xp: _mlp_half(c, m, xp, True),
}
"""What each pattern layer kind keeps for backward (costmodel.terms.block_memory.KIND_STORED)."""
