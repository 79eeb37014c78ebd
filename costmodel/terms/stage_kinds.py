"""Which kinds of block each pipeline stage holds: the model's blocks in order
(`block_order`), cut into the layout's chunks (costmodel.space.layout), counted per stage and
kind. A stage's time and memory are then the sums of its own blocks (costmodel.terms.iteration,
pipeline_time, stage_memory), not a count times a model-wide average block.

The layout of pp stages of v chunks: virtual stage k·pp + i is chunk k of stage i (Megatron-LM's
`pipeline_model_parallel_layout`), and the blocks fill the virtual stages in order. A middle
stage's chunks hold middle/v blocks each; the first (last) stage's chunks hold a full chunk
each (costmodel.space.layout.end_chunk_blocks) but its first (last) chunk, which holds what
is left of the stage's blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from costmodel.inputs.model import Model
from costmodel.inputs.model_counts import PATTERN_KINDS
from costmodel.ops import ScalarOps, distinct_rows
from costmodel.space.layout import end_chunk_blocks, stage_blocks


def block_order(model: Model) -> tuple[str, ...]:
    """The kind (costmodel.terms.block.BLOCK_KINDS) of each block of the model, first to last:
    a layer pattern's symbols; else block i (counted from 1) is "moe" when the model has
    experts, i > first_dense_blocks and moe_every divides i (Hugging Face's
    first_k_dense_replace and moe_layer_freq), "dense" otherwise."""
    if model.layer_pattern is not None:
        return tuple(PATTERN_KINDS[symbol] for symbol in model.layer_pattern)
    return tuple("moe" if model.num_experts and i > model.first_dense_blocks and i % model.moe_every == 0
                 else "dense" for i in range(1, model.num_blocks + 1))


def chunk_sizes(num_blocks: int, pp: int, v: int, first=None, last=None) -> list[list[float]]:
    """Blocks of each chunk of each stage, `[rank][chunk]`, by the layout rule (or the
    mapping file's first and last stage blocks; stages that do not split into whole blocks —
    a mapping the layout checks refuse — keep their fractions)."""
    first_b, middle_b, last_b = stage_blocks(ScalarOps, num_blocks, pp, first, last, v)
    if pp == 1:
        return [[first_b / v] * v]
    stated = None if first is None and last is None else (first_b, middle_b, last_b)
    full_first, full_last = end_chunk_blocks(ScalarOps, num_blocks, pp, v, stated)
    sizes = []
    for rank in range(pp):
        if rank == 0:
            chunks = [full_first] * v
            chunks[0] -= full_first * v - first_b
        elif rank == pp - 1:
            chunks = [full_last] * v
            chunks[-1] -= full_last * v - last_b
        else:
            chunks = [middle_b / v] * v
        sizes.append(chunks)
    return sizes


@lru_cache(maxsize=4096)
def stage_kind_counts(order: tuple[str, ...], kinds: tuple[str, ...], pp: int, v: int, first=None,
                      last=None) -> np.ndarray:
    """[pp, K]: the blocks of each kind (`kinds`' order) each stage holds: the chunks, in
    virtual-stage order, take the blocks in turn (a fraction of a block counts its fraction)."""
    sizes = chunk_sizes(len(order), pp, v, first, last)
    upto = np.zeros((len(order) + 1, len(kinds)))      # upto[i]: each kind's blocks among the first i
    for i, kind in enumerate(order):
        upto[i + 1] = upto[i]
        upto[i + 1, kinds.index(kind)] += 1

    def before(x: float) -> np.ndarray:
        whole = min(int(np.floor(x)), len(order) - 1)
        return upto[whole] + (x - whole) * (upto[whole + 1] - upto[whole])

    counts = np.zeros((pp, len(kinds)))
    start = 0.0
    for chunk in range(v):
        for rank in range(pp):
            end = start + sizes[rank][chunk]
            counts[rank] += before(end) - before(start)
            start = end
    if abs(start - len(order)) > 1e-9 * len(order):
        raise ValueError(f"layout of pp {pp}, vp {v} holds {start} blocks, not the model's {len(order)}")
    return counts


@dataclass(frozen=True)
class StageKinds:
    """Each kind's blocks (a tuple over the model's kinds, each a scalar or an array over
    mappings) on the first stage, the last, and the distinct middle stages (`middles`: for
    each, its counts and the lowest rank holding them — in memory, later ranks of the same
    blocks keep fewer microbatches alive). With pp ≤ 2 the one middle entry is a stage the
    first and the last dominate (each kind's fewer blocks, rank 1)."""

    first: tuple
    last: tuple
    middles: tuple
    """((counts, rank), ...)"""


def _rows(c, pp: int, v: int, first, last) -> tuple:
    """(first counts, last counts, ((middle counts, rank), ...)) of one layout, scalars."""
    kinds = tuple(kind for kind, _ in c.model.block_kinds)
    counts = stage_kind_counts(c.model.block_order, kinds, pp, v, first, last)
    counts = counts.tolist()                           # (Python floats: one mapping's terms stay scalars)
    first_row, last_row = tuple(counts[0]), tuple(counts[-1])
    if pp <= 2:
        return first_row, last_row, ((tuple(map(min, counts[0], counts[-1])), 1.0),)
    middles: dict = {}
    for rank in range(1, pp - 1):
        middles.setdefault(tuple(counts[rank]), float(rank))
    return first_row, last_row, tuple(middles.items())


def stage_kinds(c, m, xp) -> StageKinds:
    """Every mapping's StageKinds (`m`: one mapping's fields, or arrays of many; one per
    distinct (pp, interleaving) layout is counted)."""
    first, last = m.first_stage_blocks, m.last_stage_blocks
    if np.ndim(m.pp) == 0:
        row = _rows(c, int(m.pp), int(m.interleaving), first, last)
        return StageKinds(row[0], row[1], row[2])
    pp, interleaving = (column.astype(np.int64) for column in np.broadcast_arrays(np.asarray(m.pp),
                                                                                  np.asarray(m.interleaving)))
    at, inverse, _ = distinct_rows([pp, interleaving])
    rows = [_rows(c, int(p), int(v), first, last) for p, v in zip(pp[at].tolist(), interleaving[at].tolist())]
    if not rows:                                       # no mapping
        empty = tuple(np.zeros(0) for _ in c.model.block_kinds)
        return StageKinds(empty, empty, ((empty, np.zeros(0)),))
    if len(rows) == 1:
        return StageKinds(*rows[0])
    slots = max(len(row[2]) for row in rows)

    def column(values) -> np.ndarray:
        return np.asarray(values, dtype=float)[inverse]

    kinds = range(len(rows[0][0]))
    first_counts = tuple(column([row[0][k] for row in rows]) for k in kinds)
    last_counts = tuple(column([row[1][k] for row in rows]) for k in kinds)
    # a layout with fewer distinct middle stages repeats its first (a repeat changes no maximum)
    middles = tuple((tuple(column([row[2][min(j, len(row[2]) - 1)][0][k] for row in rows]) for k in kinds),
                     column([row[2][min(j, len(row[2]) - 1)][1] for row in rows]))
                    for j in range(slots))
    return StageKinds(first_counts, last_counts, middles)


def stage_blocks_of(counts: tuple) -> object:
    """A stage's blocks, all kinds."""
    total = counts[0]
    for count in counts[1:]:
        total = total + count
    return total
