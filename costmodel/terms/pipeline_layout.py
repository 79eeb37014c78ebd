"""Megatron-LM's explicit pipeline layouts (`pipeline_model_parallel_layout`) read as the
blocks each pipeline stage holds.

A layout is a string of virtual stages separated by '|', each a sequence of layers: `E` the
embedding, `t` a transformer block, `m` a multi-token-prediction module, `L` the loss;
`x*n` repeats a layer and `(...)*n` a group (megatron/core/transformer/pipeline_parallel_layer_layout.py,
`PipelineParallelLayerLayout.from_str`). Megatron-Bridge's DeepSeek-V3 layouts, e.g.
'Et*4|(t*4|)*14tmL' for pp 8 × vp 2 or pp 4 × vp 4. The virtual stages go round the pipeline
ranks: virtual stage i runs on rank i mod pp as its chunk i // pp (Megatron's
`layout[vpp_rank][pp_rank]`).

Only the transformer blocks count as blocks here: the embedding, the MTP modules and the loss
are costed where the cost model places them (the first and the last stage).
"""

from __future__ import annotations

import re

import costmodel.inputs.limits as limits
from costmodel.errors import InputError

__all__ = ["layout_chunks", "layout_string", "stage_layout"]

_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_LAYER = re.compile(r"([EtmL])\*(\d+)")


MAX_EXPANDED = 4 * limits.NUM_BLOCKS.high
"""Characters a layout may expand to: a layer or a '|' each, four per block of the deepest
model mapsat accepts (blocks, stage bars, and the embedding, MTP and loss around them)."""


def _repeat(pattern: re.Pattern, text: str, layout: str) -> str:
    """`text` with each repetition of `pattern` written out, refused before it is written when
    the result would pass MAX_EXPANDED characters."""
    grown = sum(len(g.group(1)) * int(g.group(2)) - len(g.group(0)) for g in pattern.finditer(text))
    if len(text) + grown > MAX_EXPANDED:
        raise InputError(f"pipeline_layout {layout[:60]!r}: expands to {len(text) + grown:,} layers and bars, more "
                         f"than {MAX_EXPANDED:,} (4 per block of the deepest model accepted)")
    return pattern.sub(lambda g: g.group(1) * int(g.group(2)), text)


def _expand(layout: str) -> str:
    text = layout.replace(" ", "").replace(",", "|")
    while True:
        expanded = _repeat(_LAYER, _repeat(_GROUP, text, layout), layout)
        if expanded == text:
            return text
        text = expanded


def layout_chunks(layout: str, pp: int, interleaving: int) -> list[list[int]]:
    """Blocks (`t`) per chunk of each rank, `[rank][chunk]`, of a layout on pp ranks of
    `interleaving` chunks; an InputError names the layout when it does not parse or has not
    pp · interleaving virtual stages."""
    unknown = set(layout) - set("EtmL|()*0123456789 ,")
    if unknown:
        raise InputError(f"pipeline_layout {layout!r}: unknown layer(s) {''.join(sorted(unknown))} (E, t, m, L)")
    text = _expand(layout)
    stages = text.split("|")
    if text.endswith("|"):
        stages = stages[:-1]
    if set("".join(stages)) - set("EtmL"):
        raise InputError(f"pipeline_layout {layout!r}: a repetition that does not parse (x*n repeats a layer, "
                         f"(...)*n a group)")
    if len(stages) != pp * interleaving:
        raise InputError(f"pipeline_layout {layout!r}: {len(stages)} virtual stages, not pp({pp}) × "
                         f"vp({interleaving}) = {pp * interleaving}")
    return [[stages[chunk * pp + rank].count("t") for chunk in range(interleaving)] for rank in range(pp)]


def stage_layout(layout: str, pp: int, interleaving: int) -> tuple[int, int] | None:
    """(first, last) stage blocks when the layout is one the cost model expresses — middle
    stages equal, each stage's chunks equal but for a shorter first chunk on the first stage
    and a shorter last chunk on the last — else None."""
    chunks = layout_chunks(layout, pp, interleaving)
    if pp < 3:
        return None
    middle = chunks[1]
    if any(rank != middle for rank in chunks[1:-1]) or len(set(middle)) != 1:
        return None
    size = middle[0]
    first, last = chunks[0], chunks[-1]
    if first[1:] != middle[1:] or first[0] > size or last[:-1] != middle[:-1] or last[-1] > size:
        return None
    return sum(first), sum(last)


def layout_string(chunks: list[list[int]], mtp_blocks: int = 0) -> str:
    """Megatron-LM's layout string for the blocks of each rank's chunks (`[rank][chunk]`, as
    `layout_chunks` reads them): virtual stage i is chunk i // pp of rank i mod pp, the first
    holds the embedding, the last the MTP modules and the loss ('Et*4|(t*4|)*14tmL' written out)."""
    pp, v = len(chunks), len(chunks[0])
    stages = []
    for i in range(pp * v):
        blocks = chunks[i % pp][i // pp]
        text = f"t*{blocks}" if blocks > 1 else "t" * blocks
        stages.append(("E" if i == 0 else "") + text + ("m" * mtp_blocks + "L" if i == pp * v - 1 else ""))
    return "|".join(stages)
