"""What a GPU keeps for the blocks of its pipeline stage (bytes): its share of their weights,
gradients and optimizer state, the ZeRO buffer, and what of these HBM holds.

Stages hold different numbers of blocks when they are uneven (costmodel.space.layout), so
costmodel.terms.iteration asks for each stage it sizes: the first, the second and the last.
Written against the backend interface of costmodel.ops, as the other formulas.
"""

from __future__ import annotations

from typing import NamedTuple

from costmodel.terms.context import Context

# Offloaded state keeps two blocks in HBM: the one computing and the one in transit
# (the paper's reason why 128T needs 120 GiB of HBM).
RESIDENT_BLOCKS = 2.0

# When only some of a stage's blocks offload their activations, the block computing is one of
# those kept, and at most one offloaded block is in transit beside them: Transformer Engine's
# default schedule frees offloaded layer i when layer 2i+1 (for N = L/2) commits, so the last
# offloaded layer waits beside the L − N kept ones until the forward's last layer commits, and
# is reloaded as the first kept layer's backward starts (TE v2.8 cpu_offload.py,
# AsyncDoubleBufferGroupOffloadHandler: layer_window_map); TE ≥ 2.10's schedule keeps at most
# L − N layers' activations on the GPU (cpu_offload.py, DefaultOffloadSynchronizer).
TRANSIT_BLOCKS = 1.0


class StageState(NamedTuple):
    """One GPU's share of one stage's blocks (bytes; each a scalar or an array)."""

    weights: object
    grads: object
    optimizer: object
    sharding_buffer: object
    """ZeRO-2/3: one block's whole gradients, and (stage 3) two blocks' gathered weights"""
    weights_hbm: object
    """weights, gradients and the ZeRO buffer in HBM (two blocks' worth when offloaded)"""
    optimizer_hbm: object
    """optimizer state in HBM (none when offloaded)"""


def blocks_state(c: Context, m, xp, blocks, dense_params, expert_params, shards, expert_shards) -> StageState:
    """The state of `blocks` blocks on one GPU, each holding `dense_params` and
    `expert_params` of its parameters (costmodel.terms.block_terms.block_param_shares: tp splits
    a block, ep its experts): the ZeRO stage shards weights, gradients and optimizer state
    over `shards` GPUs (weights, gradients, optimizer; the dp·cp group), the experts' over
    `expert_shards` (the expert data-parallel group)."""
    block_params = dense_params + expert_params
    e, g = c.precision.elem_bytes, c.precision.grad_bytes_per_param
    # A precision recipe keeps each weight in BF16 or (low-precision param gather) as its
    # quantized param, plus the quantized copies cached for the step (costmodel.inputs.precision).
    stored, cached, gathered = e, 0.0, e
    if c.precision.recipe is not None:
        stored, cached = c.precision.recipe.weight_storage_bytes, c.precision.recipe.weight_cache_bytes
        gathered = c.precision.recipe.weight_gather_bytes
    dense, experts = blocks * dense_params, blocks * expert_params
    weights = (dense * stored / shards[0] + experts * stored / expert_shards[0]
               + xp.where(m.zero_3, 0.0, (dense + experts) * cached))
    grads = dense * g / shards[1] + experts * g / expert_shards[1]
    optimizer = (dense * c.precision.optimizer_bytes_per_param / shards[2]
                 + experts * c.precision.optimizer_bytes_per_param / expert_shards[2])
    # Sharded state needs whole blocks while they compute: stage 3 the gathered weights of
    # the block computing and of the one prefetched (FSDP's default of one block in flight,
    # DeepSpeed's prefetch bucket); stages 2 and 3 one block's whole gradients before they
    # are reduce-scattered.
    resident_blocks = xp.minimum(RESIDENT_BLOCKS, blocks)
    sharding_buffer = (xp.where(m.zero_3, resident_blocks * block_params * (gathered + cached), 0.0)
                       + xp.where(m.zero_2 | m.zero_3, block_params * g, 0.0))
    if m.megatron_fsdp:
        # Megatron-FSDP (stage 3) double-buffers the gradient reduce-scatter: the next block's
        # whole gradients fill while this block's are reduce-scattered (GradReducePipeline,
        # megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py).
        sharding_buffer = sharding_buffer + xp.minimum(1.0, blocks - 1.0) * block_params * g
    weights_hbm = (xp.where(m.weight_offload, resident_blocks * block_params * (e + g), weights + grads)
                   + sharding_buffer)
    return StageState(weights, grads, optimizer, sharding_buffer, weights_hbm,
                      xp.where(m.optimizer_offload, 0.0, optimizer))


def offloaded_bytes(m, xp, state: StageState, activations):
    """What a stage keeps in offload memory: its blocks' weights and gradients, optimizer
    state, and the stored `activations` of its offloading blocks, each when its switch is on."""
    return (xp.where(m.weight_offload, state.weights + state.grads, 0.0)
            + xp.where(m.optimizer_offload, state.optimizer, 0.0) + xp.where(m.activations_offload, activations, 0.0))
