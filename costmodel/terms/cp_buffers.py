"""Context parallelism's transient buffers on one GPU, by `cp_comm` (docs/cost-model.md,
"Context parallelism"): what the exchange keeps beside the local K and V while a block's
attention runs, in forward and again in backward."""

from __future__ import annotations


def cp_buffer_bytes(c, m, xp):
    """The K/V ring keeps two chunks in flight beside the local one (receive and send
    buffers, TransformerEngine's double buffering). all_gather keeps the gathered K and V
    and, in backward, their full-sequence gradients (TE AttnFuncWithCPAndKVAllGather.backward:
    k_ag, v_ag and dk = zeros(k.shape[0]·cp_size)): 2·cp chunks. a2a keeps the re-sharded Q, K,
    V and output beside the originals (the all-to-alls' outputs: the same bytes, whole
    sequence and heads/cp). 0 when cp = 1. Over this GPU's b·s/cp tokens, its K (or V) and Q
    columns (latent attention: heads × (d_qk + d_v) for either pair)."""
    e, heads = c.precision.elem_bytes, c.model.heads / m.tp
    tokens = m.microbatch * (c.model.seq / m.cp)
    q_cols, kv_cols = heads * c.model.head_size, c.model.kv_heads / m.tp * c.model.head_size
    latent = heads * (c.model.head_size + c.model.value_head_size)
    kv_local = e * tokens * (latent if c.model.latent else 2 * kv_cols)
    q_and_out = e * tokens * (latent if c.model.latent else 2 * q_cols)
    buffers = xp.where(m.cp_comm_all_gather, 2 * m.cp * kv_local,
                       xp.where(m.cp_comm_a2a, q_and_out + kv_local, 2 * kv_local))
    return xp.where(m.cp > 1, buffers, 0.0)
