"""One training iteration: the block costs assembled into pipeline, data-parallel and
optimizer time, and the memory a GPU of the first and of the last pipeline stage holds.

Written once against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many). Every returned name is a term a person can trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.block import (BlockForward, StoredActivations, block_forward_times, block_stored_activation_bytes,
                             eltwise_s, gemm_s)
from costmodel.comm import collective_s, overlapped, tp_overlap_terms
from costmodel.context import Context
from costmodel.pipeline import blocks_in_flight, blocks_in_flight_last_stage, bubble_microbatches
from costmodel.system import Collective

# FLOP per parameter of an Adam step (moment updates, bias correction, square root, divide,
# weight decay, update): about 12 element-wise operations.
ADAM_FLOPS_PER_PARAM = 12.0
# Softmax + cross-entropy over the logits: ~6 FLOP per logit, as the attention softmax.
CROSS_ENTROPY_FLOPS_PER_ELEM = 6.0
# Offloaded state keeps two blocks in HBM: the one computing and the one in transit
# (the paper's reason why 128T needs 120 GiB of HBM).
RESIDENT_BLOCKS = 2.0

TIME_TERMS = ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "pp_comm_s", "bubble_s",
              "dp_comm_s", "optimizer_s", "offload_s")
# Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py)
# turns each GPU's b·s·V/tp logits into fp32 and keeps the fp32 softmax for backward, where
# the gradient is formed in place and cast back to 16 bits for the output GEMM's backward:
# 4 bytes per logit kept from forward to backward, and a 16-bit gradient (2 bytes) beside it.
LOGIT_BYTES_KEPT = 4.0
LOGIT_GRAD_BYTES = 2.0

MEMORY_TERMS = ("weights_bytes", "weight_grads_bytes", "optimizer_bytes", "sharding_buffer_bytes", "embedding_bytes",
                "activations_bytes", "activation_workspace_bytes", "output_layer_bytes", "logits_bytes",
                "last_stage_activations_bytes", "runtime_reserve_bytes", "first_stage_hbm_bytes",
                "last_stage_hbm_bytes")


@dataclass(frozen=True)
class BlockTerms:
    """One block, one microbatch, one GPU (seconds, bytes; each a scalar or an array)."""

    forward: BlockForward
    compute_fwd_s: object
    compute_bwd_s: object
    tp_fwd_s: object
    """TP communication in forward, exposed plus the compute it steals while overlapping"""
    tp_bwd_s: object
    block_fwd_s: object
    """compute + TP communication, forward"""
    block_bwd_s: object
    recompute_s: object
    act_message_bytes: object
    """one activation tensor (microbatch · seq · hidden elements)"""
    activations: StoredActivations
    offload_fwd_s: object
    """offload traffic compute cannot hide, forward"""
    offload_bwd_s: object
    offload_bytes_per_s_needed: object
    """offload bandwidth that would hide all of this block's traffic"""


@dataclass(frozen=True)
class IterationTerms:
    """Every named term of one iteration (SI units; each a scalar or an array). The time
    terms (`TIME_TERMS`) add up to `iteration_s`; the memory terms (`MEMORY_TERMS`) are per
    GPU, of the first pipeline stage unless named for the last; docs/cost-model.md gives
    each formula."""

    iteration_s: object
    forward_s: object
    backward_s: object
    recompute_s: object
    tp_comm_s: object
    offload_s: object
    pp_comm_s: object
    bubble_s: object
    dp_comm_s: object
    optimizer_s: object
    weights_bytes: object
    weight_grads_bytes: object
    optimizer_bytes: object
    sharding_buffer_bytes: object
    """ZeRO-2/3: one block's whole gradients, and (stage 3) two blocks' gathered weights"""
    embedding_bytes: object
    activations_bytes: object
    activation_workspace_bytes: object
    output_layer_bytes: object
    """the output layer and final norm with their gradients and optimizer state (last stage)"""
    logits_bytes: object
    """the fp32 logits kept for the loss, their 16-bit gradient and the output GEMM's input"""
    last_stage_activations_bytes: object
    runtime_reserve_bytes: object
    first_stage_hbm_bytes: object
    last_stage_hbm_bytes: object
    hbm_bytes: object
    """the larger of the first and the last stage's HBM use"""
    weights_hbm_bytes: object
    optimizer_hbm_bytes: object
    activations_hbm_bytes: object
    offload_bytes: object
    offload_bytes_per_s_needed: object
    mfu: object
    hfu: object
    sample_rate: object

    def named(self, names: tuple[str, ...]) -> dict:
        """The terms called `names` (e.g. TIME_TERMS), by name, for output."""
        return {name: getattr(self, name) for name in names}


def _rate(bytes_per_s: float) -> float:
    # No offload tier: its flags are never on, so its traffic is 0 bytes; an infinite rate
    # keeps 0 / rate = 0 without dividing by zero.
    return bytes_per_s if bytes_per_s > 0 else float("inf")


def block_terms(c: Context, m, xp) -> BlockTerms:
    """One block, one microbatch, one GPU: compute, exposed TP communication (with the
    compute it steals), recomputation and the offload traffic compute cannot hide, in
    seconds; and the block's stored activations. Reads tp, microbatch and the flags."""
    fw = block_forward_times(c, m, xp)
    compute_fwd = fw.gemm_s + fw.eltwise_s
    compute_bwd = 2 * compute_fwd

    act_message = c.elem_bytes * m.microbatch * c.seq * c.hidden
    region_s, hidden_fraction, gather_s = tp_overlap_terms(c, m, xp, act_message)
    tp_usage = xp.pick(c.net_usage, m.tp_net)
    redo_gather = m.seq_par & m.seq_par_ag_redo & xp.logical_not(m.recompute_full)
    tp_fwd = 2 * region_s                       # two parallel regions: attention, MLP
    tp_bwd = 2 * region_s + xp.where(redo_gather, 2 * gather_s, 0.0)
    tp_fwd_exposed, tp_fwd_stolen = overlapped(tp_fwd, fw.gemm_s, hidden_fraction, tp_usage, xp)
    tp_bwd_exposed, tp_bwd_stolen = overlapped(tp_bwd, 2 * fw.gemm_s, hidden_fraction, tp_usage, xp)
    block_fwd = compute_fwd + tp_fwd_exposed + tp_fwd_stolen
    block_bwd = compute_bwd + tp_bwd_exposed + tp_bwd_stolen
    # Full: the whole block forward again; attn_only: the (unfused) attention core; and a fused
    # attention kernel's backward redoes its scores whatever the setting.
    recompute = fw.kernel_recompute_s + xp.where(m.recompute_full, block_fwd,
                                                    xp.where(m.recompute_attn_only, fw.selective_recompute_s, 0.0))

    # ---- offload traffic per block and microbatch (tier 2 <-> HBM, per direction) ----
    e = c.elem_bytes
    act = block_stored_activation_bytes(c, m, xp)
    block_params = c.block_params / m.tp
    off_rate = _rate(c.offload_bytes_per_s)
    fwd_read = xp.where(m.weight_offload, e * block_params, 0.0)
    fwd_write = xp.where(m.activations_offload, act.stored, 0.0)
    g = c.grad_bytes_per_param
    bwd_read = xp.where(m.weight_offload, (e + g) * block_params, 0.0) + fwd_write
    bwd_write = xp.where(m.weight_offload, g * block_params, 0.0)
    off_fwd_bytes = xp.maximum(fwd_read, fwd_write)
    off_bwd_bytes = xp.maximum(bwd_read, bwd_write)
    off_fwd_s = off_fwd_bytes / (off_rate * xp.lookup(c.offload_curve, off_fwd_bytes))
    off_bwd_s = off_bwd_bytes / (off_rate * xp.lookup(c.offload_curve, off_bwd_bytes))
    return BlockTerms(
        forward=fw,
        compute_fwd_s=compute_fwd,
        compute_bwd_s=compute_bwd,
        tp_fwd_s=tp_fwd_exposed + tp_fwd_stolen,
        tp_bwd_s=tp_bwd_exposed + tp_bwd_stolen,
        block_fwd_s=block_fwd,
        block_bwd_s=block_bwd,
        recompute_s=recompute,
        act_message_bytes=act_message,
        activations=act,
        offload_fwd_s=xp.maximum(off_fwd_s - block_fwd, 0.0),
        offload_bwd_s=xp.maximum(off_bwd_s - (block_bwd + recompute), 0.0),
        offload_bytes_per_s_needed=xp.maximum(off_fwd_bytes / block_fwd, off_bwd_bytes / (block_bwd + recompute)),
    )


def output_layer_s(c: Context, m, xp):
    """Forward time of the logits GEMM and cross-entropy on the last stage, one microbatch."""
    tokens = m.microbatch * c.seq
    vocab_cols = c.vocab / m.tp
    num_bytes = c.elem_bytes * (tokens * c.hidden + c.hidden * vocab_cols + tokens * vocab_cols)
    return gemm_s(c, xp, tokens, vocab_cols, c.hidden, num_bytes) + eltwise_s(c, xp, tokens * vocab_cols, CROSS_ENTROPY_FLOPS_PER_ELEM,
                                                        2 * c.elem_bytes)


def iteration_terms(c: Context, m, xp) -> IterationTerms:
    """All named time (s), memory (bytes) and rate terms of one iteration."""
    t, p, dp, v, b = m.tp, m.pp, m.dp, m.interleaving, m.microbatch
    e = c.elem_bytes
    microbatches = m.batch / dp / b
    blocks_per_stage = c.blocks / p

    # ---- one block, one microbatch ----
    blk = block_terms(c, m, xp)
    fw = blk.forward
    compute_fwd, compute_bwd = blk.compute_fwd_s, blk.compute_bwd_s
    block_fwd, block_bwd, recompute = blk.block_fwd_s, blk.block_bwd_s, blk.recompute_s
    act_message = blk.act_message_bytes
    act = blk.activations
    block_params = c.block_params / t
    off_fwd_exposed, off_bwd_exposed = blk.offload_fwd_s, blk.offload_bwd_s
    offload_needed = blk.offload_bytes_per_s_needed

    head_fwd = output_layer_s(c, m, xp)
    head_bwd = 2 * head_fwd

    # ---- pipeline: 1F1B, interleaved over v chunks per stage ----
    stage_fwd = blocks_per_stage * (block_fwd + off_fwd_exposed) + head_fwd
    stage_bwd = blocks_per_stage * (block_bwd + recompute + off_bwd_exposed) + head_bwd
    # Stage boundaries send the activation forward and its gradient back, split across the
    # tp ranks (Megatron's scatter-gather of pipeline tensors); v chunks mean v boundaries.
    p2p_s = collective_s(c, xp, Collective.p2p, p, act_message / t, m.pp_net)
    pp_comm_micro = 2 * v * p2p_s
    micro_s = stage_fwd + stage_bwd + pp_comm_micro
    bubble_micro = bubble_microbatches(xp, p, v, microbatches)
    # ZB-H1 (Qi et al. 2024, §3.1 and Table 1): with backward split into B (activation
    # gradients) and W (weight gradients), 1F1B's bubble (p-1)·(T_F + T_B + T_W) becomes
    # (p-1)·(T_F + T_B - T_W): the deferred W passes fill the cool-down. W is a stage's
    # weight-gradient GEMMs, as long as its forward GEMMs (each backward GEMM is one forward
    # GEMM); on the non-interleaved schedule only (v = 1; with v > 1 it changes nothing).
    zero_bubble = m.sched_zb_h1 & (v == 1)
    weight_grad_s = blocks_per_stage * fw.gemm_s
    bubble_s = xp.where(zero_bubble, (p - 1) * (micro_s - 2 * weight_grad_s), bubble_micro * micro_s)
    pipeline_s = xp.where(zero_bubble, microbatches * micro_s + bubble_s, (microbatches + bubble_micro) * micro_s)

    # ---- data parallelism: gradient reduction of the stage's parameters ----
    # The output layer's V·h/tp weights: its own when untied; when tied, a copy on the last
    # stage if that is not the first (Megatron-LM keeps one and all-reduces its gradient with
    # the embedding's), none when pp = 1.
    output_matrix = xp.where(p > 1, c.output_layer_params, 0.0 if c.tied_embeddings else c.output_layer_params)
    # The stage with the most parameters outside its blocks (first: embeddings; last: output
    # layer; both when pp = 1) sets the reduction and the optimizer step.
    first_extra = c.embedding_params + xp.where(p == 1, output_matrix, 0.0)
    last_extra = output_matrix + xp.where(p == 1, c.embedding_params, 0.0)
    stage_params = blocks_per_stage * block_params + xp.maximum(first_extra, last_extra) / t
    grad_bytes = stage_params * c.grad_comm_bytes
    # ZeRO stages (Rajbhandari et al. 2020 §5, §7): 0 all-reduces the gradients once; 1
    # reduce-scatters them and all-gathers the updated 16-bit weights; 2 keeps only its
    # gradient shard, so every microbatch's gradients are reduce-scattered as they appear
    # (DeepSpeed's stage 2 under gradient accumulation); 3 also keeps only its weight shard
    # and all-gathers each block's weights in forward and again in backward, every
    # microbatch, and needs no final all-gather (each GPU updates only its own shard).
    zero_opt = xp.logical_not(m.zero_0)                   # optimizer state sharded (stage >= 1)
    zero_grads = m.zero_2 | m.zero_3                      # gradients sharded (stage >= 2)
    zero_weights = m.zero_3                               # weights sharded (stage 3)
    reduce_scatter = collective_s(c, xp, Collective.reduce_scatter, dp, grad_bytes, m.dp_net)
    gather_weights = collective_s(c, xp, Collective.all_gather, dp, e * stage_params, m.dp_net)
    dp_all_reduce = collective_s(c, xp, Collective.all_reduce, dp, grad_bytes, m.dp_net)
    scatters = xp.where(zero_grads, microbatches, 1.0)
    gathers = xp.where(zero_weights, 2 * microbatches, 1.0)
    dp_comm = xp.where(zero_opt, scatters * reduce_scatter + gathers * gather_weights, dp_all_reduce)
    # Overlapped, each block's gradients reduce while the last microbatch's backward runs
    # through the blocks before it; the last block's reduction has nothing left to hide behind.
    # Stages 2 and 3 move data every microbatch, behind every microbatch's compute.
    dp_window = xp.where(zero_grads, microbatches * blocks_per_stage * (block_fwd + block_bwd + recompute),
                         (blocks_per_stage - 1) * (block_bwd + recompute))
    dp_exposed, dp_stolen = overlapped(dp_comm, dp_window, xp.where(m.dp_overlap, 1.0, 0.0),
                                       xp.pick(c.net_usage, m.dp_net), xp)

    # ---- optimizer step over this GPU's share of the stage's parameters ----
    opt_shards = xp.where(zero_opt, dp, 1.0)
    grad_shards = xp.where(zero_grads, dp, 1.0)
    weight_shards = xp.where(zero_weights, dp, 1.0)
    opt_params = stage_params / opt_shards
    g = c.grad_bytes_per_param
    # reads gradient and state, writes state and the new weights
    opt_bytes_per_param = g + 2 * c.optimizer_bytes_per_param + e
    opt_hbm_s = eltwise_s(c, xp, opt_params, ADAM_FLOPS_PER_PARAM, opt_bytes_per_param)
    opt_off_read = (xp.where(m.optimizer_offload, c.optimizer_bytes_per_param, 0.0)
                    + xp.where(m.weight_offload, g, 0.0)) * opt_params
    opt_off_write = (xp.where(m.optimizer_offload, c.optimizer_bytes_per_param, 0.0) + xp.where(m.weight_offload, e, 0.0)) * opt_params
    opt_off_bytes = xp.maximum(opt_off_read, opt_off_write)
    opt_off_s = opt_off_bytes / (_rate(c.offload_bytes_per_s) * xp.lookup(c.offload_curve, opt_off_bytes))
    optimizer_s = xp.maximum(opt_hbm_s, opt_off_s)

    iteration_s = pipeline_s + dp_exposed + dp_stolen + optimizer_s

    # ---- memory of a GPU in the first and in the last pipeline stage (one GPU when pp = 1):
    # the first holds the most activations, the last the output layer and the logits ----
    stage_block_params = blocks_per_stage * block_params
    weights = stage_block_params * e / weight_shards
    grads = stage_block_params * g / grad_shards
    optimizer = stage_block_params * c.optimizer_bytes_per_param / opt_shards
    state_per_param = e / weight_shards + g / grad_shards + c.optimizer_bytes_per_param / opt_shards
    # Sharded state needs whole blocks while they compute: stage 3 the gathered weights of
    # the block computing and of the one prefetched (FSDP's default of one block in flight,
    # DeepSpeed's prefetch bucket); stages 2 and 3 one block's whole gradients before they
    # are reduce-scattered.
    resident_blocks = xp.minimum(RESIDENT_BLOCKS, blocks_per_stage)
    sharding_buffer = (xp.where(zero_weights, resident_blocks * block_params * e, 0.0)
                       + xp.where(zero_grads, block_params * g, 0.0))
    embedding = c.embedding_params / t * state_per_param
    # The output layer (output_matrix above) and the final norm, replicated on every tp rank.
    output_layer = (output_matrix / t + c.final_norm_params) * state_per_param
    tokens = b * c.seq
    logits = (tokens * c.vocab / t * (LOGIT_BYTES_KEPT + LOGIT_GRAD_BYTES)
              + e * tokens * c.hidden / xp.where(m.seq_par, t, 1.0))      # and the output GEMM's input
    inflight_blocks = blocks_in_flight(xp, blocks_per_stage, p, v, microbatches)
    activations = act.stored * inflight_blocks
    last_inflight = blocks_in_flight_last_stage(xp, blocks_per_stage, p, v, microbatches)
    last_activations = act.stored * last_inflight
    workspace = act.workspace
    weights_hbm = xp.where(m.weight_offload, resident_blocks * block_params * (e + g), weights + grads) + sharding_buffer
    activations_hbm = xp.where(m.activations_offload, xp.minimum(RESIDENT_BLOCKS, inflight_blocks) * act.stored, activations)
    last_activations_hbm = xp.where(m.activations_offload, xp.minimum(RESIDENT_BLOCKS, last_inflight) * act.stored,
                                    last_activations)
    optimizer_hbm = xp.where(m.optimizer_offload, 0.0, optimizer)
    # on every stage: its blocks' state, one block's recompute workspace, the runtime reserve
    every_stage_hbm = weights_hbm + optimizer_hbm + workspace + c.runtime_reserve_bytes
    single_stage = p == 1
    first_hbm = every_stage_hbm + activations_hbm + embedding + xp.where(single_stage, output_layer + logits, 0.0)
    last_hbm = every_stage_hbm + last_activations_hbm + output_layer + logits + xp.where(single_stage, embedding, 0.0)
    hbm = xp.maximum(first_hbm, last_hbm)
    offload = (xp.where(m.weight_offload, weights + grads, 0.0) + xp.where(m.optimizer_offload, optimizer, 0.0)
               + xp.where(m.activations_offload, activations, 0.0))

    model_flops = c.model_flops_per_sample * m.batch
    recompute_flops = c.blocks * t / b * (fw.kernel_recompute_flops + xp.where(
        m.recompute_full, fw.matrix_flops, xp.where(m.recompute_attn_only, fw.selective_recompute_flops, 0.0)))
    peak = iteration_s * m.num_procs * c.matrix_flops_per_s
    return IterationTerms(
        iteration_s=iteration_s,
        forward_s=microbatches * (blocks_per_stage * compute_fwd + head_fwd),
        backward_s=microbatches * (blocks_per_stage * compute_bwd + head_bwd),
        recompute_s=microbatches * blocks_per_stage * recompute,
        tp_comm_s=microbatches * blocks_per_stage * (blk.tp_fwd_s + blk.tp_bwd_s),
        offload_s=microbatches * blocks_per_stage * (off_fwd_exposed + off_bwd_exposed),
        pp_comm_s=microbatches * pp_comm_micro,
        bubble_s=bubble_s,
        dp_comm_s=dp_exposed + dp_stolen,
        optimizer_s=optimizer_s,
        weights_bytes=weights,
        weight_grads_bytes=grads,
        optimizer_bytes=optimizer,
        sharding_buffer_bytes=sharding_buffer,
        embedding_bytes=embedding,
        activations_bytes=activations,
        activation_workspace_bytes=workspace,
        output_layer_bytes=output_layer,
        logits_bytes=logits,
        last_stage_activations_bytes=last_activations,
        runtime_reserve_bytes=c.runtime_reserve_bytes,
        first_stage_hbm_bytes=first_hbm,
        last_stage_hbm_bytes=last_hbm,
        hbm_bytes=hbm,
        weights_hbm_bytes=weights_hbm,
        optimizer_hbm_bytes=optimizer_hbm,
        activations_hbm_bytes=activations_hbm,
        offload_bytes=offload,
        offload_bytes_per_s_needed=offload_needed,
        mfu=model_flops / peak,
        hfu=(model_flops + recompute_flops * m.batch) / peak,
        sample_rate=m.batch / iteration_s,
    )

