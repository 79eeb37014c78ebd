"""Throughput as published tables count it: model TFLOP/s per GPU and tokens/s per GPU by
Megatron-Bridge's formula.

NVIDIA's published training throughput (Megatron-Bridge's docs/performance-summary.md, and the
rows of problems/runs/) counts model FLOP with `num_floating_point_operations` →
`transformer_flops` of src/megatron/bridge/training/utils/flop_utils.py (NVIDIA-NeMo/
Megatron-Bridge, read at commit 067f987df03b8355b03192d88d70f1709fedf51a). Per token, for a
standard transformer with grouped-query attention (`num_query_groups` g) — 3 for forward,
activation gradient and weight gradient, 2 FLOP per multiply-add:

    MLP        3·2·h·f·(3 gated | 2)                      per dense block
               3·2·h·(k·f_e + f_s)·(3 gated | 2)          per MoE block (routed top-k, shared; no router)
    attention  3·2·(h·(a·d + 2·g·d) + a·d·h + a·d·s)      per block: projections, and the core
                                                           a·d·s/2 · 2 — causal, so half of s²
    MTP        each of the `mtp` multi-token-prediction layers is one more block (of the kind of the
               last), plus 3·2·(3·h + 2·h²) for its norms and projection
    logits     3·2·h·V'·(1 + mtp)                          V' the padded vocabulary

V' is Megatron's `calculate_padded_vocab_size`: V rounded up to a multiple of
`make_vocab_size_divisible_by` (128, Megatron-Bridge's GPTModelProvider default) × tp.

The MFU numerator of costmodel.inputs.model.ModelFlops halves the attention core the same way but
counts the unpadded vocabulary: the two differ by the padding, and a table's "TFLOP/s per GPU"
is Bridge's.

Multi-head latent attention (DeepSeek-V3) replaces the attention term, per block (Megatron-LM's
`num_floating_point_operations`, megatron/training/training.py, its MLA branch; r_q, r_kv the
ranks, d_n, d_r, d_v the head parts):

    3·2·( r_q·(h + a·(d_n + d_r) + 1) + r_kv·(h + a·(d_n + d_v) + 1) + h·d_r + a·d_v·h
          + s·a·(d_n + d_r)/2 + s·a·d_v/2 )

and the model's multi-token prediction modules count as `mtp` above.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.inputs.mamba import bridge_mamba_flops_per_token

__all__ = ["MAKE_VOCAB_SIZE_DIVISIBLE_BY", "Throughput", "bridge_flops_per_token", "bridge_hybrid_flops_per_token",
           "padded_vocab", "throughput"]

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron-Bridge's GPTModelProvider.make_vocab_size_divisible_by (src/megatron/bridge/models/gpt_provider.py)."""


def padded_vocab(vocab: float, tp: float, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> float:
    """Megatron's calculate_padded_vocab_size: the vocabulary rounded up to a multiple of
    divisible_by × tp (each tensor-parallel rank holds an equal, aligned slice)."""
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


def bridge_hybrid_flops_per_token(c, tp: float) -> float:
    """A layer pattern's model FLOP per token as Megatron-Bridge counts a hybrid model
    (flop_utils.py `hybrid_flops`, 3 × forward): per attention layer 4·h·(a·d/h)·(h + h·g/a + s/2)
    — its projections as if Q, K, V and the output were h wide, the core halved —, per MLP layer
    4·h·f (×3/2 gated), per MoE layer 4·h·(k·f_e + f_s) (×3/2 gated), per Mamba layer
    costmodel.inputs.mamba.bridge_mamba_flops_per_token (its d_in = 2·h), and the logits 2·h·V'."""
    h, s, a, g, d = c.model.hidden, c.model.seq, c.model.heads, c.model.kv_heads, c.model.head_size
    counts = dict(c.model.kind_counts)
    gate = 1.5 if c.model.gated_mlp else 1.0
    forward = (counts.get("attention_layer", 0.0) * 4 * h * (a * d / h) * (h + h * g / a + s / 2)
               + counts.get("mlp_layer", 0.0) * 4 * h * c.model.feedforward * gate
               + counts.get("moe_layer", 0.0) * 4 * h * (c.model.experts_per_token * c.model.expert_feedforward
                                                        + c.model.shared_feedforward) * gate
               + 2 * h * padded_vocab(c.model.vocab, tp))
    mamba = counts.get("mamba", 0.0) * bridge_mamba_flops_per_token(c.model.mamba, h) if c.model.mamba is not None else 0.0
    return 3 * forward + mamba


def bridge_flops_per_token(c, tp: float, mtp_layers: int = 0) -> float:
    """Model FLOP per token as Megatron-Bridge counts them (module docstring). `c` is the
    problem's costmodel.terms.context.Context (the model's dimensions); `tp` sets the padding. A
    layer pattern's: bridge_hybrid_flops_per_token."""
    if "attention_layer" in dict(c.model.kind_counts) or c.model.mamba is not None:
        return bridge_hybrid_flops_per_token(c, tp)
    h, f, s, a, g, d = c.model.hidden, c.model.feedforward, c.model.seq, c.model.heads, c.model.kv_heads, c.model.head_size
    expansion = 3.0 if c.model.gated_mlp else 2.0
    moe_blocks = c.model.moe_blocks
    dense_blocks = c.model.blocks - moe_blocks
    last_is_moe = moe_blocks > 0           # MoE models end in an MoE block (DeepSeek-V3: 3 dense, then MoE)
    if mtp_layers:
        moe_blocks += mtp_layers if last_is_moe else 0
        dense_blocks += 0 if last_is_moe else mtp_layers
    layers = c.model.blocks + mtp_layers
    attention_per_block = h * (a * d + 2 * g * d) + a * d * h + a * d * s
    if c.model.latent:
        r_q, r_kv, d_r, d_v = c.model.q_lora_rank, c.model.kv_lora_rank, c.model.rope_head_size, c.model.value_head_size
        d_n = d - d_r
        q_term = r_q * (h + a * (d_n + d_r) + 1) if r_q else h * a * (d_n + d_r)
        attention_per_block = (q_term + r_kv * (h + a * (d_n + d_v) + 1) + h * d_r + a * d_v * h
                               + s * a * (d_n + d_r) / 2 + s * a * d_v / 2)
    mlp = 3 * 2 * h * expansion * (f * dense_blocks
                                   + (c.model.experts_per_token * c.model.expert_feedforward + c.model.shared_feedforward) * moe_blocks)
    attention = 3 * 2 * layers * attention_per_block
    mtp = 3 * 2 * mtp_layers * (3 * h + 2 * h * h)
    logits = 3 * 2 * h * padded_vocab(c.model.vocab, tp) * (1 + mtp_layers)
    return mlp + attention + mtp + logits


@dataclass(frozen=True)
class Throughput:
    """One iteration's throughput as published tables give it, beside the peak MFU divides by."""

    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    """Megatron-Bridge's model FLOP (bridge_flops_per_token) per second per GPU, in TFLOP/s"""
    bridge_flops_per_token: float
    peak_tflops: float
    """the dense matrix peak of the mapping's datatype (MFU's denominator), TFLOP/s"""
    peak_name: str

    def to_dict(self) -> dict:
        return {"tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "model_tflops_per_gpu": self.model_tflops_per_gpu,
                "model_flops_per_token": self.bridge_flops_per_token, "counted_as": "Megatron-Bridge flop_utils.py",
                "peak_tflops": self.peak_tflops, "peak": self.peak_name}


def throughput(c, tp: float, batch: float, num_gpus: float, iteration_s: float, datatype: str) -> Throughput:
    """Tokens/s and Bridge's model TFLOP/s per GPU of one iteration of `batch` sequences."""
    tokens_per_s_per_gpu = batch * c.model.seq / (iteration_s * num_gpus)
    per_token = bridge_flops_per_token(c, tp, int(c.model.mtp_blocks))
    return Throughput(tokens_per_s_per_gpu, tokens_per_s_per_gpu * per_token / 1e12, per_token,
                      c.compute.matrix_flops_per_s / 1e12, c.compute.matrix_peak_name or f"{datatype} dense matrix peak")
