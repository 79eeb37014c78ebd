"""One training iteration: the block costs assembled into pipeline, data-parallel and
optimizer time, and the memory a GPU of the first, the second and the last pipeline stage
holds (the stages' blocks and schedule: costmodel.pipeline).

Written once against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many). Every returned name is a term a person can trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.block_terms import BlockTerms, block_param_shares, block_terms, offload_rate
from costmodel.comm import collective_s, overlapped
from costmodel.layer_time import eltwise_s, gemm_s
from costmodel.context import Context
from costmodel.pipeline import (blocks_in_flight, blocks_in_flight_last_stage, bubble_microbatches, stage_blocks,
                                stage_blocks_in_flight)
from costmodel.stage_state import RESIDENT_BLOCKS, blocks_state, offloaded_bytes
from costmodel.system import Collective

# blocks_in_flight*, bubble_microbatches (costmodel.pipeline) and RESIDENT_BLOCKS
# (costmodel.stage_state) are read from here too.
__all__ = ["ADAM_FLOPS_PER_PARAM", "MEMORY_TERMS", "RESIDENT_BLOCKS", "TIME_TERMS", "BlockTerms", "IterationTerms",
           "block_terms", "blocks_in_flight", "blocks_in_flight_last_stage", "bubble_microbatches", "iteration_terms",
           "output_layer_s"]

# FLOP per parameter of an Adam step (moment updates, bias correction, square root, divide,
# weight decay, update): about 12 element-wise operations.
ADAM_FLOPS_PER_PARAM = 12.0
# Softmax + cross-entropy over the logits: ~6 FLOP per logit, as the attention softmax.
CROSS_ENTROPY_FLOPS_PER_ELEM = 6.0

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
                "last_stage_activations_bytes", "second_stage_activations_bytes", "runtime_reserve_bytes",
                "first_stage_hbm_bytes", "second_stage_hbm_bytes", "last_stage_hbm_bytes")


@dataclass(frozen=True)
class IterationTerms:
    """Every named term of one iteration (SI units; each a scalar or an array). The time
    terms (`TIME_TERMS`) add up to `iteration_s`, those of the pipeline (forward to offload)
    on the slowest stage; the memory terms (`MEMORY_TERMS`) are per GPU, of the first
    pipeline stage unless named for the second or the last; docs/cost-model.md gives each
    formula."""

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
    second_stage_activations_bytes: object
    """stored activations in flight on the second stage (a middle one when pp > 2)"""
    runtime_reserve_bytes: object
    first_stage_hbm_bytes: object
    second_stage_hbm_bytes: object
    """its blocks' state and activations: more than the first's when uneven stages give the
    first one block fewer and pp exceeds the middle stages' blocks"""
    last_stage_hbm_bytes: object
    hbm_bytes: object
    """the largest of the first, the second and the last stage's HBM use"""
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
    # blocks of a first, a middle and a last stage: a mapping file's layout, else pp's rule;
    # equal stages come as one value, and their formulas reduce to the shorter ones below
    first, middle, last = stage_blocks(xp, c.blocks, p, m.first_stage_blocks, m.last_stage_blocks)
    equal_stages = first is middle is last

    # ---- one block, one microbatch ----
    blk = block_terms(c, m, xp)
    fw = blk.forward
    compute_fwd, compute_bwd = blk.compute_fwd_s, blk.compute_bwd_s
    block_fwd, block_bwd, recompute = blk.block_fwd_s, blk.block_bwd_s, blk.recompute_s
    act_message = blk.act_message_bytes
    act = blk.activations
    # one block's parameters on this GPU: reduced over dp·cp, and (MoE experts) over dp·cp/ep
    dense_params, expert_params = block_param_shares(c, m)
    off_fwd_exposed, off_bwd_exposed = blk.offload_fwd_s, blk.offload_bwd_s
    offload_needed = blk.offload_bytes_per_s_needed

    head_fwd = output_layer_s(c, m, xp)
    head_bwd = 2 * head_fwd

    # ---- pipeline: 1F1B, interleaved over v chunks per stage, at the slowest stage's pace ----
    # Each stage's microbatch takes its own time: the first its blocks (the embedding lookup,
    # passes over b·s·h elements, is not timed: ~2 % of a block's forward for Llama 3.1 405B
    # at tp 8, while the first stage holds a block fewer than the middle ones or, when even,
    # no output layer), a middle stage its blocks, the last its blocks and the output layer.
    # The slowest sets the pace (the last on a tie, and always with equal stages); the
    # breakdown below is that stage's.
    block_fwd_total = block_fwd + off_fwd_exposed
    block_bwd_total = block_bwd + recompute + off_bwd_exposed
    if equal_stages:
        pace_blocks, pace_head_fwd, pace_head_bwd = last, head_fwd, head_bwd
    else:
        block_total = block_fwd_total + block_bwd_total
        fullest = xp.maximum(first, middle)              # of the stages without the output layer
        last_paces = last * block_total + (head_fwd + head_bwd) >= fullest * block_total
        pace_blocks = xp.where(last_paces, last, fullest)
        pace_head_fwd = xp.where(last_paces, head_fwd, 0.0)
        pace_head_bwd = xp.where(last_paces, head_bwd, 0.0)
    stage_fwd = pace_blocks * block_fwd_total + pace_head_fwd
    stage_bwd = pace_blocks * block_bwd_total + pace_head_bwd
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
    # With uneven stages T_F, T_B and T_W are the slowest stage's.
    zero_bubble = m.sched_zb_h1 & (v == 1)
    weight_grad_s = pace_blocks * blk.weight_grad_gemm_s
    bubble_s = xp.where(zero_bubble, (p - 1) * (micro_s - 2 * weight_grad_s), bubble_micro * micro_s)
    pipeline_s = xp.where(zero_bubble, microbatches * micro_s + bubble_s, (microbatches + bubble_micro) * micro_s)

    # ---- data parallelism: gradient reduction of the stage's parameters ----
    # The output layer's V·h/tp weights: its own when untied; when tied, a copy on the last
    # stage if that is not the first (Megatron-LM keeps one and all-reduces its gradient with
    # the embedding's), none when pp = 1.
    output_matrix = xp.where(p > 1, c.output_layer_params, 0.0 if c.tied_embeddings else c.output_layer_params)
    # Each stage reduces and steps its own parameters (first: its blocks and the embeddings;
    # middle: its blocks; last: its blocks and the output layer; all of them when pp = 1);
    # the stage with the most sets the reduction and the optimizer step.
    first_extra = c.embedding_params + xp.where(p == 1, output_matrix, 0.0)
    last_extra = output_matrix + xp.where(p == 1, c.embedding_params, 0.0)
    if equal_stages:                          # the blocks and the larger of the two extras
        stage_params = first * dense_params + xp.maximum(first_extra, last_extra) / t
        params_blocks = first
    else:
        first_params = first * dense_params + first_extra / t
        middle_params = middle * dense_params
        last_params = last * dense_params + last_extra / t
        stage_params = xp.maximum(xp.maximum(first_params, last_params), middle_params)
        last_most = last_params >= xp.maximum(first_params, middle_params)
        params_blocks = xp.where(last_most, last, xp.where(first_params >= middle_params, first, middle))
    stage_expert_params = params_blocks * expert_params
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
    dp_window = xp.where(zero_grads, microbatches * params_blocks * (block_fwd + block_bwd + recompute),
                         (params_blocks - 1) * (block_bwd + recompute))
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

    # ---- memory of a GPU in the first, the second and the last stage (one GPU when pp = 1):
    # the first holds the embeddings and the most microbatches in flight, the last the output
    # layer and the logits; the second, the fullest middle stage, can top the first when
    # stages are uneven (p - 1 microbatches of m blocks against p of m - 1) ----
    # (MoE experts are sharded over the expert data-parallel group, the rest over dp·cp)
    shards = (weight_shards, grad_shards, opt_shards)
    expert_shards = tuple(xp.where(sharded, expert_group, 1.0) for sharded in (zero_weights, zero_grads, zero_opt))
    state_per_param = e / weight_shards + g / grad_shards + c.optimizer_bytes_per_param / opt_shards

    def activations_in_hbm(blocks_alive, activations):
        return xp.where(m.activations_offload, xp.minimum(RESIDENT_BLOCKS, blocks_alive) * act.stored, activations)

    def stage_hbm(state, activations_hbm):
        # on every stage: its blocks' state, one block's recompute workspace, the runtime
        # reserve, its activations in flight
        return state.weights_hbm + state.optimizer_hbm + act.workspace + c.runtime_reserve_bytes + activations_hbm

    embedding = c.embedding_params / t * state_per_param
    # The output layer (output_matrix above) and the final norm, replicated on every tp rank.
    output_layer = (output_matrix / t + c.final_norm_params) * state_per_param
    tokens = b * c.seq / m.cp
    logits = (tokens * c.vocab / t * (LOGIT_BYTES_KEPT + LOGIT_GRAD_BYTES)
              + e * tokens * c.hidden / xp.where(m.seq_par, t, 1.0))      # and the output GEMM's input
    first_state = blocks_state(c, m, xp, first, dense_params, expert_params, shards, expert_shards)
    # (equal stages, and by the rule the first and the last, are one value: one state)
    second_state, last_state = (first_state if blocks is first
                                else blocks_state(c, m, xp, blocks, dense_params, expert_params, shards, expert_shards)
                                for blocks in (middle, last))
    first_alive, second_alive, last_alive = stage_blocks_in_flight(xp, first, middle, last, p, v, microbatches)
    activations, second_activations, last_activations = (act.stored * first_alive, act.stored * second_alive,
                                                          act.stored * last_alive)
    activations_hbm = activations_in_hbm(first_alive, activations)
    single_stage = p == 1
    first_hbm = stage_hbm(first_state, activations_hbm) + embedding + xp.where(single_stage, output_layer + logits, 0.0)
    second_hbm = stage_hbm(second_state, activations_in_hbm(second_alive, second_activations))
    last_hbm = (stage_hbm(last_state, activations_in_hbm(last_alive, last_activations)) + output_layer + logits
                + xp.where(single_stage, embedding, 0.0))
    hbm = xp.maximum(xp.maximum(first_hbm, last_hbm), second_hbm)
    offload = offloaded_bytes(m, xp, first_state, activations)
    if not equal_stages:                      # (equal, the first holds the most activations)
        offload = xp.maximum(xp.maximum(offload, offloaded_bytes(m, xp, last_state, last_activations)),
                             offloaded_bytes(m, xp, second_state, second_activations))

    model_flops = c.model_flops_per_sample * m.batch
    recompute_flops = c.blocks * t * m.cp / b * (fw.kernel_recompute_flops + xp.where(
        m.recompute_full, fw.matrix_flops, xp.where(m.recompute_attn_only, fw.selective_recompute_flops, 0.0)))
    peak = iteration_s * m.num_procs * c.matrix_flops_per_s
    return IterationTerms(
        iteration_s=iteration_s,
        forward_s=microbatches * (pace_blocks * compute_fwd + pace_head_fwd),
        backward_s=microbatches * (pace_blocks * compute_bwd + pace_head_bwd),
        recompute_s=microbatches * pace_blocks * recompute,
        tp_comm_s=microbatches * pace_blocks * (blk.tp_fwd_s + blk.tp_bwd_s),
        cp_comm_s=microbatches * pace_blocks * (blk.cp_fwd_s + blk.cp_bwd_s),
        ep_comm_s=microbatches * pace_blocks * (blk.ep_fwd_s + blk.ep_bwd_s),
        offload_s=microbatches * pace_blocks * (off_fwd_exposed + off_bwd_exposed),
        pp_comm_s=microbatches * pp_comm_micro,
        bubble_s=bubble_s,
        dp_comm_s=dp_exposed + dp_stolen,
        optimizer_s=optimizer_s,
        weights_bytes=first_state.weights,
        weight_grads_bytes=first_state.grads,
        optimizer_bytes=first_state.optimizer,
        sharding_buffer_bytes=first_state.sharding_buffer,
        embedding_bytes=embedding,
        activations_bytes=activations,
        activation_workspace_bytes=act.workspace,
        output_layer_bytes=output_layer,
        logits_bytes=logits,
        last_stage_activations_bytes=last_activations,
        second_stage_activations_bytes=second_activations,
        runtime_reserve_bytes=c.runtime_reserve_bytes,
        first_stage_hbm_bytes=first_hbm,
        second_stage_hbm_bytes=second_hbm,
        last_stage_hbm_bytes=last_hbm,
        hbm_bytes=hbm,
        weights_hbm_bytes=first_state.weights_hbm,
        optimizer_hbm_bytes=first_state.optimizer_hbm,
        activations_hbm_bytes=activations_hbm,
        offload_bytes=offload,
        offload_bytes_per_s_needed=offload_needed,
        mfu=model_flops / peak,
        hfu=(model_flops + recompute_flops * m.batch) / peak,
        sample_rate=m.batch / iteration_s,
    )

