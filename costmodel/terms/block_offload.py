"""One block's parameters on one GPU and the offload traffic they and its stored activations
make each microbatch (tier 2 ↔ HBM): what of it the block's compute cannot hide
(costmodel.terms.block_terms.kind_terms)."""

from __future__ import annotations

from costmodel.terms.block import has_experts
from costmodel.terms.block_memory import StoredActivations
from costmodel.terms.context import Context


def offload_rate(bytes_per_s: float) -> float:
    # No offload tier: its flags are never on, so its traffic is 0 bytes; an infinite rate
    # keeps 0 / rate = 0 without dividing by zero.
    return bytes_per_s if bytes_per_s > 0 else float("inf")


def moe_block_param_shares(c: Context, m) -> tuple:
    """Parameters of one MoE block on one GPU: (those reduced over dp·cp — attention and
    shared experts split tp ways, the router whole — and the E/ep local experts split etp
    ways, reduced over the expert data-parallel group of tp·cp·dp/(ep·etp) GPUs)."""
    return ((c.model.moe_block_params - c.model.routed_expert_params - c.model.router_params) / m.tp + c.model.router_params,
            c.model.routed_expert_params / (m.etp * m.ep))


def kind_param_shares(c: Context, m, kind: str) -> tuple:
    """One block of `kind`'s parameters on one GPU: (dense-group, expert) — an MoE block's by
    moe_block_param_shares, another kind's split tp ways (Context.model.kind_param_count)."""
    if has_experts(kind):
        return moe_block_param_shares(c, m)
    return c.model.kind_param_count(kind) / m.tp, 0.0


def offload_traffic(c: Context, m, xp, kind: str, act: StoredActivations):
    """One block's offload traffic per microbatch (tier 2 ↔ HBM, per direction): bytes forward
    and backward (the larger direction of each) and their time at the tier's rate. Forward
    reads the weights and writes the stored activations; backward reads the weights, their
    gradients and the activations back, and writes the gradients."""
    e = c.precision.elem_bytes
    block_params = sum(kind_param_shares(c, m, kind))
    off_rate = offload_rate(c.memory.offload_bytes_per_s)
    fwd_read = xp.where(m.weight_offload, e * block_params, 0.0)
    fwd_write = xp.where(m.activations_offload, act.stored, 0.0)
    g = c.precision.grad_bytes_per_param
    bwd_read = xp.where(m.weight_offload, (e + g) * block_params, 0.0) + fwd_write
    bwd_write = xp.where(m.weight_offload, g * block_params, 0.0)
    off_fwd_bytes = xp.maximum(fwd_read, fwd_write)
    off_bwd_bytes = xp.maximum(bwd_read, bwd_write)
    off_fwd_s = off_fwd_bytes / (off_rate * xp.lookup(c.memory.offload_curve, off_fwd_bytes))
    off_bwd_s = off_bwd_bytes / (off_rate * xp.lookup(c.memory.offload_curve, off_bwd_bytes))
    return off_fwd_bytes, off_bwd_bytes, off_fwd_s, off_bwd_s


def offload_exposed(c: Context, m, xp, kind: str, act: StoredActivations, fwd_s, bwd_s) -> tuple:
    """One block's offload traffic (offload_traffic) beyond what its forward `fwd_s` and its
    backward with recompute `bwd_s` hide, each way, and the tier rate that would hide it all. Where
    no row offloads anything (no switch on: no traffic), all three are 0: exactly what the
    formulas give for 0 bytes, without computing them over the rows."""
    if not (xp.any(m.weight_offload) or xp.any(m.activations_offload)):
        return 0.0, 0.0, 0.0
    off_fwd_bytes, off_bwd_bytes, off_fwd_s, off_bwd_s = offload_traffic(c, m, xp, kind, act)
    return (xp.maximum(off_fwd_s - fwd_s, 0.0), xp.maximum(off_bwd_s - bwd_s, 0.0),
            xp.maximum(off_fwd_bytes / fwd_s, off_bwd_bytes / bwd_s))
