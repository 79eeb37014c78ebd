"""The pipeline's time: 1F1B (interleaved over v chunks per stage, or ZB-H1) at the pace of
the slowest stage, with the stage-boundary sends and the bubble.

Written against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many), as the other formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.stage_costs import StageBlock, StageBlocks, pick
from costmodel.terms.comm import collective_s
from costmodel.terms.context import Context
from costmodel.terms.pipeline import bubble_microbatches
from costmodel.space.layout import end_chunk_blocks, stage_blocks
from costmodel.inputs.system import Collective


@dataclass(frozen=True)
class Stages:
    """The blocks of a first, a middle and a last stage (costmodel.terms.pipeline.stage_blocks),
    the microbatches of one iteration on each, and the blocks of a full chunk on the first
    and the last stage (costmodel.terms.pipeline.end_chunk_blocks; None with equal stages)."""

    first: object
    middle: object
    last: object
    microbatches: object
    chunks: tuple | None = None

    @property
    def equal(self) -> bool:
        """Equal stages come as one value: their formulas reduce to the shorter ones."""
        return self.first is self.middle is self.last

    @staticmethod
    def of(c: Context, m, xp) -> "Stages":
        """A mapping file's layout, else the layout rule for pp and the interleaving."""
        first, middle, last = stage_blocks(xp, c.model.blocks, m.pp, m.first_stage_blocks, m.last_stage_blocks,
                                           m.interleaving)
        stated = None if m.first_stage_blocks is None and m.last_stage_blocks is None else (first, middle, last)
        chunks = None if first is middle is last else end_chunk_blocks(xp, c.model.blocks, m.pp, m.interleaving, stated)
        return Stages(first, middle, last, m.batch / m.dp / m.microbatch, chunks)


@dataclass(frozen=True)
class PipelineTime:
    """One iteration's pipeline on its slowest stage (s; each a scalar or an array)."""

    pipeline_s: object
    """every microbatch through the pacing stage, the bubble and the boundary sends"""
    bubble_s: object
    pp_comm_micro_s: object
    """one microbatch's stage-boundary sends (forward and back, over v chunks)"""
    pace: StageBlock
    """the stage that sets the pace: its blocks and their mean block"""
    pace_head_fwd_s: object
    """the output layer's forward on the pacing stage (0 when a stage without it paces)"""
    pace_head_bwd_s: object


def pipeline_time(c: Context, m, xp, sb: StageBlocks, stages: Stages, head_fwd_s, head_bwd_s=None) -> PipelineTime:
    """1F1B, interleaved over v chunks per stage, at the slowest stage's pace.

    Each stage's microbatch takes its own time, the sum of its own blocks (StageBlocks: its
    blocks times their mean): the first its blocks (the embedding lookup, passes over b·s·h
    elements, is not timed: ~2 % of a block's forward for Llama 3.1 405B at tp 8, while the
    first stage holds a block fewer than the middle ones or, when even, no output layer), a
    middle stage its blocks, the last its blocks and the output layer (`head_fwd_s` forward,
    twice that backward unless `head_bwd_s` says: the multi-token prediction modules of
    costmodel.terms.iteration.mtp_terms join the head). The slowest sets the pace (the last on
    a tie, and always with equal stages of one kind)."""
    p, v = m.pp, m.interleaving
    if head_bwd_s is None:
        head_bwd_s = 2 * head_fwd_s

    def fwd_total(blk):
        return blk.block_fwd_s + blk.offload_fwd_s

    def bwd_total(blk):
        return blk.block_bwd_s + blk.recompute_s + blk.offload_bwd_s

    if stages.equal and sb.uniform:
        pace, pace_head_fwd, pace_head_bwd = sb.last, head_fwd_s, head_bwd_s
    else:
        # the slowest of the stages without the output layer (the first, a middle one)
        fullest = sb.first
        fullest_s = fullest.blocks * (fwd_total(fullest.block) + bwd_total(fullest.block))
        for stage in sb.middles:
            stage_s = stage.blocks * (fwd_total(stage.block) + bwd_total(stage.block))
            fullest = pick(xp, stage_s > fullest_s, stage, fullest)
            fullest_s = xp.maximum(stage_s, fullest_s)
        last = sb.last
        last_paces = last.blocks * (fwd_total(last.block) + bwd_total(last.block)) + (head_fwd_s + head_bwd_s) >= fullest_s
        pace = pick(xp, last_paces, last, fullest)
        pace_head_fwd = xp.where(last_paces, head_fwd_s, 0.0)
        pace_head_bwd = xp.where(last_paces, head_bwd_s, 0.0)
    blk, pace_blocks = pace.block, pace.blocks
    stage_fwd = pace_blocks * fwd_total(blk) + pace_head_fwd
    stage_bwd = pace_blocks * bwd_total(blk) + pace_head_bwd
    # Stage boundaries send the activation forward and its gradient back, split across the
    # tp ranks (Megatron's scatter-gather of pipeline tensors); v chunks mean v boundaries.
    p2p_s = collective_s(c, xp, Collective.p2p, p, blk.act_message_bytes / m.tp, m.pp_net)
    pp_comm_micro = 2 * v * p2p_s
    if c.settings.pp_comm_overlap:
        # Megatron's overlap_p2p_comm (interleaved schedule only: schedules.py
        # forward_backward_pipelining_with_interleaving posts each chunk's send and receive
        # asynchronously and waits on them just before the chunk that needs them): the sends
        # hide behind the microbatch's compute; only what exceeds it stays exposed.
        pp_comm_micro = xp.where(v > 1, xp.maximum(pp_comm_micro - (stage_fwd + stage_bwd), 0.0), pp_comm_micro)
    micro_s = stage_fwd + stage_bwd + pp_comm_micro
    microbatches = stages.microbatches
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
    return PipelineTime(pipeline_s, bubble_s, pp_comm_micro, pace, pace_head_fwd, pace_head_bwd)
