"""The attention layer of a block as a cost record (costmodel.terms.layers.LayerCost): its
projections (QKV and the output projection; latent attention's down and up projections), the
attention core (fused FlashAttention or Megatron-LM's four unfused kernels) and RoPE. The
formulas and their sources are in costmodel.terms.block's docstring and docs/cost-model.md
("Attention").
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.context import MASK_BYTES, Context
from costmodel.inputs.model import CAUSAL_ATTENTION_SHARE
from costmodel.terms.kernel_time import attention_time_s
from costmodel.terms.layer_time import (DROPOUT_FLOPS_PER_ELEM, ROPE_FLOPS_PER_ELEM, SOFTMAX_FLOPS_PER_ELEM,
                                        SOFTMAX_STATS_BYTES, eltwise_s, gemm_s, matmul_s, weight_grad_s)
from costmodel.terms.layers import (LayerCost, ModuleRerun, dropout_mask_bytes, layer_tokens, norm_flops_per_elem,
                                    norm_output_bytes, stored_gemm_input_bytes)
from costmodel.terms.quantize import GemmOperands


def fused_attention_s(c: Context, xp, pairs, batch_heads, vector_flops, num_bytes, steps=1.0, head_size=None):
    """Time of a fused attention kernel doing `pairs` s×s×d products per (batch, head) over
    `batch_heads` of them; with context parallelism, of the `steps` = cp ring-step kernels
    that each do `pairs` (s/cp)×(s/cp)×d products (1/cp of the whole core, in cp launches
    of shorter sequences). With a fitted attention model, that model
    (costmodel.terms.kernel_time.attention_time_s). Otherwise a roofline: its tensor-core work (a batched
    GEMM), its element-wise softmax work on the vector units (overlapped with the matrix work,
    as FlashAttention pipelines them) and its HBM traffic, whichever is slowest."""
    chunk = c.model.seq / steps
    d = c.model.head_size if head_size is None else head_size
    if c.compute.attention is not None:
        return steps * attention_time_s(c.compute.attention, pairs, batch_heads, chunk, d)
    vector = vector_flops / (c.compute.vector_flops_per_s * xp.lookup(c.compute.vector_curve, vector_flops))
    return xp.maximum(gemm_s(c, xp, chunk, chunk, d, num_bytes, batch=pairs * batch_heads * steps,
                             high_precision=True), vector)


@dataclass(frozen=True)
class AttentionProjections:
    """The attention's projections of one block, one microbatch, one GPU, forward."""

    in_s: object
    """the projections into the heads (QKV; latent attention's down and up projections)"""
    out_s: object
    """the output projection"""
    matrix_flops: object
    eltwise_s: object
    """latent attention's two RMSNorms over the compressed query and K/V (0 otherwise)"""
    rope_elems: object
    """elements RoPE rotates: the query and key columns that carry positions"""
    gemms: tuple
    up_s: object = 0.0
    """latent attention's up projections (part of in_s): what recompute_modules mla_up_proj reruns"""
    up_flops: object = 0.0
    """their quantized operands (costmodel.terms.quantize)"""
    weight_grad_s: object = None
    """backward's weight-gradient GEMMs of every projection where the recipe times them on their
    own (costmodel.terms.layer_time.weight_grad_s; None: as long as in_s + out_s)"""


def attention_projections(c: Context, xp, tokens, ln_tokens, t, gathered, norm_out, norm_flops) -> AttentionProjections:
    """QKV and the output projection (grouped-query attention: h → (a + 2g)·d/t and a·d/t → h),
    or latent attention's five projections (costmodel.inputs.latent_attention): the down projections
    h → r_q and h → r_kv + d_r whole on every tp rank, on the sequence-parallel shard
    (`ln_tokens`) as Megatron-LM's MLASelfAttention runs them, the up projections r_q → a·d_qk/t
    and r_kv → a·(d_n + d_v)/t and the output a·d_v/t → h on the gathered tokens."""
    e, h, heads = c.precision.elem_bytes, c.model.hidden, c.model.heads / t
    d, d_v = c.model.head_size, c.model.value_head_size
    if not c.model.latent:
        q_cols, kv_cols = heads * d, c.model.kv_heads / t * d
        qkv_cols = q_cols + 2 * kv_cols
        gemms = (GemmOperands(ln_tokens * h, tokens * qkv_cols, h * qkv_cols, gathered, False, t, norm_fed=True),
                 GemmOperands(tokens * q_cols, ln_tokens * h, q_cols * h, False, gathered, t, projection=True))
        return AttentionProjections(
            in_s=matmul_s(c, xp, tokens, qkv_cols, h), out_s=matmul_s(c, xp, tokens, h, q_cols),
            matrix_flops=2 * tokens * h * (qkv_cols + q_cols), eltwise_s=0.0,
            rope_elems=tokens * (q_cols + kv_cols), gemms=gemms,
            weight_grad_s=weight_grad_s(c, xp, ((tokens, qkv_cols, h), (tokens, h, q_cols))))
    r_q, r_kv, d_r = c.model.q_lora_rank, c.model.kv_lora_rank, c.model.rope_head_size
    q_in = r_q if r_q else h                          # no query compression: h → a·d_qk directly
    q_cols, kv_up_cols, out_cols = heads * d, heads * (d - d_r + d_v), heads * d_v
    down_cols = r_q + r_kv + d_r
    up_s = matmul_s(c, xp, tokens, q_cols, q_in) + matmul_s(c, xp, tokens, kv_up_cols, r_kv)
    in_s = matmul_s(c, xp, ln_tokens, down_cols, h) + up_s
    flops = 2 * (ln_tokens * h * down_cols + tokens * (q_in * q_cols + r_kv * kv_up_cols + out_cols * h))
    # the RMSNorms over the gathered compressed query and K/V (read, write)
    latent_norms = eltwise_s(c, xp, tokens * (r_q + r_kv), norm_flops, e + norm_out)
    gemms = (GemmOperands(ln_tokens * h, ln_tokens * down_cols, h * down_cols, False, False, t, norm_fed=True),
             GemmOperands(tokens * (r_q + r_kv), tokens * (q_cols + kv_up_cols), r_q * q_cols + r_kv * kv_up_cols),
             GemmOperands(tokens * out_cols, ln_tokens * h, out_cols * h, False, gathered, t, projection=True))
    return AttentionProjections(in_s=in_s, out_s=matmul_s(c, xp, tokens, h, out_cols), matrix_flops=flops, eltwise_s=latent_norms,
                                rope_elems=tokens * (heads * d_r + d_r), gemms=gemms, up_s=up_s,
                                up_flops=2 * tokens * (q_in * q_cols + r_kv * kv_up_cols),
                                weight_grad_s=weight_grad_s(c, xp, ((ln_tokens, down_cols, h), (tokens, q_cols, q_in),
                                                                    (tokens, kv_up_cols, r_kv), (tokens, h, out_cols))))


@dataclass(frozen=True)
class AttentionCore:
    """The attention core of one block, one microbatch, one GPU, forward."""

    gemm_s: object
    """its matrix work: the fused kernel, or the scores and context GEMMs"""
    eltwise_s: object
    """an unfused core's softmax and dropout (0 when fused)"""
    flops: object
    kernel_recompute_s: object
    kernel_recompute_flops: object
    selective_s: object
    """what attn_only (or recompute_modules core_attn) reruns: the unfused core (0 when fused)"""
    selective_flops: object
    stored_bytes: object
    """what it keeps for backward: the softmax output, its dropout mask and the dropout's output
    (unfused; Korthikanti et al. 2022 §4's 5·a·s²·b), or one fp32 log-sum-exp per query row (fused)"""


def _core_shape(c: Context, m):
    """(b, heads on this GPU, queries per sequence on this GPU, K/V columns on this GPU)."""
    return m.microbatch, c.model.heads / m.tp, c.model.seq / m.cp, c.model.kv_heads / m.tp * c.model.head_size


def _core_flops(c: Context, m):
    """(the core's forward FLOPs as the hardware does them, the causal half of Q·Kᵀ): MFU's
    causal half of the scores and context GEMMs; latent attention's values and output are d_v
    wide, its queries and keys d_qk."""
    b, heads, q_len, _ = _core_shape(c, m)
    score_flops = 2 * b * heads * q_len * c.model.seq * c.model.head_size      # Q·Kᵀ; the context GEMM (·V) is as large
    causal_score_flops = CAUSAL_ATTENTION_SHARE * score_flops
    if c.model.latent:
        return (CAUSAL_ATTENTION_SHARE * (score_flops + 2 * b * heads * q_len * c.model.seq * c.model.value_head_size),
                causal_score_flops)
    return 2 * causal_score_flops, causal_score_flops


def fused_core(c: Context, m, xp) -> AttentionCore:
    """One FlashAttention kernel per ring step (Dao et al. 2022): HBM sees Q read and the output
    written for this GPU's tokens, K and V read for all s (the ring brings every chunk) and the
    softmax statistics written; two s×s×d products per head forward, 1/cp of them on this GPU,
    run as cp kernels of s/cp queries and keys (p2p and all_gather). Its backward recomputes
    Q·Kᵀ and the softmax on chip. Ulysses (a2a): one kernel over the whole sequence with heads/cp
    of the tp rank's heads, the same FLOPs, reading only those heads' K and V."""
    e, s, d = c.precision.elem_bytes, c.model.seq, c.model.head_size
    b, heads, q_len, kv_cols = _core_shape(c, m)
    tokens, q_cols = b * q_len, heads * d
    core_flops, causal_score_flops = _core_flops(c, m)
    score_elems = b * heads * q_len * s
    dropout_flops = DROPOUT_FLOPS_PER_ELEM if c.model.dropout else 0.0
    kernel_bytes = e * (tokens * 2 * q_cols + b * s * 2 * kv_cols) + SOFTMAX_STATS_BYTES * b * heads * q_len
    kv_read = e * b * s * 2 * kv_cols
    core_head = None
    if c.model.latent:
        kernel_bytes = e * (tokens + b * s) * heads * (d + c.model.value_head_size) + SOFTMAX_STATS_BYTES * b * heads * q_len
        kv_read = e * b * s * heads * (d + c.model.value_head_size)
        core_head = (d + c.model.value_head_size) / 2          # two products of d_qk and d_v: their mean, twice
    forward_elem_flops = score_elems * (SOFTMAX_FLOPS_PER_ELEM + dropout_flops)
    ring = fused_attention_s(c, xp, 2, b * heads, forward_elem_flops, kernel_bytes, steps=m.cp, head_size=core_head)
    ring_recompute = fused_attention_s(c, xp, 1, b * heads, score_elems * SOFTMAX_FLOPS_PER_ELEM, 0.0, steps=m.cp)
    a2a = fused_attention_s(c, xp, 2, b * heads / m.cp, forward_elem_flops, kernel_bytes - kv_read * (1 - 1 / m.cp),
                            head_size=core_head)
    a2a_recompute = fused_attention_s(c, xp, 1, b * heads / m.cp, score_elems * SOFTMAX_FLOPS_PER_ELEM, 0.0)
    core_gemm = xp.where(m.cp_comm_a2a, a2a, ring)
    kernel_recompute = xp.where(m.cp_comm_a2a, a2a_recompute, ring_recompute)
    # Sliding-window blocks: the kernel skips the tiles outside the band (the mean over the
    # model's blocks, Context.model.attention_core_scale).
    scale = c.model.attention_core_scale
    if scale != 1.0:
        core_gemm, kernel_recompute = scale * core_gemm, scale * kernel_recompute
        core_flops, causal_score_flops = scale * core_flops, scale * causal_score_flops
    return AttentionCore(gemm_s=core_gemm, eltwise_s=0.0, flops=core_flops, kernel_recompute_s=kernel_recompute,
                         kernel_recompute_flops=causal_score_flops, selective_s=0.0, selective_flops=0.0,
                         stored_bytes=SOFTMAX_STATS_BYTES * b * heads * q_len)


def unfused_core(c: Context, m, xp) -> AttentionCore:
    """Megatron-LM's four kernels passing the b·a·s² score matrix through HBM: scores GEMM,
    softmax, dropout, context GEMM. It computes the whole masked score matrix: a sliding window
    saves nothing. Selective recomputation reruns all four."""
    e, s, d = c.precision.elem_bytes, c.model.seq, c.model.head_size
    b, heads, q_len, kv_cols = _core_shape(c, m)
    core_flops, _ = _core_flops(c, m)
    score_elems = b * heads * q_len * s
    scores = gemm_s(c, xp, q_len, s, d, e * (b * heads * q_len * d + b * kv_cols / d * s * d + score_elems),
                    batch=b * heads, high_precision=True)
    context = gemm_s(c, xp, q_len, d, s, e * (score_elems + b * kv_cols / d * s * d + b * heads * q_len * d),
                     batch=b * heads, high_precision=True)
    if c.model.latent:                                      # ·V with d_v-wide values and output
        d_v = c.model.value_head_size
        context = gemm_s(c, xp, q_len, d_v, s, e * (score_elems + b * heads * (s + q_len) * d_v), batch=b * heads,
                         high_precision=True)
    softmax = eltwise_s(c, xp, score_elems, SOFTMAX_FLOPS_PER_ELEM, 2 * e)
    dropout = eltwise_s(c, xp, score_elems, DROPOUT_FLOPS_PER_ELEM, 2 * e + MASK_BYTES) if c.model.dropout else 0.0
    core_gemm, core_eltwise = scores + context, softmax + dropout
    return AttentionCore(gemm_s=core_gemm, eltwise_s=core_eltwise, flops=core_flops, kernel_recompute_s=0.0,
                         kernel_recompute_flops=0.0, selective_s=core_gemm + core_eltwise, selective_flops=core_flops,
                         stored_bytes=(2 * e + dropout_mask_bytes(c)) * b * heads * q_len * s)


UNFUSED_ROPE_PASSES = ((1.0, 1.0, 2.0), (0.5, 1.0, 2.0), (1.0, 0.0, 2.0), (1.0, 1.0, 2.0), (1.0, 1.0, 3.0),
                       (1.0, 0.0, 2.0))
"""Megatron-Core's _apply_rotary_pos_emb_bshd on one tensor t as PyTorch runs it (megatron/core/
models/common/embeddings/rope_utils.py, core_r0.17.0 l.95-126), each a kernel over t: (share of
t's elements, FLOP and bytes per element by e): t·cos, −x₂ of rotate_half (half of t), its cat,
·sin, the add, and the cat with the unrotated columns."""
UNFUSED_ROPE_TABLE_KERNELS = 6.0
"""the same call's kernels on the s × d frequency table: cos and sin, each scaled by mscale and
cast to t's datatype (bytes negligible: a latency each)."""


def unfused_rope_s(c: Context, xp, q_elems, k_elems):
    """RoPE applied as PyTorch operations to Q and to K (`UNFUSED_ROPE_PASSES` over each, and
    `UNFUSED_ROPE_TABLE_KERNELS` each): how Megatron runs YaRN outside latent attention, whose
    rotary fusion Megatron-Bridge turns off for a position embedding other than rope
    (src/megatron/bridge/training/utils/fusions.py; gpt-oss's position_embedding_type yarn)."""
    e, total = c.precision.elem_bytes, 0.0
    for elems in (q_elems, k_elems):
        for share, flops, units in UNFUSED_ROPE_PASSES:
            total = total + eltwise_s(c, xp, share * elems, flops, units * e)
        total = total + UNFUSED_ROPE_TABLE_KERNELS * c.memory.hbm_latency_s
    return total


def _rope_s(c: Context, xp, tokens, t, rope_elems):
    """RoPE rotating Q and K in place: one fused pass (read and write), or unfused (`unfused_rope_s`)."""
    if not c.model.rope:
        return 0.0
    if c.model.unfused_rope:
        return unfused_rope_s(c, xp, tokens * c.model.heads / t * c.model.head_size, tokens * c.model.kv_heads / t * c.model.head_size)
    return eltwise_s(c, xp, rope_elems, ROPE_FLOPS_PER_ELEM, 2 * c.precision.elem_bytes)


def stored_projection_bytes(c: Context, tokens, t):
    """Bytes the attention keeps of its projections' tensors on this GPU: Q, K, V (its BF16
    inputs) and the output projection's input, the attention output. Quantized, a fused
    kernel's backward keeps that output in BF16, and the projection keeps either the same
    tensor (costmodel.inputs.precision: projection_keeps_bf16_input) or its own copy. Latent
    attention (Megatron-LM's MLASelfAttention) keeps Q and K (d_qk per head), V and the output
    (d_v; the output is the projection's input), and the compressed query and K/V twice each
    (the RMSNorms' inputs and the up projections' inputs, gathered)."""
    e, q = c.precision.elem_bytes, stored_gemm_input_bytes(c)
    heads = c.model.heads / t
    q_cols, kv_cols = heads * c.model.head_size, c.model.kv_heads / t * c.model.head_size
    projection_input = e * tokens * q_cols
    if c.precision.quantized:
        keeps_bf16 = c.precision.recipe.format.projection_keeps_bf16_input
        projection_input = (e * tokens * q_cols if keeps_bf16 or c.settings.fused_attention else 0.0) + (
            0.0 if keeps_bf16 else q * tokens * q_cols)
    if not c.model.latent:
        return e * tokens * (q_cols + 2 * kv_cols) + projection_input
    out_cols = heads * c.model.value_head_size
    projection_input = projection_input / q_cols * out_cols
    return (e * tokens * (2 * q_cols + out_cols) + projection_input
            + 2 * e * tokens * (c.model.q_lora_rank + c.model.kv_lora_rank))


def attention_layer(c: Context, m, xp) -> LayerCost:
    """The attention layer: its projections, its core (fused or unfused), and RoPE rotating Q
    and K in place (one pass, read and write). recompute_modules core_attn reruns the unfused
    core; mla_up_proj latent attention's up projections and the RoPE on their output
    (Megatron-LM multi_latent_attention.py, recompute_up_proj).

    It keeps the QKV projection's input (the norm's output, gathered under sequence
    parallelism; latent attention's down projections read it on the sequence-parallel shard
    and keep that shard), its projections' tensors (stored_projection_bytes) and its core's
    (AttentionCore.stored_bytes). attn_only and core_attn drop the unfused core; layernorm the
    norm's output; mla_up_proj latent attention's Q, K and V, the up projections' outputs (a·d_qk
    twice and a·d_v per token over tp: Megatron-LM discards them after the core's forward and
    reruns the up projections before its backward)."""
    tokens, ln_tokens = layer_tokens(c, m, xp)
    att = attention_projections(c, xp, tokens, ln_tokens, m.tp, m.seq_par, norm_output_bytes(c),
                                norm_flops_per_elem(c))
    core = fused_core(c, m, xp) if c.settings.fused_attention else unfused_core(c, m, xp)
    rope = _rope_s(c, xp, tokens, m.tp, att.rope_elems)
    heads, q = c.model.heads / m.tp, stored_gemm_input_bytes(c)
    norm_output = q * ln_tokens * c.model.hidden if c.model.latent else 0.0
    gathered = 0.0 if c.model.latent else q * tokens * c.model.hidden
    recomputed_core = 0.0 if c.settings.fused_attention else core.stored_bytes
    up_outputs = c.precision.elem_bytes * tokens * (2 * heads * c.model.head_size + c.model.value_head_size * heads) if c.model.latent else 0.0
    return LayerCost(
        "attention",
        gemm_s=att.in_s + core.gemm_s + att.out_s,
        weight_grad_s=None if att.weight_grad_s is None else att.weight_grad_s + core.gemm_s,
        eltwise_s=core.eltwise_s + rope + att.eltwise_s,
        matrix_flops=att.matrix_flops + core.flops,
        attention_core_s=core.gemm_s + core.eltwise_s,
        selective_recompute_s=core.selective_s, selective_recompute_flops=core.selective_flops,
        kernel_recompute_s=core.kernel_recompute_s, kernel_recompute_flops=core.kernel_recompute_flops,
        tp_regions=1.0,
        modules=(ModuleRerun("core_attn", core.selective_s, core.selective_flops, dropped_bytes=recomputed_core),
                 ModuleRerun("mla_up_proj", att.up_s + rope if c.model.latent else 0.0, att.up_flops,
                             dropped_bytes=up_outputs),
                 ModuleRerun("layernorm", dropped_bytes=norm_output, dropped_gathered_bytes=gathered)),
        gemms=att.gemms,
        stored_bytes=norm_output + stored_projection_bytes(c, tokens, m.tp) + core.stored_bytes,
        stored_gathered_bytes=gathered, selective_dropped_bytes=recomputed_core)
