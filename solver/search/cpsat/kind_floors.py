"""The search's floors for a model whose blocks are of several kinds (dense and MoE blocks,
a layer pattern's Mamba-2, attention, MLP and MoE layers): each pipeline stage's time and
memory are the sums of its own blocks (costmodel.terms.stage_kinds), so a stage's blocks times
the model's mean block bounds nothing stage by stage. What stays a lower bound:

* time: the slowest stage takes at least the mean stage, (L · mean block + H)/pp (the stages'
  blocks are the model's, each once, and the output layer H is on one of them) —
  `mean_stage_micro`; the block tables' time stays the mean block's;
* one block of any stage — in a ZB-H1 bubble, its stored activations, its recompute
  workspace — at least the least of the kinds' (`least_kind_rows`).
"""

from __future__ import annotations

import functools

import numpy as np

from costmodel.space.layout import layout_interleavings, layout_problem, stage_blocks
from costmodel.ops import ScalarOps
from costmodel.terms.stage_kinds import stage_kind_counts


def mean_stage_micro(blocks, pp, mean_block, head):
    """[M, K]: one microbatch on the mean stage, (L · mean block + output layer)/pp, of
    `mean_block` [M, K] and `head` [M] (solver.search.cpsat.tables.block_lower_bounds)."""
    return (blocks * mean_block + head[:, None]) / pp


def least_kind_rows(kinds) -> dict:
    """The block tables' rows (solver.search.cpsat.block_tables) one block of any stage
    bounds, the least over the kinds (costmodel.terms.block_terms.KindBlocks): its time in a
    ZB-H1 bubble, its stored activations and its recompute workspace."""
    return {name: functools.reduce(np.minimum, [of(kind) for kind in kinds.terms])
            for name, of in (("block_zb", zero_bubble_block), ("stored", lambda k: k.activations.stored),
                             ("workspace", lambda k: k.activations.workspace))}


def zero_bubble_block(blk) -> object:
    """One block's time in a ZB-H1 bubble: forward, backward, recompute and exposed offload,
    less twice its weight-gradient GEMMs (costmodel.terms.pipeline_time)."""
    return (blk.block_fwd_s + blk.block_bwd_s + blk.recompute_s + blk.offload_fwd_s + blk.offload_bwd_s
            - 2 * blk.weight_grad_gemm_s)


def distinct_layouts(c, pp: int) -> list[int]:
    """One interleaving per distinct layout of pp stages — the (first, middle, last) blocks,
    and with blocks of several kinds each stage's kinds (the chunks move them between stages)
    —, the least giving it: [1] but with a short last chunk or several kinds (and for a pp no
    interleaving lays out)."""
    blocks, first_of = int(c.blocks), {}
    kinds = tuple(kind for kind, _ in c.block_kinds)
    for il in layout_interleavings(blocks, pp) or (1,):
        layout = stage_blocks(ScalarOps, blocks, pp, interleaving=il)
        if len(kinds) > 1 and layout_problem(blocks, pp, il) is None:
            layout = (layout, stage_kind_counts(c.block_order, kinds, pp, il).tobytes())
        first_of.setdefault(layout, il)
    return list(first_of.values())
