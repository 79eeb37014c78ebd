"""The activations one transformer block keeps for backward on one GPU for one microbatch,
and the transient workspace its backward needs (Korthikanti et al. 2022, §4): what each
recompute setting, sequence parallelism, the context-parallel ring, fused attention,
dropout, an MoE layer and a precision recipe store. costmodel.terms.block times the same layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.terms.context import MASK_BYTES, Context
from costmodel.terms.cp_buffers import cp_buffer_bytes
from costmodel.terms.moe import moe_memory
from costmodel.terms.layer_time import SOFTMAX_STATS_BYTES


@dataclass(frozen=True)
class StoredActivations:
    """Bytes one block keeps for backward, one microbatch, one GPU."""

    stored: object
    """kept from forward to backward under the mapping's recompute setting"""
    full: object
    """what storing everything would keep"""
    workspace: object
    """transient bytes recomputation needs while one block's backward runs"""


KIND_STORED: dict[str, Callable[..., StoredActivations]] = {}
"""Block kinds whose stored activations are a function of their own, (context, mapping view,
backend) → StoredActivations; dense and MoE blocks are block_stored_activation_bytes'."""


def stored_activations(c: Context, m, xp, kind: str) -> StoredActivations:
    """What one block of `kind` (costmodel.terms.block.BLOCK_KINDS) keeps for backward."""
    if kind in KIND_STORED:
        return KIND_STORED[kind](c, m, xp)
    return block_stored_activation_bytes(c, m, xp, kind == "moe")


def block_stored_activation_bytes(c: Context, m, xp, moe: bool = False) -> StoredActivations:
    """Bytes one block keeps from forward to backward for one microbatch on one GPU
    (Korthikanti et al. 2022, §4: 34·s·b·h + 5·a·s²·b with no parallelism, 16-bit).

    Split by tp always: Q, K, V (K and V with g·d columns), the projection input, the MLP
    intermediates (two f-wide tensors; three when gated), and the
    attention core (softmax output, its dropout mask and output). Split by tp only with
    sequence parallelism: the two layer-norm inputs and the two dropout masks. The inputs
    of the QKV and h→f GEMMs are gathered tensors under SP: stored whole unless the
    all-gather is redone in backward (seq_par_ag_redo), in which case the shard suffices.
    Full recomputation keeps only the block input. A fused attention kernel stores no score
    matrix, only its softmax statistics, and keeps them under attn_only too (its backward
    recomputes the scores itself). A model trained without dropout keeps no mask.

    Also returns the transient workspace: the context-parallel buffers (cp_comm: the ring's
    K/V chunks, all_gather's gathered K/V, a2a's re-sharded Q/K/V/O), and what
    recomputation needs while one block's backward
    runs: the whole block's activations under full recompute, the attention core's under
    attn_only (unfused), nothing otherwise. With `moe`, the MoE layer's stored bytes
    (costmodel.terms.moe.moe_memory) replace the MLP intermediates, and its all-to-all send and
    receive buffers join the workspace.
    """
    e, h, f, s, d = c.precision.elem_bytes, c.model.hidden, c.model.feedforward, c.model.seq, c.model.head_size
    mask = MASK_BYTES if c.model.dropout else 0.0             # a dropout mask's bytes per element
    t = m.tp
    b = m.microbatch
    q_len = s / m.cp                                     # this GPU's share of the sequence
    tokens = b * q_len
    heads = c.model.heads / t
    q_cols = heads * d
    kv_cols = c.model.kv_heads / t * d
    sp_split = xp.where(m.seq_par, t, 1.0)
    gemm_inputs_split = xp.where(m.seq_par & m.seq_par_ag_redo, t, 1.0)

    # A GEMM's input is kept for its weight gradient: under a precision recipe as one quantized
    # copy (the columnwise one, or the rowwise shard a per-tensor FP8 gather re-gathers; TE
    # module/linear.py, "Discard unneeded data in input tensor"), else in the datatype.
    q = c.precision.recipe.copy_bytes if c.precision.quantized else e
    layernorm_inputs = 2 * e * tokens * h / sp_split
    dropout_masks = 2 * mask * tokens * h / sp_split
    gemm_inputs = 2 * q * tokens * h / gemm_inputs_split
    qkv_and_proj = _attention_inputs_stored(c, tokens, q_cols, kv_cols, heads, q)
    if c.model.latent:
        # latent attention's down projections read the norm's output on the sequence-parallel
        # shard, kept as that shard
        gemm_inputs = q * tokens * h / gemm_inputs_split + q * tokens * h / sp_split
    # GeLU / squared ReLU: the activation's input and output (2·f); gated: the h→2f output
    # (both operands of the gate) and the gate's output (3·f). The output, the down
    # projection's input, is kept as its quantized copy under a recipe.
    mlp_intermediates = ((2 if c.model.gated_mlp else 1) * e + q) * tokens * f / t
    if c.model.gated_mlp and not c.settings.fused_activation:      # eager: the activation's output, an operand of the product
        mlp_intermediates = mlp_intermediates + e * tokens * f / t
    dispatch_buffers = 0.0
    if moe:
        layer = moe_memory(c, xp, tokens, t, m.ep, m.etp)
        mlp_intermediates, dispatch_buffers = layer.stored_bytes, layer.all_to_all_buffer_bytes
    if c.settings.fused_attention:
        attention_core = SOFTMAX_STATS_BYTES * b * heads * q_len
        core_recomputed = False
    else:
        attention_core = (2 * e + mask) * b * heads * q_len * s  # softmax out, dropout mask and out
        core_recomputed = m.recompute_attn_only                       # attn_only drops it

    everything = layernorm_inputs + dropout_masks + gemm_inputs + qkv_and_proj + mlp_intermediates
    full = everything + attention_core
    stored = xp.where(core_recomputed, everything, full)
    if m.recompute_modules is not None:
        up_outputs = e * tokens * (2 * q_cols + c.model.value_head_size * heads) if c.model.latent else 0.0
        stored, dropped_workspace = _selective_stored(c, m, xp, moe, full, attention_core, gemm_inputs,
                                                      mlp_intermediates, tokens, up_outputs)
        core_recomputed = False          # (its bytes are in dropped_workspace)
        dispatch_buffers = dispatch_buffers + dropped_workspace
    block_input = e * tokens * h / sp_split
    ring_buffers = cp_buffer_bytes(c, m, xp, tokens, kv_cols, q_cols)     # by cp_comm (costmodel.terms.cp_buffers)
    return StoredActivations(
        stored=xp.where(m.recompute_full, block_input, stored),
        full=full,
        workspace=ring_buffers + dispatch_buffers + xp.where(m.recompute_full, full, xp.where(core_recomputed, attention_core, 0.0)),
    )


def _attention_inputs_stored(c: Context, tokens, q_cols, kv_cols, heads, q):
    """Bytes the attention keeps of its inputs: Q, K, V (its BF16 inputs) and the output
    projection's input, the attention output. Quantized (`q` bytes per element of a quantized
    copy), a fused kernel's backward keeps that output in BF16, and the projection keeps either
    the same tensor (costmodel.inputs.precision: projection_keeps_bf16_input) or its own copy. Latent
    attention (Megatron-LM's MLASelfAttention) keeps Q and K (d_qk per head), V and the output
    (d_v; the output is the projection's input), and the compressed query and K/V twice each
    (the RMSNorms' inputs and the up projections' inputs, gathered)."""
    e = c.precision.elem_bytes
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


def _selective_stored(c: Context, m, xp, moe: bool, full, attention_core, gemm_inputs, mlp_intermediates, tokens,
                      up_outputs=0.0):
    """Stored bytes and recompute workspace of one block under recompute_modules (Megatron-LM
    transformer_config.py `recompute_modules`, transformer_layer.py / mlp.py / experts.py):
    core_attn drops the attention core's stored tensors (unfused; a fused kernel keeps only its
    statistics, as attn_only); layernorm the two norms' outputs, the QKV and up projections'
    inputs (`gemm_inputs`); mlp a dense MLP's intermediates; moe_act the routed experts'
    activation output (one f_e-wide tensor of the MoE layer's 2, gated 3); mla_up_proj latent
    attention's Q, K and V, the up projections' outputs (`up_outputs`: a·d_qk twice and a·d_v
    per token over tp; Megatron-LM discards them after the core's forward and reruns the up
    projections before its backward). The workspace is the
    largest module's dropped bytes, alive while its backward recomputes it."""
    modules = m.recompute_modules
    dropped = {"core_attn": 0.0 if c.settings.fused_attention else attention_core, "layernorm": gemm_inputs,
               "mlp": 0.0 if moe else mlp_intermediates, "moe_act": 0.0, "mla_up_proj": up_outputs}
    if moe:
        layer = moe_memory(c, xp, tokens, m.tp, m.ep, m.etp)
        dropped["moe_act"] = layer.expert_intermediate_bytes / (3 if c.model.gated_mlp else 2)
    gone = [dropped[name] for name in modules]
    workspace = 0.0
    for bytes_ in gone:
        workspace = xp.maximum(workspace, bytes_)
    return full - sum(gone), workspace
