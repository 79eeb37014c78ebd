"""The memory of a GPU in the first, the second and the last pipeline stage (one GPU when
pp = 1), and what it keeps in offload memory.

The first holds the embeddings and the most microbatches in flight, the last the output
layer and the logits; the second, the fullest middle stage, can top the first when stages
are uneven (p - 1 microbatches of m blocks against p of m - 1). MoE experts are sharded over
the expert data-parallel group, the rest over dp·cp (costmodel.terms.data_parallel.Sharding).

Written against the backend interface of costmodel.ops, as the other formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.context import Context
from costmodel.terms.data_parallel import Sharding, StageParams
from costmodel.terms.memory_features import stage_offload_share
from costmodel.terms.pipeline import blocks_in_flight_rank, stage_blocks_in_flight
from costmodel.terms.pipeline_time import Stages
from costmodel.terms.stage_costs import StageBlocks
from costmodel.terms.stage_state import RESIDENT_BLOCKS, TRANSIT_BLOCKS, StageState, blocks_state, offloaded_bytes
from costmodel.terms.step_terms import allocator_bytes

# Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py)
# turns each GPU's b·s·V/tp logits into fp32 and keeps the fp32 softmax for backward, where
# the gradient is formed in place and cast back to 16 bits for the output GEMM's backward:
# 4 bytes per logit kept from forward to backward, and a 16-bit gradient (2 bytes) beside it.
LOGIT_BYTES_KEPT = 4.0
LOGIT_GRAD_BYTES = 2.0
# Eager PyTorch (`F.cross_entropy(logits.float(), ...)`: log_softmax then nll_loss) keeps the
# fp32 log-softmax for backward (4 bytes per logit), and its backward holds beside it the fp32
# gradient nll_loss returns (4) and the fp32 gradient log_softmax's backward writes (4); the
# bf16 logits are freed once cast (the output GEMM's backward needs its input, not its output).
EAGER_LOGIT_BYTES = 12.0


@dataclass(frozen=True)
class StageMemory:
    """Bytes per GPU (each a scalar or an array); of the first stage unless named."""

    first_state: StageState
    embedding_bytes: object
    activations_bytes: object
    output_layer_bytes: object
    """the output layer and final norm with their gradients and optimizer state (last stage)"""
    logits_bytes: object
    """the fp32 logits kept for the loss, their 16-bit gradient and the output GEMM's input"""
    last_stage_activations_bytes: object
    second_stage_activations_bytes: object
    first_stage_hbm_bytes: object
    second_stage_hbm_bytes: object
    last_stage_hbm_bytes: object
    hbm_bytes: object
    """the largest of the three stages' HBM use"""
    activations_hbm_bytes: object
    allocator_bytes: object
    """the caching allocator's fragmentation on the first stage (a whole-step term)"""
    offload_bytes: object
    """the largest of the three stages' offloaded state and activations"""


def activations_in_hbm(m, xp, blocks, blocks_alive, activations, act):
    """A stage's stored activations in HBM. Offloaded: the share o of the stage's blocks that
    offload (all of them unless activation_offload_blocks says N: o = N/blocks); the others
    keep theirs. Every block offloading leaves two blocks' worth in HBM (the one computing and
    the one in transit); some kept, the one computing is among them and one offloaded block
    is in transit."""
    share = stage_offload_share(m, xp, blocks)
    offloaded = share * blocks_alive
    in_flight = xp.where(share < 1.0, xp.minimum(TRANSIT_BLOCKS, offloaded), xp.minimum(RESIDENT_BLOCKS, offloaded))
    return xp.where(m.activations_offload, activations - share * activations + in_flight * act.stored, activations)


def stage_hbm(c: Context, state, activations_hbm, act):
    """On every stage: its blocks' state, one block's recompute workspace, the runtime reserve,
    its activations in flight, and what the allocator holds beyond them."""
    return (state.weights_hbm + state.optimizer_hbm + act.workspace + c.memory.runtime_reserve_bytes + activations_hbm
            + allocator_bytes(c.step.allocator_fraction, act.workspace + activations_hbm))


def fullest_middle(c: Context, m, xp, sb: StageBlocks, stages: Stages, state_of, shared_state=None):
    """(HBM, stored activations in flight, state, blocks) of the middle stage holding the most
    HBM: each distinct middle stage's own blocks, with its rank's activations in flight
    (costmodel.terms.pipeline.blocks_in_flight_rank; of one kind, the second stage)."""
    best = None
    for stage in sb.middles:
        state = shared_state if shared_state is not None else state_of(stage)
        alive = blocks_in_flight_rank(xp, stage.blocks, m.pp, m.interleaving, stages.microbatches, stage.rank)
        act = stage.block.activations
        stored = act.stored * alive
        hbm = stage_hbm(c, state, activations_in_hbm(m, xp, stage.blocks, alive, stored, act), act)
        if best is None:
            best = (hbm, stored, state, stage.blocks)
            continue
        more = hbm > best[0]
        best = (xp.maximum(hbm, best[0]), xp.where(more, stored, best[1]),
                StageState(*(xp.where(more, new, old) for new, old in zip(state, best[2]))),
                xp.where(more, stage.blocks, best[3]))
    return best


def stage_memory(c: Context, m, xp, sb: StageBlocks, stages: Stages, sh: Sharding, params: StageParams,
                 mtp=None) -> StageMemory:
    """What HBM holds on the first, the fullest middle and the last stage, and the offloaded
    bytes: each stage's own blocks (StageBlocks: their state, stored activations and
    workspace; a middle stage's activations in flight are those of its rank)."""
    t, b = m.tp, m.microbatch
    e = c.precision.elem_bytes
    shards, expert_shards = sh.shards(xp), sh.expert_shards(xp)
    state_per_param = e / shards[0] + c.precision.grad_bytes_per_param / shards[1] + c.precision.optimizer_bytes_per_param / shards[2]
    embedding = c.model.embedding_params / t * state_per_param
    # The output layer (StageParams.output_matrix) and the final norm, replicated on every tp rank.
    output_layer = (params.output_matrix / t + c.model.final_norm_params) * state_per_param
    tokens = b * c.model.seq / m.cp
    logit_bytes = LOGIT_BYTES_KEPT + LOGIT_GRAD_BYTES if c.settings.fused_cross_entropy else EAGER_LOGIT_BYTES
    logits = (tokens * c.model.vocab / t * logit_bytes
              + e * tokens * c.model.hidden / xp.where(m.seq_par, t, 1.0))      # and the output GEMM's input
    if mtp is not None:
        # Multi-token prediction on the last stage (costmodel.terms.iteration.mtp_terms): the modules'
        # state (experts over the expert data-parallel group) and the embedding copy it reads
        # when pp > 1, with the output layer's; their logits beside the model's; one
        # microbatch's activations of their blocks with the last stage's.
        expert_state = (e / expert_shards[0] + c.precision.grad_bytes_per_param / expert_shards[1]
                        + c.precision.optimizer_bytes_per_param / expert_shards[2])
        output_layer = (output_layer + mtp.dense_params * state_per_param + mtp.expert_params * expert_state
                        + xp.where(m.pp > 1, embedding, 0.0))
        logits = logits * (1 + c.model.mtp_blocks)
    output_side = logits + allocator_bytes(c.step.allocator_fraction, logits)  # logits are freed every microbatch too
    first, last = stages.first, stages.last

    def state_of(stage):
        return blocks_state(c, m, xp, stage.blocks, stage.dense_params, stage.expert_params, shards, expert_shards)

    first_state = state_of(sb.first)
    # (equal stages of one kind, and by the rule the first and the last, are one value: one state)
    last_state = first_state if last is first and sb.uniform else state_of(sb.last)
    middle_state = first_state if stages.middle is first and sb.uniform else None
    first_alive, _, last_alive = stage_blocks_in_flight(xp, first, stages.middle, last, m.pp, m.interleaving,
                                                        stages.microbatches, stages.chunks)
    first_act, last_act = sb.first.block.activations, sb.last.block.activations
    activations, last_activations = first_act.stored * first_alive, last_act.stored * last_alive
    if mtp is not None:
        last_activations = last_activations + mtp.stored_bytes
    activations_hbm = activations_in_hbm(m, xp, first, first_alive, activations, first_act)
    single_stage = m.pp == 1
    first_hbm = (stage_hbm(c, first_state, activations_hbm, first_act) + embedding
                 + xp.where(single_stage, output_layer + output_side, 0.0))
    second_hbm, second_activations, second_state, second_blocks = fullest_middle(c, m, xp, sb, stages, state_of,
                                                                                middle_state)
    last_hbm = (stage_hbm(c, last_state, activations_in_hbm(m, xp, last, last_alive, last_activations, last_act),
                          last_act)
                + output_layer + output_side + xp.where(single_stage, embedding, 0.0))
    hbm = xp.maximum(xp.maximum(first_hbm, last_hbm), second_hbm)
    offload = offloaded_bytes(m, xp, first_state, stage_offload_share(m, xp, first) * activations)
    if not (stages.equal and sb.uniform):        # (equal, the first holds the most activations)
        offload = xp.maximum(
            xp.maximum(offload, offloaded_bytes(m, xp, last_state, stage_offload_share(m, xp, last) * last_activations)),
            offloaded_bytes(m, xp, second_state, stage_offload_share(m, xp, second_blocks) * second_activations))
    first_allocator = allocator_bytes(c.step.allocator_fraction, first_act.workspace + activations_hbm
                                      + xp.where(single_stage, logits, 0.0))
    return StageMemory(first_state, embedding, activations, output_layer, logits, last_activations, second_activations,
                       first_hbm, second_hbm, last_hbm, hbm, activations_hbm, first_allocator, offload)
