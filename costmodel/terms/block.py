"""One transformer block on one GPU for one microbatch: FLOP, bytes and time per layer.

Layers of a block (forward), with b = microbatch, s = sequence, h = hidden, a = heads,
d = head size, f = feed-forward, t = tp, c = cp, T = b·s/c tokens on this GPU, e = bytes
per element:

    attention  LN1 · QKV GEMM · (RoPE on Q, K) · scores GEMM (Q·Kᵀ) · softmax · dropout
               · context GEMM (·V) · output-projection GEMM · dropout + residual
    MLP        LN2 · GEMM h→f (gated: h→2f) · activation (gated: gate) · GEMM f→h
               · dropout + residual

With grouped-query attention (g = kv_heads key/value heads) K and V have g·d columns, split
tp ways (tp divides g, Megatron-LM's rule for query groups); the attention core's FLOP
follow the a query heads and its K/V traffic the g key/value heads.

Each layer takes max(compute time, memory time) (a roofline), where compute runs at peak ×
the efficiency the system gives an operation of that many FLOP and memory at bandwidth × the
efficiency for that many bytes. Backward (activation gradient + weight gradient) does twice
the work of forward, layer by layer, at the same efficiencies: two GEMMs per forward GEMM,
and element-wise backward reads the saved input and the output gradient and writes the input
gradient.

The attention core (scores GEMM · softmax · dropout · context GEMM) is either four kernels
that pass the b·a·s² score matrix through HBM (Megatron-LM as measured on Selene, 2022), or,
with `fused_attention`, one FlashAttention kernel (Dao et al. 2022) that keeps score tiles
on chip: HBM sees only Q, K, V read and the output and the softmax statistics (one fp32
log-sum-exp per row) written, and its backward kernel recomputes Q·Kᵀ and the softmax
instead of reading a stored score matrix. That recomputation is counted as recompute time.

Context parallelism (cp = c > 1) splits the sequence: each GPU runs every GEMM and
element-wise layer on its s/c tokens, and its s/c queries attend to all s keys, which
arrive around a ring of c GPUs, one chunk of K and V per step (Megatron-LM's default
`cp_comm_type="p2p"`, megatron/core/transformer/attention.py and TransformerEngine's
attn_forward_func_with_cp; Liu et al. 2023, Ring Attention). The 2·c chunks of Megatron's
causal load balancing (megatron/training/utils.py get_batch_on_this_cp_rank) give every
GPU the same share, 1/c, of the attention core's work. The ring itself is timed in
costmodel.terms.block_terms (`cp_ring_terms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.context import MASK_BYTES, Context
from costmodel.terms.kernel_time import attention_time_s
from costmodel.model import CAUSAL_ATTENTION_SHARE
from costmodel.terms.moe import moe_layer_forward, moe_quantized_gemms
from costmodel.terms.quantize import GemmOperands, quantize_passes
from costmodel.terms.layer_time import (ACTIVATION_FLOPS_PER_ELEM, DROPOUT_FLOPS_PER_ELEM, LAYERNORM_FLOPS_PER_ELEM,
                                  RESIDUAL_FLOPS_PER_ELEM, RMSNORM_FLOPS_PER_ELEM, ROPE_FLOPS_PER_ELEM,
                                  SOFTMAX_FLOPS_PER_ELEM, SOFTMAX_STATS_BYTES, eltwise_s, gemm_s, matmul_s)


def fused_attention_s(c: Context, xp, pairs, batch_heads, vector_flops, num_bytes, steps=1.0, head_size=None):
    """Time of a fused attention kernel doing `pairs` s×s×d products per (batch, head) over
    `batch_heads` of them; with context parallelism, of the `steps` = cp ring-step kernels
    that each do `pairs` (s/cp)×(s/cp)×d products (1/cp of the whole core, in cp launches
    of shorter sequences). With a fitted attention model, that model
    (costmodel.terms.kernel_time.attention_time_s). Otherwise a roofline: its tensor-core work (a batched
    GEMM), its element-wise softmax work on the vector units (overlapped with the matrix work,
    as FlashAttention pipelines them) and its HBM traffic, whichever is slowest."""
    chunk = c.seq / steps
    d = c.head_size if head_size is None else head_size
    if c.attention is not None:
        return steps * attention_time_s(c.attention, pairs, batch_heads, chunk, d)
    vector = vector_flops / (c.vector_flops_per_s * xp.lookup(c.vector_curve, vector_flops))
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


def attention_projections(c: Context, xp, tokens, ln_tokens, t, gathered, norm_out, norm_flops) -> AttentionProjections:
    """QKV and the output projection (grouped-query attention: h → (a + 2g)·d/t and a·d/t → h),
    or latent attention's five projections (costmodel.terms.latent_attention): the down projections
    h → r_q and h → r_kv + d_r whole on every tp rank, on the sequence-parallel shard
    (`ln_tokens`) as Megatron-LM's MLASelfAttention runs them, the up projections r_q → a·d_qk/t
    and r_kv → a·(d_n + d_v)/t and the output a·d_v/t → h on the gathered tokens."""
    e, h, heads = c.elem_bytes, c.hidden, c.heads / t
    d, d_v = c.head_size, c.value_head_size
    if not c.latent:
        q_cols, kv_cols = heads * d, c.kv_heads / t * d
        qkv_cols = q_cols + 2 * kv_cols
        gemms = (GemmOperands(ln_tokens * h, tokens * qkv_cols, h * qkv_cols, gathered, False, t, norm_fed=True),
                 GemmOperands(tokens * q_cols, ln_tokens * h, q_cols * h, False, gathered, t, projection=True))
        return AttentionProjections(
            in_s=matmul_s(c, xp, tokens, qkv_cols, h), out_s=matmul_s(c, xp, tokens, h, q_cols),
            matrix_flops=2 * tokens * h * (qkv_cols + q_cols), eltwise_s=0.0,
            rope_elems=tokens * (q_cols + kv_cols), gemms=gemms)
    r_q, r_kv, d_r = c.q_lora_rank, c.kv_lora_rank, c.rope_head_size
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
                                up_flops=2 * tokens * (q_in * q_cols + r_kv * kv_up_cols))


@dataclass(frozen=True)
class BlockForward:
    """The forward pass of one block, one microbatch, one GPU (each a scalar or an array)."""

    gemm_s: object
    """matrix multiplies (and the fused attention kernel)"""
    eltwise_s: object
    """element-wise layers: norms, residuals, dropouts, the MLP's activation or gate, RoPE, an
    unfused attention core's softmax"""
    attention_core_s: object
    """the attention core (scores, softmax, context), part of the two above"""
    matrix_flops: object
    selective_recompute_s: object
    """what attn_only recomputes: the unfused attention core (0 when fused)"""
    selective_recompute_flops: object
    kernel_recompute_s: object
    """what a fused attention kernel redoes in its backward whatever the recompute setting"""
    kernel_recompute_flops: object
    quantize_fwd_s: object = 0.0
    """a precision recipe's amax and cast passes of the GEMM inputs (costmodel.terms.quantize)"""
    quantize_bwd_s: object = 0.0
    """its passes over the output gradients in backward (not twice the forward's)"""
    weight_quantize_s: object = 0.0
    """its passes over the block's weights, once per step"""


def block_forward_times(c: Context, m, xp, moe: bool = False) -> BlockForward:
    """Forward time of each layer group of one block, one microbatch, one GPU (seconds),
    and the forward matrix FLOP. `m` has tp, cp, ep, microbatch, seq_par (arrays or
    scalars). With `moe`, the block of a mixture-of-experts model whose MLP is the MoE layer
    (costmodel.terms.moe.moe_layer_forward on this GPU's tokens: router, grouped expert GEMMs,
    shared experts); its collectives are timed in costmodel.terms.iteration."""
    e, h, f, s, d = c.elem_bytes, c.hidden, c.feedforward, c.seq, c.head_size
    mask = MASK_BYTES if c.dropout else 0.0             # a dropout mask's bytes per element
    dropout_flops = DROPOUT_FLOPS_PER_ELEM if c.dropout else 0.0
    t = m.tp
    b = m.microbatch
    q_len = s / m.cp                                     # queries (and tokens) of a sequence on this GPU
    tokens = b * q_len
    heads = c.heads / t                                  # heads on this GPU
    q_cols = heads * d                                   # a·d/t
    kv_cols = c.kv_heads / t * d                         # g·d/t: K (and V) columns on this GPU
    f_cols = f / t
    up_cols = 2 * f_cols if c.gated_mlp else f_cols      # gated: gate and up projections side by side
    # Layer norms, residuals and their dropouts act on the sequence-parallel shard when SP
    # is on, and on the whole (replicated) activation otherwise.
    ln_tokens = xp.where(m.seq_par, tokens / t, tokens)

    norm_flops = RMSNORM_FLOPS_PER_ELEM if c.rmsnorm else LAYERNORM_FLOPS_PER_ELEM
    # Delayed scaling: the norm writes the FP8 copy of its output itself (costmodel.precision).
    norm_out = c.recipe.copy_bytes if c.quantized and c.recipe.format.norm_casts else e
    att = attention_projections(c, xp, tokens, ln_tokens, t, m.seq_par, norm_out, norm_flops)
    mlp = matmul_s(c, xp, tokens, up_cols, h) + matmul_s(c, xp, tokens, h, f_cols)   # h→f (or 2f), f→h
    mlp_flops = 2 * tokens * h * (up_cols + f_cols)

    score_flops = 2 * b * heads * q_len * s * d          # Q·Kᵀ; the context GEMM (·V) is as large
    # what the hardware counts of them (HFU's recomputation): the causal half, as MFU counts it
    causal_score_flops = CAUSAL_ATTENTION_SHARE * score_flops
    core_flops = 2 * causal_score_flops
    score_elems = b * heads * q_len * s
    if c.latent:
        # Queries and keys of d_qk, values and output of d_v per head, every head its own K and V.
        d_v = c.value_head_size
        core_flops = CAUSAL_ATTENTION_SHARE * (score_flops + 2 * b * heads * q_len * s * d_v)
    if c.fused_attention:
        # Q read and the output written for this GPU's tokens; K and V read for all s (the
        # ring brings every chunk); the softmax statistics written.
        kernel_bytes = e * (tokens * 2 * q_cols + b * s * 2 * kv_cols) + SOFTMAX_STATS_BYTES * b * heads * q_len
        core_head = None
        if c.latent:
            kernel_bytes = (e * (tokens + b * s) * heads * (d + d_v)
                            + SOFTMAX_STATS_BYTES * b * heads * q_len)
            core_head = (d + d_v) / 2                     # two products of d_qk and d_v: their mean, twice
        # Two s×s×d products per head forward (Q·Kᵀ, ·V), 1/cp of them on this GPU: the ring
        # (p2p) and all_gather run them as cp kernels of s/cp queries and keys each.
        core_gemm = fused_attention_s(c, xp, 2, b * heads, score_elems * (SOFTMAX_FLOPS_PER_ELEM + dropout_flops),
                                      kernel_bytes, steps=m.cp, head_size=core_head)
        core_eltwise = 0.0
        # Backward recomputes Q·Kᵀ and the softmax (statistics in hand) on chip.
        kernel_recompute = fused_attention_s(c, xp, 1, b * heads, score_elems * SOFTMAX_FLOPS_PER_ELEM, 0.0,
                                             steps=m.cp)
        # Ulysses (a2a): one kernel over the whole sequence with heads/cp of the tp rank's
        # heads — the same FLOP — reading only those heads' K and V.
        a2a_bytes = kernel_bytes - e * b * s * 2 * kv_cols * (1 - 1 / m.cp)
        if c.latent:
            a2a_bytes = kernel_bytes - e * b * s * heads * (d + d_v) * (1 - 1 / m.cp)
        a2a_gemm = fused_attention_s(c, xp, 2, b * heads / m.cp,
                                     score_elems * (SOFTMAX_FLOPS_PER_ELEM + dropout_flops), a2a_bytes,
                                     head_size=core_head)
        a2a_recompute = fused_attention_s(c, xp, 1, b * heads / m.cp, score_elems * SOFTMAX_FLOPS_PER_ELEM, 0.0)
        core_gemm = xp.where(m.cp_comm_a2a, a2a_gemm, core_gemm)
        kernel_recompute = xp.where(m.cp_comm_a2a, a2a_recompute, kernel_recompute)
        kernel_recompute_flops = causal_score_flops
        selective_recompute, selective_recompute_flops = 0.0, 0.0   # nothing outside the kernel to redo
        if c.attention_core_scale != 1.0:
            # Sliding-window blocks: the kernel skips the tiles outside the band (the mean over
            # the model's blocks, Context.attention_core_scale).
            scale = c.attention_core_scale
            core_gemm, kernel_recompute = scale * core_gemm, scale * kernel_recompute
            core_flops, kernel_recompute_flops = scale * core_flops, scale * kernel_recompute_flops
    else:
        scores = gemm_s(c, xp, q_len, s, d, e * (b * heads * q_len * d + b * kv_cols / d * s * d + score_elems),
                        batch=b * heads, high_precision=True)
        context = gemm_s(c, xp, q_len, d, s, e * (score_elems + b * kv_cols / d * s * d + b * heads * q_len * d),
                         batch=b * heads, high_precision=True)
        if c.latent:                                      # ·V with d_v-wide values and output
            context = gemm_s(c, xp, q_len, d_v, s, e * (score_elems + b * heads * (s + q_len) * d_v), batch=b * heads,
                             high_precision=True)
        softmax = eltwise_s(c, xp, score_elems, SOFTMAX_FLOPS_PER_ELEM, 2 * e)
        attn_dropout = eltwise_s(c, xp, score_elems, DROPOUT_FLOPS_PER_ELEM, 2 * e + MASK_BYTES) if c.dropout else 0.0
        core_gemm = scores + context
        core_eltwise = softmax + attn_dropout
        kernel_recompute, kernel_recompute_flops = 0.0, 0.0
        # Selective recomputation reruns the four kernels of the attention core.
        # (an unfused core computes the whole masked score matrix: a sliding window saves nothing)
        selective_recompute, selective_recompute_flops = core_gemm + core_eltwise, core_flops

    layernorms = 2 * eltwise_s(c, xp, ln_tokens * h, norm_flops, e + norm_out)
    # Each residual add applies its dropout in the same pass (Megatron-LM's fused bias-dropout-add),
    # reading and writing the mask only when the model trains with dropout.
    residuals = 2 * eltwise_s(c, xp, ln_tokens * h, RESIDUAL_FLOPS_PER_ELEM, 3 * e + mask)
    act_flops = ACTIVATION_FLOPS_PER_ELEM[c.mlp]
    if c.gated_mlp:
        # The gate reads both halves of the h→2f output and writes f: its own kernel
        # (Megatron-LM's fused bias-SwiGLU is a separate element-wise pass). Unfused (eager
        # PyTorch's silu(x) * y), the activation writes f and the product reads both: two passes.
        activation = eltwise_s(c, xp, tokens * f_cols, act_flops, 3 * e)
        if not c.fused_activation:
            activation = activation + eltwise_s(c, xp, tokens * f_cols, 1.0, 2 * e)
    else:
        # A fused GeLU (or squared ReLU) runs in the epilogue of the h→f GEMM: no pass of its own.
        activation = 0.0 if c.fused_activation else eltwise_s(c, xp, tokens * f_cols, act_flops, 2 * e)
    # RoPE rotates Q and K in place: one pass over them (read and write).
    rope = eltwise_s(c, xp, att.rope_elems, ROPE_FLOPS_PER_ELEM, 2 * e) if c.rope else 0.0
    # The quantized GEMMs' operands (a precision recipe's passes; none without one): QKV and the
    # MLP's up projection read a norm's output, gathered under sequence parallelism; the
    # projection's and the down projection's output gradients are gathered likewise.
    gathered = m.seq_par
    attention_gemms = att.gemms
    mlp_gemms = (
        GemmOperands(ln_tokens * h, tokens * up_cols, h * up_cols, gathered, False, t, norm_fed=True),
        GemmOperands(tokens * f_cols, ln_tokens * h, f_cols * h, False, gathered, t))
    if moe:
        layer = moe_layer_forward(c, xp, tokens, t, m.ep, m.etp)
        mlp, activation, mlp_flops = layer.gemm_s, layer.eltwise_s, layer.matrix_flops
        mlp_gemms = moe_quantized_gemms(c, tokens, t, m.ep, m.etp)
    passes = quantize_passes(c, xp, attention_gemms + mlp_gemms) if c.quantized else None
    if m.recompute_modules is not None:
        # recompute_modules (attn_only): each module's forward rerun in backward; core_attn as
        # attn_only (the unfused core's four kernels; nothing outside a fused kernel)
        modules = m.recompute_modules
        moe_act_s = layer.expert_activation_s if moe else 0.0
        # mla_up_proj: latent attention's up projections and the RoPE applied to their output
        # (Megatron-LM multi_latent_attention.py, recompute_up_proj)
        module_s = {"core_attn": selective_recompute, "layernorm": layernorms,
                    "mlp": 0.0 if moe else mlp + activation, "moe_act": moe_act_s,
                    "mla_up_proj": att.up_s + rope if c.latent else 0.0}
        module_flops = {"core_attn": selective_recompute_flops, "mlp": 0.0 if moe else mlp_flops,
                        "mla_up_proj": att.up_flops}
        selective_recompute = sum(module_s[name] for name in modules)
        selective_recompute_flops = sum(module_flops.get(name, 0.0) for name in modules)

    return BlockForward(
        gemm_s=att.in_s + core_gemm + att.out_s + mlp,
        eltwise_s=core_eltwise + layernorms + residuals + activation + rope + att.eltwise_s,
        attention_core_s=core_gemm + core_eltwise,
        matrix_flops=att.matrix_flops + mlp_flops + core_flops,
        selective_recompute_s=selective_recompute,
        selective_recompute_flops=selective_recompute_flops,
        kernel_recompute_s=kernel_recompute,
        kernel_recompute_flops=kernel_recompute_flops,
        **({} if passes is None else dict(quantize_fwd_s=passes.forward_s, quantize_bwd_s=passes.backward_s,
                                          weight_quantize_s=passes.weight_step_s)),
    )
