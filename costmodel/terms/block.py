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

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.terms.context import Context
from costmodel.terms.attention import attention_layer
from costmodel.terms.layers import BlockLayers, LayerCost, dense_mlp_layer, moe_mlp_layer, norm_layer, residual_layer
from costmodel.terms.pattern_layers import mamba_layer
from costmodel.terms.quantize import quantize_passes


@dataclass(frozen=True)
class BlockForward(LayerCost):
    """One block, one microbatch, one GPU: the sum of its layers' records (LayerCost's fields
    over all of them; each a scalar or an array), with what recompute_modules reruns of the
    block resolved into `selective_recompute_s`, and a precision recipe's quantization passes
    over the block's GEMM operands."""

    quantize_fwd_s: object = 0.0
    """a precision recipe's amax and cast passes of the GEMM inputs (costmodel.terms.quantize)"""
    quantize_bwd_s: object = 0.0
    """its passes over the output gradients in backward (not twice the forward's)"""
    weight_quantize_s: object = 0.0
    """its passes over the block's weights, once per step"""
    layers: tuple = ()
    """the block's layers' records, in order"""


LAYER_KINDS: dict[str, Callable[..., LayerCost]] = {
    "norm": norm_layer,
    "attention": attention_layer,
    "residual": residual_layer,
    "mlp": dense_mlp_layer,
    "moe": moe_mlp_layer,
    "mamba": mamba_layer,
}
"""Each kind of layer and the function that costs it, (context, mapping view, backend) → LayerCost."""

BLOCK_KINDS: dict[str, tuple[str, ...]] = {
    "dense": ("norm", "attention", "residual", "norm", "mlp", "residual"),
    "moe": ("norm", "attention", "residual", "norm", "moe", "residual"),
    "mamba": ("norm", "mamba", "residual"),
    "attention_layer": ("norm", "attention", "residual"),
    "mlp_layer": ("norm", "mlp", "residual"),
    "moe_layer": ("norm", "moe", "residual"),
}
"""The layers of each kind of block, in order (a pre-norm transformer block; with `moe` the
mixture-of-experts layer in the MLP's place). A layer pattern's layers (costmodel.inputs.model
layer_pattern: Mamba-2, attention, MLP, MoE) are blocks of one mixer each
(costmodel.inputs.model.PATTERN_KINDS)."""


def has_experts(kind: str) -> bool:
    """Whether a block of this kind holds a mixture-of-experts layer (its expert-parallel
    collectives, parameters and stored bytes are the MoE layer's: costmodel.terms.moe)."""
    return "moe" in BLOCK_KINDS[kind]


def block_layers(c: Context, m, xp, kind: str = "dense") -> BlockLayers:
    """The layers of one block of `kind`, in order (BLOCK_KINDS), each layer kind costed once
    however often the block holds it. `m` has tp, cp, ep, etp, microbatch, seq_par and
    cp_comm_a2a (arrays or scalars)."""
    kinds = BLOCK_KINDS[kind]
    costed = {name: LAYER_KINDS[name](c, m, xp) for name in dict.fromkeys(kinds)}
    return BlockLayers(tuple(costed[name] for name in kinds))


def block_forward(c: Context, m, xp, layers: BlockLayers) -> BlockForward:
    """A block's forward as the sum of its layers' records, with a precision recipe's
    quantization passes over all of their GEMM operands (none without one), and what
    recompute_modules reruns when the mapping names them. Its stored input (what full
    recomputation keeps) is its first layer's."""
    sums = layers.sums()
    sums["stored_input_bytes"] = layers.layers[0].stored_input_bytes
    selective_s, selective_flops = sums["selective_recompute_s"], sums["selective_recompute_flops"]
    if m.recompute_modules is not None:
        selective_s, selective_flops = layers.module_s(m.recompute_modules)
    passes = quantize_passes(c, xp, layers.gemms) if c.precision.quantized else None
    sums.update(selective_recompute_s=selective_s, selective_recompute_flops=selective_flops)
    return BlockForward("block", **sums, layers=layers.layers,
                        **({} if passes is None else dict(quantize_fwd_s=passes.forward_s, quantize_bwd_s=passes.backward_s,
                                                          weight_quantize_s=passes.weight_step_s)))


def block_forward_times(c: Context, m, xp, kind: str = "dense") -> BlockForward:
    """Forward time of each layer group of one block of `kind` (BLOCK_KINDS), one microbatch,
    one GPU (seconds), and the forward matrix FLOPs: the sum of its layers (block_layers,
    block_forward)."""
    return block_forward(c, m, xp, block_layers(c, m, xp, kind))
