"""A block's layers as cost records.

Each kind of layer is a function of the problem (Context), the mapping's view `m` and the
backend `xp` that returns one frozen LayerCost: its forward kernels' time and matrix FLOPs,
what its backward does (activation gradient and weight gradient), what recomputation reruns
of it, and the GEMM operands a precision recipe quantizes. A block is the sum of its layers'
records (`block_forward`); costmodel.terms.block_terms adds the block's communication,
recomputation and offload traffic, and costmodel.terms.iteration multiplies blocks into
stages.

The layer kinds (forward, b = microbatch, T = b·s/cp tokens on this GPU, h hidden, e bytes
per element; costmodel.terms.block states the layers' formulas and their sources):

    norm        one LayerNorm / RMSNorm over the block's input or the attention's output
    attention   projections, the attention core and RoPE (costmodel.terms.attention)
    residual    one residual add with its dropout (Megatron-LM's fused bias-dropout-add)
    mlp         a dense MLP: h→f (gated h→2f), the activation or gate, f→h
    moe         a mixture-of-experts layer in the MLP's place (costmodel.terms.moe)

Backward does twice forward's work layer by layer unless a layer says otherwise (two GEMMs
per forward GEMM; element-wise backward reads the saved input and the output gradient and
writes the input gradient): activation gradient = GEMMs + 2 × element-wise, weight gradient =
GEMMs (the fused attention kernel's backward is counted with them, as Zero Bubble's W pass
takes the block's forward GEMM time; Qi et al. 2023).

Written against costmodel.ops: every time and FLOP count may be a scalar or a numpy array.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from costmodel.terms.context import MASK_BYTES, Context
from costmodel.terms.layer_time import (ACTIVATION_FLOPS_PER_ELEM, LAYERNORM_FLOPS_PER_ELEM, RESIDUAL_FLOPS_PER_ELEM,
                                        RMSNORM_FLOPS_PER_ELEM, eltwise_s, matmul_s)
from costmodel.terms.moe import moe_layer_forward, moe_quantized_gemms
from costmodel.terms.quantize import GemmOperands

__all__ = ["LayerCost", "BlockLayers", "dense_mlp_layer", "moe_mlp_layer", "norm_layer", "residual_layer",
           "layer_tokens", "norm_output_bytes"]


@dataclass(frozen=True)
class LayerCost:
    """One layer of one block, one microbatch, one GPU (seconds and FLOPs; scalars or arrays)."""

    name: str
    """the layer's kind: norm, attention, residual, mlp, moe (or a kind a model adds)"""
    gemm_s: object = 0.0
    """forward matrix kernels (and a fused attention kernel)"""
    eltwise_s: object = 0.0
    """forward element-wise kernels"""
    matrix_flops: object = 0.0
    """forward matrix FLOPs (what the hardware does; the attention core's causal half)"""
    attention_core_s: object = 0.0
    """the attention core (scores, softmax, context), part of the two times above"""
    selective_recompute_s: object = 0.0
    """what recompute attn_only reruns of it (the unfused attention core)"""
    selective_recompute_flops: object = 0.0
    kernel_recompute_s: object = 0.0
    """what a fused attention kernel redoes in its backward whatever the recompute setting"""
    kernel_recompute_flops: object = 0.0
    modules: tuple = ()
    """(recompute module, seconds, FLOPs): what each of Megatron-LM's recompute_modules reruns of it"""
    gemms: tuple = ()
    """its GEMMs' operands as a precision recipe quantizes them (costmodel.terms.quantize.GemmOperands)"""
    tp_regions: object = 0.0
    """tensor-parallel regions it runs (a column-parallel GEMM into a row-parallel one, with the
    all-reduce or the sequence-parallel all-gather and reduce-scatter around them)"""
    activation_grad_s: object = None
    """backward's activation-gradient kernels (None: GEMMs + 2 × element-wise)"""
    weight_grad_s: object = None
    """backward's weight-gradient kernels (None: as long as the forward GEMMs)"""

    def __post_init__(self):
        if self.activation_grad_s is None:
            object.__setattr__(self, "activation_grad_s", self.gemm_s + 2 * self.eltwise_s)
        if self.weight_grad_s is None:
            object.__setattr__(self, "weight_grad_s", self.gemm_s)

    @property
    def forward_s(self):
        return self.gemm_s + self.eltwise_s

    def scaled(self, share) -> "LayerCost":
        """This record weighted by `share` (a kind's share of a mixed block's layers)."""
        return LayerCost(self.name, **{name: share * getattr(self, name) for name in _SUMMED},
                         modules=tuple((module, share * seconds, share * flops) for module, seconds, flops in self.modules),
                         gemms=self.gemms)

    @property
    def backward_s(self):
        return self.activation_grad_s + self.weight_grad_s


_SUMMED = tuple(f.name for f in fields(LayerCost) if f.name not in ("name", "modules", "gemms"))


@dataclass(frozen=True)
class BlockLayers:
    """A block's layers, in order, and their sums (one microbatch, one GPU)."""

    layers: tuple[LayerCost, ...]

    def total(self, name: str):
        """The sum of one LayerCost field over the block's layers."""
        values = [getattr(layer, name) for layer in self.layers]
        total = values[0]
        for value in values[1:]:
            total = total + value
        return total

    def sums(self) -> dict:
        """Every summed field of LayerCost over the block's layers."""
        return {name: self.total(name) for name in _SUMMED}

    def module_s(self, modules) -> tuple:
        """(seconds, FLOPs) the named recompute_modules rerun of this block."""
        seconds, flops = 0.0, 0.0
        for name in modules:
            for layer in self.layers:
                for module, module_seconds, module_flops in layer.modules:
                    if module == name:
                        seconds, flops = seconds + module_seconds, flops + module_flops
        return seconds, flops

    @property
    def gemms(self) -> tuple:
        return tuple(operands for layer in self.layers for operands in layer.gemms)

    def by_name(self, name: str) -> tuple[LayerCost, ...]:
        return tuple(layer for layer in self.layers if layer.name == name)


def layer_tokens(c: Context, m, xp):
    """(T, the tokens a norm or residual acts on): b·s/cp tokens on this GPU, and the
    sequence-parallel shard T/tp when SP is on (the whole activation otherwise)."""
    tokens = m.microbatch * c.model.seq / m.cp
    return tokens, xp.where(m.seq_par, tokens / m.tp, tokens)


def norm_output_bytes(c: Context) -> float:
    """Bytes per element a norm writes: delayed scaling's norm writes the FP8 copy of its
    output itself (costmodel.inputs.precision), every other costing its datatype."""
    return c.precision.recipe.copy_bytes if c.precision.quantized and c.precision.recipe.format.norm_casts else c.precision.elem_bytes


def norm_flops_per_elem(c: Context) -> float:
    return RMSNORM_FLOPS_PER_ELEM if c.model.rmsnorm else LAYERNORM_FLOPS_PER_ELEM


def norm_layer(c: Context, m, xp) -> LayerCost:
    """One LayerNorm or RMSNorm over the block's h-wide activation: read it, write its output."""
    _, ln_tokens = layer_tokens(c, m, xp)
    seconds = eltwise_s(c, xp, ln_tokens * c.model.hidden, norm_flops_per_elem(c), c.precision.elem_bytes + norm_output_bytes(c))
    return LayerCost("norm", eltwise_s=seconds, modules=(("layernorm", seconds, 0.0),))


def residual_layer(c: Context, m, xp) -> LayerCost:
    """One residual add with its dropout in the same pass (Megatron-LM's fused
    bias-dropout-add): read both operands, write the sum, and read and write the mask only
    when the model trains with dropout."""
    _, ln_tokens = layer_tokens(c, m, xp)
    mask = MASK_BYTES if c.model.dropout else 0.0
    return LayerCost("residual", eltwise_s=eltwise_s(c, xp, ln_tokens * c.model.hidden, RESIDUAL_FLOPS_PER_ELEM,
                                                      3 * c.precision.elem_bytes + mask))


def gated_activation_s(c: Context, xp, elems):
    """The MLP's activation over `elems` intermediate elements. Gated: its own kernel reading
    both halves of the h→2f output and writing f (Megatron-LM's fused bias-SwiGLU); unfused
    (eager PyTorch's silu(x) * y) the activation writes f and the product reads both: two
    passes. Not gated: a fused GeLU (or squared ReLU) runs in the up GEMM's epilogue, no pass
    of its own; unfused, one pass."""
    e, act_flops = c.precision.elem_bytes, ACTIVATION_FLOPS_PER_ELEM[c.model.mlp]
    if c.model.gated_mlp:
        seconds = eltwise_s(c, xp, elems, act_flops, 3 * e)
        return seconds if c.settings.fused_activation else seconds + eltwise_s(c, xp, elems, 1.0, 2 * e)
    return 0.0 if c.settings.fused_activation else eltwise_s(c, xp, elems, act_flops, 2 * e)


def dense_mlp_layer(c: Context, m, xp) -> LayerCost:
    """The dense MLP, split tp ways: h→f (gated: h→2f, gate and up side by side), the
    activation or gate, f→h. Its inputs are the norm's output, gathered under sequence
    parallelism, and its output gradient likewise (the recipe's operands)."""
    tokens, ln_tokens = layer_tokens(c, m, xp)
    h, t = c.model.hidden, m.tp
    f_cols = c.model.feedforward / t
    up_cols = 2 * f_cols if c.model.gated_mlp else f_cols
    gemm = matmul_s(c, xp, tokens, up_cols, h) + matmul_s(c, xp, tokens, h, f_cols)
    flops = 2 * tokens * h * (up_cols + f_cols)
    activation = gated_activation_s(c, xp, tokens * f_cols)
    gathered = m.seq_par
    gemms = (GemmOperands(ln_tokens * h, tokens * up_cols, h * up_cols, gathered, False, t, norm_fed=True),
             GemmOperands(tokens * f_cols, ln_tokens * h, f_cols * h, False, gathered, t))
    return LayerCost("mlp", gemm_s=gemm, eltwise_s=activation, matrix_flops=flops, tp_regions=1.0,
                     modules=(("mlp", gemm + activation, flops),), gemms=gemms)


def moe_mlp_layer(c: Context, m, xp) -> LayerCost:
    """A mixture-of-experts layer in the MLP's place (costmodel.terms.moe.moe_layer_forward on
    this GPU's tokens: router, grouped expert GEMMs, shared experts); its collectives are
    timed in costmodel.terms.block_terms. It keeps a tensor-parallel region's collectives only
    around its shared experts, and gathers and scatters its routed rows instead."""
    tokens, _ = layer_tokens(c, m, xp)
    layer = moe_layer_forward(c, xp, tokens, m.tp, m.ep, m.etp)
    return LayerCost("moe", gemm_s=layer.gemm_s, eltwise_s=layer.eltwise_s, matrix_flops=layer.matrix_flops,
                     tp_regions=float(c.model.shared_feedforward > 0),
                     activation_grad_s=layer.gemm_s + 2 * layer.eltwise_s + layer.launches_backward_extra_s,
                     modules=(("moe_act", layer.expert_activation_s, 0.0),),
                     gemms=moe_quantized_gemms(c, tokens, m.tp, m.ep, m.etp))
