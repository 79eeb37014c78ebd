"""Each pipeline stage's own blocks as one mean block: the kinds it holds
(costmodel.terms.stage_kinds) weighted by its counts, so `blocks × its mean` is the exact sum
of its blocks' terms (time, stored activations, parameters), and its recompute workspace is
the largest of the kinds it holds. A model of one kind has one block for
every stage (the same object: the formulas reduce to the single-kind ones).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace

from costmodel.terms.block_offload import kind_param_shares
from costmodel.terms.block_terms import BlockTerms, KindBlocks, mix_terms
from costmodel.terms.context import Context
from costmodel.terms.stage_kinds import stage_blocks_of, stage_kinds


@dataclass(frozen=True)
class StageForward:
    """What the stage formulas read of a block's forward (BlockForward's names)."""

    weight_grad_s: object
    weight_quantize_s: object


@dataclass(frozen=True)
class StageActivations:
    """What the stage formulas read of a block's stored activations (StoredActivations')."""

    stored: object
    workspace: object


@dataclass(frozen=True)
class StageMean:
    """The mean of a stage's blocks of several kinds: the terms of BlockTerms the stage
    formulas read, by the same names (a model of one kind keeps its BlockTerms)."""

    compute_fwd_s: object
    compute_bwd_s: object
    tp_fwd_s: object
    tp_bwd_s: object
    cp_fwd_s: object
    cp_bwd_s: object
    ep_fwd_s: object
    ep_bwd_s: object
    ep_unpaired_s: object
    block_fwd_s: object
    block_bwd_s: object
    recompute_s: object
    offload_fwd_s: object
    offload_bwd_s: object
    act_message_bytes: object
    forward: StageForward
    activations: StageActivations

    @property
    def weight_grad_gemm_s(self):
        return self.forward.weight_grad_s

    @staticmethod
    def of(blk: BlockTerms) -> "StageMean":
        """One block's terms that a stage reads."""
        names = [f.name for f in fields(StageMean) if f.name not in ("forward", "activations")]
        return StageMean(**{name: getattr(blk, name) for name in names},
                         forward=StageForward(blk.forward.weight_grad_s, blk.forward.weight_quantize_s),
                         activations=StageActivations(blk.activations.stored, blk.activations.workspace))


@dataclass(frozen=True)
class StageBlock:
    """One stage: its blocks (all kinds), their mean block, and their parameters per block
    on one GPU (dense-group, expert: kind_param_shares, weighted by the stage's counts)."""

    blocks: object
    block: BlockTerms | StageMean
    dense_params: object
    expert_params: object
    rank: object = 0.0
    """the pipeline rank (a middle stage's lowest holding these blocks)"""


@dataclass(frozen=True)
class StageBlocks:
    """The first, the last and the distinct middle stages (StageKinds.middles)."""

    first: StageBlock
    last: StageBlock
    middles: tuple

    @property
    def uniform(self) -> bool:
        """Every stage's mean block is the one kind's."""
        return self.first.block is self.last.block and all(s.block is self.first.block for s in self.middles)


def without_layers(kb: KindBlocks) -> KindBlocks:
    """`kb` without its blocks' layer records (their sums, which every formula reads, stay):
    what a stage's terms need, lighter to spread over many mappings and to mix."""
    def plain(blk: BlockTerms) -> BlockTerms:
        return replace(blk, forward=replace(blk.forward, layers=())) if blk.forward.layers else blk

    terms = tuple(plain(blk) for blk in kb.terms)
    return KindBlocks(terms, terms[0] if kb.mean is kb.terms[0] else plain(kb.mean),
                      None if kb.mtp is None else plain(kb.mtp))


def _weights(counts: tuple, xp):
    """Each kind's share of a stage's blocks, cumulative as mix_terms takes them: count/counted."""
    counted, shares = counts[0], []
    for count in counts[1:]:
        counted = counted + count
        shares.append(count / xp.maximum(counted, 1.0))      # (no block yet: its count is 0 too)
    return shares


def stage_block(c: Context, m, xp, kb: KindBlocks, counts: tuple, blocks, rank=0.0) -> StageBlock:
    """The StageBlock of a stage holding `counts` blocks of each kind (`blocks` in all)."""
    shares = [kind_param_shares(c, m, kind) for kind, _ in c.model.block_kinds]
    if len(kb.terms) == 1:
        return StageBlock(blocks, kb.terms[0], shares[0][0], shares[0][1], rank)
    kinds = [StageMean.of(blk) for blk in kb.terms]
    mean, dense, experts = kinds[0], shares[0][0], shares[0][1]
    for share, kind_block, (kind_dense, kind_experts) in zip(_weights(counts, xp), kinds[1:], shares[1:]):
        mean = mix_terms(mean, kind_block, share)
        dense, experts = (1 - share) * dense + share * kind_dense, (1 - share) * experts + share * kind_experts
    workspace = 0.0
    for count, kind_block in zip(counts, kinds):
        workspace = xp.maximum(workspace, xp.where(count > 0, kind_block.activations.workspace, 0.0))
    mean = replace(mean, activations=replace(mean.activations, workspace=workspace))
    return StageBlock(blocks, mean, dense, experts, rank)


def stage_blocks_terms(c: Context, m, xp, kb: KindBlocks, stages) -> StageBlocks:
    """The StageBlocks of a layout: the first and the last stage of `stages`' blocks
    (costmodel.terms.pipeline_time.Stages) and every distinct middle one (of one kind, the
    middle stage of `stages`)."""
    if len(kb.terms) == 1:
        one = (None,)
        return StageBlocks(stage_block(c, m, xp, kb, one, stages.first), stage_block(c, m, xp, kb, one, stages.last),
                           (stage_block(c, m, xp, kb, one, stages.middle, 1.0),))
    sk = stage_kinds(c, m, xp)
    first = stage_block(c, m, xp, kb, sk.first, stages.first)
    last = stage_block(c, m, xp, kb, sk.last, stages.last)
    return StageBlocks(first, last, tuple(stage_block(c, m, xp, kb, counts, stage_blocks_of(counts), rank)
                                          for counts, rank in sk.middles))


def pick(xp, condition, when_true, when_false):
    """`when_true` where `condition` holds, else `when_false`, field by field (nested results
    too; the layer records of blocks of unlike kinds are not picked: none is kept)."""
    if when_true is when_false:
        return when_true
    if is_dataclass(when_true):
        return type(when_true)(**{f.name: pick(xp, condition, getattr(when_true, f.name), getattr(when_false, f.name))
                                  for f in fields(when_true)})
    if isinstance(when_true, str):
        return when_true
    if isinstance(when_true, tuple):
        if any(isinstance(x, str) for x in when_true):
            return when_true
        if len(when_true) != len(when_false):
            return ()
        return tuple(pick(xp, condition, a, b) for a, b in zip(when_true, when_false))
    return xp.where(condition, when_true, when_false)
