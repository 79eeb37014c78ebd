"""A Mamba-2 (SSD) layer as Megatron-Core runs it: its shape, parameters, FLOPs, bytes, stored
activations and the parallel degrees it allows.

Sources: Dao & Gu 2024, "Transformers are SSMs" (arXiv:2405.21060), §6 the SSD algorithm (the
chunked scan); Megatron-Core's megatron/core/ssm/mamba_mixer.py (MambaMixer: in_proj, conv1d,
mamba_chunk_scan_combined, RMSNormGated, out_proj) and mamba_context_parallel.py (NVIDIA/
Megatron-LM). Names: h hidden, H heads, P head_dim, D = H·P the inner width, G groups,
N state size, K conv kernel, Q chunk size, T tokens.

One layer, forward, per token:

    in_proj    h → 2·D + 2·G·N + H   (z, x, B, C, dt side by side)   2·h·(2D + 2GN + H) FLOP
    conv1d     depthwise, K taps over x, B, C (D + 2GN channels)     2·K·(D + 2GN) FLOP
    SSD scan   chunks of Q tokens (paper §6, the four steps):
               1 diagonal blocks  C·Bᵀ per group (2·Q·N) and (L∘CBᵀ)·X per head (2·Q·P)
               2 chunk states     Bᵀ·X per head                                   (2·N·P)
               3 state passing    the chunk states' recurrence, per head          (2·N·P / Q)
               4 state → output   C·state per head                                (2·N·P)
               per token: 2·G·Q·N + H·(2·Q·P + 4·N·P + 2·N·P/Q)
    norm       RMSNormGated over D (y · silu(z), normalised per group)
    out_proj   D → h                                                        2·D·h FLOP

Backward does twice forward's FLOPs, activation gradient and weight gradient (the transposed
products of the projections and of the scan's steps 1-4). Beside them, whatever the recompute
setting, the fused kernel's backward (mamba_ssm v2.2.6.post3, ops/triton/ssd_combined.py:
MambaSplitConv1dScanCombinedFn.backward, _mamba_chunk_scan_combined_bwd) reruns the conv ("Recompute
x, B, C") and, of the scan, C·Bᵀ (_bmm_chunk_fwd), the chunk states (_chunk_state_fwd) and the state
passing (_state_passing_fwd): 2·G·Q·N + H·(2·N·P + 2·N·P/Q) per token
(mamba_scan_recompute_flops_per_token), as a fused attention kernel reruns its scores.

Tensor parallelism splits heads and groups (mamba_mixer.py asserts nheads % tp == 0 and
ngroups % tp == 0; in_proj is column-parallel, out_proj row-parallel: one TP region per layer,
as an MLP). Context parallelism (mamba_context_parallel.py): an all-to-all turns the sequence
shard into a head shard before the conv and scan and back after, so tp·cp must divide the
heads, and the groups on a TP rank must divide by cp or divide cp (groups are repeated).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.inputs.fields import INPUT_CONFIG, Boolean, WholeNumber, within
from costmodel.inputs.limits import Bound

_CONV_KERNEL = Bound(1, 1 << 10, "taps of a depthwise causal conv; Mamba-2 uses 4")
_CHUNK = Bound(1, 1 << 16, "tokens per chunk of the SSD scan; Mamba-2 uses 128 or 256")

__all__ = ["MambaShape", "mamba_forward_flops_per_token", "mamba_scan_flops_per_token", "mamba_allows",
           "mamba_scan_recompute_flops_per_token",
           "mamba_stored_bytes_per_token", "mamba_scan_bytes_per_token", "bridge_mamba_flops_per_token"]


class MambaShape(BaseModel):
    """The shape of a Mamba-2 mixer (Hugging Face nemotron_h's mamba_* fields, Megatron-Core's
    mamba_num_heads, mamba_head_dim, mamba_state_dim, mamba_num_groups)."""

    model_config = INPUT_CONFIG

    heads: Annotated[WholeNumber, within(limits.ATTN_HEADS)] = Field(description="H: SSM heads (mamba_num_heads).")
    head_dim: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        description="P: channels per head (mamba_head_dim); D = H·P.")
    state_size: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        description="N: the state per channel (ssm_state_size).")
    groups: Annotated[WholeNumber, within(limits.ATTN_HEADS)] = Field(
        description="G: groups sharing B and C (n_groups); divides heads.")
    conv_kernel: Annotated[WholeNumber, within(_CONV_KERNEL)] = Field(
        4, description="K: taps of the depthwise causal conv (conv_kernel).")
    chunk_size: Annotated[WholeNumber, within(_CHUNK)] = Field(
        128, description="Q: tokens per chunk of the SSD scan (chunk_size).")
    conv_bias: Boolean = Field(True, description="The conv has a bias per channel (use_conv_bias).")
    proj_bias: Boolean = Field(False, description="in_proj and out_proj have biases (mamba_proj_bias).")

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> "MambaShape":
        if self.heads % self.groups:
            raise ValueError(f"mamba groups({self.groups}) does not divide mamba heads({self.heads})")
        return self

    @property
    def inner(self) -> int:
        """D = H·P, the width of x, z and y."""
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """D + 2·G·N: x, B and C go through the conv."""
        return self.inner + 2 * self.groups * self.state_size

    @property
    def in_proj_cols(self) -> int:
        """2·D + 2·G·N + H: z, x, B, C and dt."""
        return 2 * self.inner + 2 * self.groups * self.state_size + self.heads

    def weight_params(self, hidden: int) -> int:
        """Matrix parameters: in_proj h·(2D + 2GN + H) and out_proj D·h."""
        return hidden * self.in_proj_cols + self.inner * hidden

    def vector_params(self, hidden: int) -> int:
        """The conv's K taps (and bias) per channel, A_log, D and dt_bias per head, the gated
        norm's D scales, and with proj_bias the projections' biases."""
        conv = self.conv_channels * (self.conv_kernel + (1 if self.conv_bias else 0))
        proj = self.in_proj_cols + hidden if self.proj_bias else 0
        return conv + 3 * self.heads + self.inner + proj


def _chunk(shape: MambaShape, seq) -> float:
    """Q, the chunk, no longer than the sequence."""
    return min(shape.chunk_size, seq)


def mamba_scan_flops_per_token(shape: MambaShape, seq) -> float:
    """The SSD chunked scan's forward FLOPs per token (all heads): the four steps above."""
    q, n, p = _chunk(shape, seq), shape.state_size, shape.head_dim
    return 2 * shape.groups * q * n + shape.heads * (2 * q * p + 4 * n * p + 2 * n * p / q)


def mamba_scan_recompute_flops_per_token(shape: MambaShape, seq) -> float:
    """What the scan's backward reruns of its forward per token (all heads): C·Bᵀ per group, the
    chunk states and their passing (above)."""
    q, n, p = _chunk(shape, seq), shape.state_size, shape.head_dim
    return 2 * shape.groups * q * n + shape.heads * (2 * n * p + 2 * n * p / q)


def mamba_forward_flops_per_token(shape: MambaShape, hidden: int, seq) -> dict:
    """A Mamba-2 layer's forward FLOPs per token by part (matrix: in_proj, out_proj; conv; scan)."""
    return {"in_proj": 2 * hidden * shape.in_proj_cols, "conv": 2 * shape.conv_kernel * shape.conv_channels,
            "scan": mamba_scan_flops_per_token(shape, seq), "out_proj": 2 * shape.inner * hidden}


def mamba_scan_bytes_per_token(shape: MambaShape, seq, elem_bytes: float) -> float:
    """Bytes the scan moves per token: x, B, C, dt read and y written (elem_bytes each), and the
    chunk states (H·P·N fp32 per chunk) written by step 2 and read by step 4."""
    q = _chunk(shape, seq)
    per_token = elem_bytes * (2 * shape.inner + 2 * shape.groups * shape.state_size + shape.heads)
    # the chunk states are fp32 (4 bytes), written once and read once
    return per_token + 2 * 4.0 * shape.heads * shape.head_dim * shape.state_size / q


def mamba_state_bytes(shape: MambaShape, seq, elem_bytes: float = 4.0) -> float:
    """The chunk states of one sequence (H·P·N per chunk, fp32): what the scan keeps between
    steps 2 and 4 (and, at the last chunk, the recurrent state an inference cache keeps)."""
    return shape.heads * shape.head_dim * shape.state_size * elem_bytes * -(-seq // _chunk(shape, seq))


def mamba_stored_bytes_per_token(shape: MambaShape, hidden: int, elem_bytes: float, tp=1,
                                 gemm_input_bytes: float | None = None) -> dict:
    """What a Mamba layer keeps for backward per token (bytes), tensor by tensor as Megatron-Core
    (core_v0.16.0) and mamba_ssm (v2.2.6.post3) save them (docs/cost-model.md, Mamba-2):

    input        the layer's input, h: the fused pre-norm's input (TELayerNormColumnParallelLinear)
    norm         the pre-norm's output, in_proj's input, h (`gemm_input_bytes` each: a quantized
                 copy under a precision recipe)
    in_proj_out  zxBCdt, 2D + 2GN + H over tp: MambaSplitConv1dScanCombinedFn saves it and
                 recomputes the conv (x, B, C) from it in backward
    scan_out     out_x, the scan's output before the SiLU(z) gate, D/tp: the same function saves
                 it for the gate's and D's gradients (ssd_combined.py, save_for_backward)
    norm_in      the gated RMSNorm's input (y·SiLU(z)), D/tp: layernorm_gated.LayerNormFn saves it
    out_proj_in  out_proj's input, the norm's output, D/tp (`gemm_input_bytes` each)

    The norms' fp32 statistics (one per token, G/tp for the gated norm) are left out, as for a
    transformer block (Korthikanti et al. 2022): under 0.1 % of the layer."""
    gemm = elem_bytes if gemm_input_bytes is None else gemm_input_bytes
    inner = elem_bytes * shape.inner / tp
    return {"input": elem_bytes * hidden, "norm": gemm * hidden,
            "in_proj_out": elem_bytes * shape.in_proj_cols / tp,
            "scan_out": inner, "norm_in": inner, "out_proj_in": gemm * shape.inner / tp}


def mamba_allows(shape: MambaShape, tp: int, cp: int) -> bool:
    """Whether Megatron-Core runs this layer at tensor-parallel `tp` and context-parallel `cp`:
    tp divides the heads and the groups (mamba_mixer.py), tp·cp divides the heads, and the
    groups on a TP rank divide by cp or divide cp (mamba_context_parallel.py)."""
    if shape.heads % tp or shape.groups % tp or (shape.heads // tp) % cp:
        return False
    local_groups = shape.groups // tp
    return local_groups % cp == 0 or cp % local_groups == 0


def bridge_mamba_flops_per_token(shape: MambaShape, hidden: int) -> float:
    """Megatron-Bridge's published FLOPs of one Mamba layer per token, forward + backward
    (flop_utils.py `mamba_layer_flops` × 3): in_proj on d_in = 2·h (its fixed expand 2, not H·P),
    a scan of 7·d_in·N, out_proj."""
    d_in = 2 * hidden
    forward = (2 * hidden * (2 * d_in + 2 * shape.groups * shape.state_size + shape.heads)
               + 7 * d_in * shape.state_size + 2 * d_in * hidden)
    return 3 * forward
