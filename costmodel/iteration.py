"""One training iteration: the block costs assembled into pipeline, data-parallel and
optimizer time, and the memory a GPU of the first and of the last pipeline stage holds.

Written once against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many). Every returned name is a term a person can trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.block_terms import BlockTerms, offload_rate, block_param_shares, block_terms, cp_ring_terms
from costmodel.comm import collective_s, overlapped
from costmodel.layer_time import eltwise_s, gemm_s
from costmodel.context import Context
from costmodel.system import Collective

# FLOP per parameter of an Adam step (moment updates, bias correction, square root, divide,
# weight decay, update): about 12 element-wise operations.
ADAM_FLOPS_PER_PARAM = 12.0
# Softmax + cross-entropy over the logits: ~6 FLOP per logit, as the attention softmax.
CROSS_ENTROPY_FLOPS_PER_ELEM = 6.0
# Offloaded state keeps two blocks in HBM: the one computing and the one in transit
# (the paper's reason why 128T needs 120 GiB of HBM).
RESIDENT_BLOCKS = 2.0

TIME_TERMS = ("forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s",
              "bubble_s", "dp_comm_s", "optimizer_s", "offload_s")
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
    cp_comm_s: object
    ep_comm_s: object
    """MoE token dispatch and combine all-to-alls (0 for a dense model)"""
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


def bubble_microbatches(xp, p, v, microbatches):
    """The 1F1B bubble in microbatch times: (p-1)/v once the pipeline is full; with fewer
    microbatches than stages interleaving cannot fill it and it is p-1."""
    return xp.where(microbatches >= p, (p - 1) / v, p - 1.0)


def blocks_in_flight(xp, blocks_per_stage, p, v, microbatches):
    """Blocks whose activations are alive at the peak on a first-stage GPU: p microbatches of
    the stage's blocks for 1F1B; (p·v + p - 1) chunks of blocks/(p·v) blocks when
    interleaved (Korthikanti et al. 2022 §4.2.3: L·(1 + (p-1)/(p·v)) layers); fewer if there
    are fewer microbatches."""
    return xp.where(v == 1, blocks_per_stage * xp.minimum(p, microbatches),
                    blocks_per_stage / v * xp.minimum(microbatches * v, p * v + p - 1))


def blocks_in_flight_last_stage(xp, blocks_per_stage, p, v, microbatches):
    """Blocks whose activations are alive at the peak on a last-stage GPU: one microbatch
    for 1F1B (its backward follows its forward at once); (p·v - p + 1) chunks when
    interleaved (Megatron's warm-up of (v-1)·p chunks on the last rank, plus one); fewer if
    there are fewer microbatches. With p = 1 it equals blocks_in_flight."""
    return blocks_per_stage / v * xp.minimum(microbatches * v, p * v - p + 1)


def output_layer_s(c: Context, m, xp):
    """Forward time of the logits GEMM and cross-entropy on the last stage, one microbatch
    (this GPU's b·s/cp tokens)."""
    tokens = m.microbatch * c.seq / m.cp
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
    # one block's parameters on this GPU: reduced over dp·cp, and (MoE experts) over dp·cp/ep
    dense_params, expert_params = block_param_shares(c, m)
    block_params = dense_params + expert_params
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
    weight_grad_s = blocks_per_stage * blk.weight_grad_gemm_s
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
    stage_params = blocks_per_stage * dense_params + xp.maximum(first_extra, last_extra) / t
    stage_expert_params = blocks_per_stage * expert_params
    # ZeRO stages (Rajbhandari et al. 2020 §5, §7): 0 all-reduces the gradients once; 1
    # reduce-scatters them and all-gathers the updated 16-bit weights; 2 keeps only its
    # gradient shard, so every microbatch's gradients are reduce-scattered as they appear
    # (DeepSpeed's stage 2 under gradient accumulation); 3 also keeps only its weight shard
    # and all-gathers each block's weights in forward and again in backward, every
    # microbatch, and needs no final all-gather (each GPU updates only its own shard).
    zero_opt = xp.logical_not(m.zero_0)                   # optimizer state sharded (stage >= 1)
    zero_grads = m.zero_2 | m.zero_3                      # gradients sharded (stage >= 2)
    zero_weights = m.zero_3                               # weights sharded (stage 3)
    # With context parallelism the cp GPUs of a replica hold the same weights and each has
    # gradients from its share of the sequence: gradients are reduced, and ZeRO shards, over
    # dp·cp GPUs (Megatron-LM's data-parallel group with context parallelism,
    # parallel_state.get_data_parallel_group(with_context_parallel=True)). That group leaves
    # the replica (and travels on dp's network) when dp > 1, else it is the cp group itself.
    grad_group = dp * m.cp
    grad_net = xp.where(dp > 1, m.dp_net, m.cp_net)
    scatters = xp.where(zero_grads, microbatches, 1.0)
    gathers = xp.where(zero_weights, 2 * microbatches, 1.0)

    def gradient_traffic(group, params):
        grad_bytes = params * c.grad_comm_bytes
        reduce_scatter = collective_s(c, xp, Collective.reduce_scatter, group, grad_bytes, grad_net)
        gather_weights = collective_s(c, xp, Collective.all_gather, group, e * params, grad_net)
        all_reduce = collective_s(c, xp, Collective.all_reduce, group, grad_bytes, grad_net)
        return xp.where(zero_opt, scatters * reduce_scatter + gathers * gather_weights, all_reduce)

    dp_comm = gradient_traffic(grad_group, stage_params)
    # MoE experts: each of the ep GPUs holds different experts, so their gradients are
    # reduced, and ZeRO shards them, over the dp·cp/ep GPUs holding the same experts
    # (Megatron-LM's expert data-parallel group, parallel_state.get_expert_data_parallel_group),
    # on the gradient network, which spans that group.
    expert_group = grad_group / m.ep
    if c.moe_blocks:
        dp_comm = dp_comm + gradient_traffic(expert_group, stage_expert_params)
    # Overlapped, each block's gradients reduce while the last microbatch's backward runs
    # through the blocks before it; the last block's reduction has nothing left to hide behind.
    # Stages 2 and 3 move data every microbatch, behind every microbatch's compute.
    dp_window = xp.where(zero_grads, microbatches * blocks_per_stage * (block_fwd + block_bwd + recompute),
                         (blocks_per_stage - 1) * (block_bwd + recompute))
    dp_exposed, dp_stolen = overlapped(dp_comm, dp_window, xp.where(m.dp_overlap, 1.0, 0.0),
                                       xp.pick(c.net_usage, grad_net), xp)

    # ---- optimizer step over this GPU's share of the stage's parameters ----
    opt_shards = xp.where(zero_opt, grad_group, 1.0)
    grad_shards = xp.where(zero_grads, grad_group, 1.0)
    weight_shards = xp.where(zero_weights, grad_group, 1.0)
    opt_params = stage_params / opt_shards + stage_expert_params / xp.where(zero_opt, expert_group, 1.0)
    g = c.grad_bytes_per_param
    # reads gradient and state, writes state and the new weights
    opt_bytes_per_param = g + 2 * c.optimizer_bytes_per_param + e
    opt_hbm_s = eltwise_s(c, xp, opt_params, ADAM_FLOPS_PER_PARAM, opt_bytes_per_param)
    opt_off_read = (xp.where(m.optimizer_offload, c.optimizer_bytes_per_param, 0.0)
                    + xp.where(m.weight_offload, g, 0.0)) * opt_params
    opt_off_write = (xp.where(m.optimizer_offload, c.optimizer_bytes_per_param, 0.0) + xp.where(m.weight_offload, e, 0.0)) * opt_params
    opt_off_bytes = xp.maximum(opt_off_read, opt_off_write)
    opt_off_s = opt_off_bytes / (offload_rate(c.offload_bytes_per_s) * xp.lookup(c.offload_curve, opt_off_bytes))
    optimizer_s = xp.maximum(opt_hbm_s, opt_off_s)

    iteration_s = pipeline_s + dp_exposed + dp_stolen + optimizer_s

    # ---- memory of a GPU in the first and in the last pipeline stage (one GPU when pp = 1):
    # the first holds the most activations, the last the output layer and the logits ----
    stage_block_params = blocks_per_stage * dense_params
    expert_weight_shards = xp.where(zero_weights, expert_group, 1.0)
    expert_grad_shards = xp.where(zero_grads, expert_group, 1.0)
    expert_opt_shards = xp.where(zero_opt, expert_group, 1.0)
    weights = stage_block_params * e / weight_shards + stage_expert_params * e / expert_weight_shards
    grads = stage_block_params * g / grad_shards + stage_expert_params * g / expert_grad_shards
    optimizer = (stage_block_params * c.optimizer_bytes_per_param / opt_shards
                 + stage_expert_params * c.optimizer_bytes_per_param / expert_opt_shards)
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
    tokens = b * c.seq / m.cp
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
    recompute_flops = c.blocks * t * m.cp / b * (fw.kernel_recompute_flops + xp.where(
        m.recompute_full, fw.matrix_flops, xp.where(m.recompute_attn_only, fw.selective_recompute_flops, 0.0)))
    peak = iteration_s * m.num_procs * c.matrix_flops_per_s
    return IterationTerms(
        iteration_s=iteration_s,
        forward_s=microbatches * (blocks_per_stage * compute_fwd + head_fwd),
        backward_s=microbatches * (blocks_per_stage * compute_bwd + head_bwd),
        recompute_s=microbatches * blocks_per_stage * recompute,
        tp_comm_s=microbatches * blocks_per_stage * (blk.tp_fwd_s + blk.tp_bwd_s),
        cp_comm_s=microbatches * blocks_per_stage * (blk.cp_fwd_s + blk.cp_bwd_s),
        ep_comm_s=microbatches * blocks_per_stage * (blk.ep_fwd_s + blk.ep_bwd_s),
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

