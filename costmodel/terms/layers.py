"""A block's layers as cost records.

Each kind of layer is a function of the problem (Context), the mapping's view `m` and the
backend `xp` that returns one frozen LayerCost: its forward kernels' time and matrix FLOPs,
what its backward does (activation gradient and weight gradient), what recomputation reruns
of it, the GEMM operands a precision recipe quantizes, and the bytes it keeps for backward,
split by what each recompute setting drops of them. A block is the sum of its layers'
records (`block_forward`); costmodel.terms.block_terms adds the block's communication,
recomputation and offload traffic, costmodel.terms.block_memory applies the recompute setting
to the records' stored bytes, and costmodel.terms.iteration multiplies blocks into stages.

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

Stored bytes (Korthikanti et al. 2022 §4, one microbatch, one GPU, 16-bit: 34·s·b·h + 5·a·s²·b
for a block with no parallelism; Megatron-Core's saved tensors): a norm keeps its input, a
residual its dropout mask, a GEMM its input (a quantized copy under a recipe), an activation
its inputs and output, the attention core its softmax output, mask and output (a fused kernel
its softmax statistics). Tensors sequence parallelism shards (a norm's input, a mask) are
split tp ways with it on; the GEMM inputs its all-gather produces are kept whole
(`stored_gathered_bytes`) unless backward redoes the all-gather (seq_par_ag_redo).

Written against costmodel.ops: every time and FLOP count may be a scalar or a numpy array.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from costmodel.terms.context import MASK_BYTES, Context
from costmodel.terms.layer_time import (ACTIVATION_FLOPS_PER_ELEM, LAYERNORM_FLOPS_PER_ELEM, RESIDUAL_FLOPS_PER_ELEM,
                                        RMSNORM_FLOPS_PER_ELEM, eltwise_s, matmul_s, weight_grad_s)
from costmodel.terms.moe import moe_layer_forward, moe_memory, moe_quantized_gemms
from costmodel.terms.quantize import GemmOperands

__all__ = ["LayerCost", "ModuleRerun", "BlockLayers", "dense_mlp_layer", "moe_mlp_layer", "norm_layer",
           "residual_layer", "layer_tokens", "norm_output_bytes", "stored_gemm_input_bytes", "dropout_mask_bytes"]


@dataclass(frozen=True)
class ModuleRerun:
    """What one of Megatron-LM's recompute_modules (transformer_config.py) reruns of a layer, and
    the stored bytes it drops (they are recomputed before the layer's backward)."""

    module: str
    """core_attn, layernorm, mlp, moe_act or mla_up_proj"""
    seconds: object = 0.0
    flops: object = 0.0
    dropped_bytes: object = 0.0
    """of the layer's stored_bytes"""
    dropped_gathered_bytes: object = 0.0
    """of its stored_gathered_bytes"""

    def scaled(self, share) -> "ModuleRerun":
        return ModuleRerun(self.module, share * self.seconds, share * self.flops, share * self.dropped_bytes,
                           share * self.dropped_gathered_bytes)


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
    """ModuleRerun: what each of Megatron-LM's recompute_modules reruns of it and drops of its stored bytes"""
    gemms: tuple = ()
    """its GEMMs' operands as a precision recipe quantizes them (costmodel.terms.quantize.GemmOperands)"""
    tp_regions: object = 0.0
    """tensor-parallel regions it runs (a column-parallel GEMM into a row-parallel one, with the
    all-reduce or the sequence-parallel all-gather and reduce-scatter around them)"""
    activation_grad_s: object = None
    """backward's activation-gradient kernels (None: GEMMs + 2 × element-wise)"""
    weight_grad_s: object = None
    """backward's weight-gradient kernels (None: as long as the forward GEMMs)"""
    stored_bytes: object = 0.0
    """bytes it keeps from forward to backward with nothing recomputed, its gathered GEMM inputs apart"""
    stored_gathered_bytes: object = 0.0
    """the GEMM inputs sequence parallelism's all-gather produces, kept whole (b·s/cp tokens; the
    input itself without sequence parallelism), or as their tp shard when backward redoes the
    all-gather (seq_par_ag_redo)"""
    stored_input_bytes: object = 0.0
    """its input as kept: what full recomputation keeps of a block this layer opens (a block's
    record: its first layer's)"""
    selective_dropped_bytes: object = 0.0
    """what recompute attn_only drops of its stored bytes (the unfused attention core; a fused
    kernel keeps its softmax statistics)"""
    transient_bytes: object = 0.0
    """transient bytes while it runs, beside the stored ones (an MoE layer's all-to-all buffers)"""

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
                         modules=tuple(rerun.scaled(share) for rerun in self.modules), gemms=self.gemms)

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
        for rerun in self.reruns(modules):
            seconds, flops = seconds + rerun.seconds, flops + rerun.flops
        return seconds, flops

    def module_dropped(self, module: str) -> tuple:
        """(stored bytes, gathered GEMM-input bytes) one of recompute_modules drops of this block."""
        dropped, gathered = 0.0, 0.0
        for rerun in self.reruns((module,)):
            dropped, gathered = dropped + rerun.dropped_bytes, gathered + rerun.dropped_gathered_bytes
        return dropped, gathered

    def reruns(self, modules) -> tuple:
        """The layers' ModuleRerun entries of the named modules, module by module, layer by layer."""
        return tuple(rerun for name in modules for layer in self.layers for rerun in layer.modules
                     if rerun.module == name)

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


def stored_gemm_input_bytes(c: Context) -> float:
    """Bytes per element a GEMM keeps of its input for its weight gradient: under a precision
    recipe one quantized copy (the columnwise one, or the rowwise shard a per-tensor FP8 gather
    re-gathers; TE module/linear.py, "Discard unneeded data in input tensor"), else the datatype's."""
    return c.precision.recipe.copy_bytes if c.precision.quantized else c.precision.elem_bytes


def dropout_mask_bytes(c: Context) -> float:
    """Bytes per element of a dropout mask: none when the model trains without dropout."""
    return MASK_BYTES if c.model.dropout else 0.0


def norm_layer(c: Context, m, xp) -> LayerCost:
    """One LayerNorm or RMSNorm over the block's h-wide activation: read it, write its output.
    It keeps its input for backward (on the sequence-parallel shard), the block's input when it
    opens the block; its output is kept by the GEMM it feeds (that layer's record)."""
    _, ln_tokens = layer_tokens(c, m, xp)
    seconds = eltwise_s(c, xp, ln_tokens * c.model.hidden, norm_flops_per_elem(c), c.precision.elem_bytes + norm_output_bytes(c))
    kept = c.precision.elem_bytes * ln_tokens * c.model.hidden
    return LayerCost("norm", eltwise_s=seconds, modules=(ModuleRerun("layernorm", seconds, 0.0),),
                     stored_bytes=kept, stored_input_bytes=kept)


def residual_layer(c: Context, m, xp) -> LayerCost:
    """One residual add with its dropout in the same pass (Megatron-LM's fused
    bias-dropout-add): read both operands, write the sum, and read and write the mask only
    when the model trains with dropout. It keeps the mask (on the sequence-parallel shard)."""
    _, ln_tokens = layer_tokens(c, m, xp)
    mask = dropout_mask_bytes(c)
    return LayerCost("residual", eltwise_s=eltwise_s(c, xp, ln_tokens * c.model.hidden, RESIDUAL_FLOPS_PER_ELEM,
                                                      3 * c.precision.elem_bytes + mask),
                     stored_bytes=mask * ln_tokens * c.model.hidden)


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
    parallelism, and its output gradient likewise (the recipe's operands). It keeps the up
    projection's input (the norm's output, gathered; recompute_modules layernorm drops it) and
    its intermediates (recompute_modules mlp drops them): GeLU / squared ReLU the activation's
    input and output (2·f), gated the h→2f output (both operands of the gate) and the gate's
    output (3·f; eager, the activation's output as well, an operand of the product); the
    output, the down projection's input, as its quantized copy under a recipe."""
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
    e, q = c.precision.elem_bytes, stored_gemm_input_bytes(c)
    intermediates = ((2 if c.model.gated_mlp else 1) * e + q) * tokens * c.model.feedforward / t
    if c.model.gated_mlp and not c.settings.fused_activation:
        intermediates = intermediates + e * tokens * c.model.feedforward / t
    up_input = q * tokens * h
    return LayerCost("mlp", gemm_s=gemm, eltwise_s=activation, matrix_flops=flops, tp_regions=1.0,
                     weight_grad_s=weight_grad_s(c, xp, ((tokens, up_cols, h), (tokens, h, f_cols))),
                     modules=(ModuleRerun("mlp", gemm + activation, flops, dropped_bytes=intermediates),
                              ModuleRerun("layernorm", dropped_gathered_bytes=up_input)),
                     gemms=gemms, stored_bytes=intermediates, stored_gathered_bytes=up_input)


def moe_mlp_layer(c: Context, m, xp) -> LayerCost:
    """A mixture-of-experts layer in the MLP's place (costmodel.terms.moe.moe_layer_forward on
    this GPU's tokens: router, grouped expert GEMMs, shared experts); its collectives are
    timed in costmodel.terms.block_terms. It keeps a tensor-parallel region's collectives only
    around its shared experts, and gathers and scatters its routed rows instead. It keeps its
    input as a dense MLP does (the norm's output, gathered; recompute_modules layernorm drops
    it) and the layer's own tensors (costmodel.terms.moe.moe_memory: recompute_modules moe_act
    drops the routed experts' activation output, one f_e-wide tensor of their 2, gated 3), and
    holds one all-to-all's send and receive buffers while it runs. Its activation gradient runs
    each permutation once, as its inverse (MoeLayerForward.permute_s), and every other
    element-wise kernel twice."""
    tokens, _ = layer_tokens(c, m, xp)
    layer = moe_layer_forward(c, xp, tokens, m.tp, m.ep, m.etp)
    memory = moe_memory(c, xp, tokens, m.tp, m.ep, m.etp)
    up_input = stored_gemm_input_bytes(c) * tokens * c.model.hidden
    activation_output = memory.expert_intermediate_bytes / (3 if c.model.gated_mlp else 2)
    return LayerCost("moe", gemm_s=layer.gemm_s, eltwise_s=layer.eltwise_s, matrix_flops=layer.matrix_flops,
                     tp_regions=float(c.model.shared_feedforward > 0),
                     activation_grad_s=(layer.gemm_s + 2 * layer.eltwise_s - layer.permute_s
                                        + layer.launches_backward_extra_s),
                     weight_grad_s=layer.weight_grad_s,
                     modules=(ModuleRerun("moe_act", layer.expert_activation_s, 0.0, dropped_bytes=activation_output),
                              ModuleRerun("layernorm", dropped_gathered_bytes=up_input)),
                     gemms=moe_quantized_gemms(c, tokens, m.tp, m.ep, m.etp),
                     stored_bytes=memory.stored_bytes, stored_gathered_bytes=up_input,
                     transient_bytes=memory.all_to_all_buffer_bytes)
