"""How a pipeline lays a model's blocks over its stages, and which layouts and memory features
a model allows: the rules a mapping is checked against (costmodel.terms.pipeline_time times the
stages; docs/cost-model.md, "Pipeline").
"""

from __future__ import annotations

from functools import lru_cache

from costmodel.ops import ScalarOps


# The embedding and the loss each take a block's place on the first and the last stage
# (Megatron-LM's account_for_embedding/loss_in_pipeline_split).
EMBEDDING_AND_LOSS_BLOCKS = 2


FIRST_FIELD = "pipeline_first_stage_blocks"


LAST_FIELD = "pipeline_last_stage_blocks"


def _derived_stage_blocks(xp, num_blocks, pp, v):
    even = num_blocks / pp
    # pp divides L: L/pp is whole (exactly so in floating point for L <= 2^20, pp <= 2^24)
    is_even = xp.floor(even) == even
    if xp.all(is_even):
        return even, even, even
    padded = (num_blocks + EMBEDDING_AND_LOSS_BLOCKS) / pp
    embedding_and_loss = (pp > 2) & (xp.floor(padded) == padded)
    full = v * chunk_blocks(xp, num_blocks, pp, v)
    first = xp.where(is_even, even, xp.where(embedding_and_loss, padded - 1.0, full))
    middle = xp.where(is_even, even, xp.where(embedding_and_loss, padded, full))
    last = xp.where(is_even, even, xp.where(embedding_and_loss, padded - 1.0, num_blocks - (pp - 1) * full))
    return first, xp.where(pp > 2, middle, xp.minimum(first, last)), last


def chunk_blocks(xp, num_blocks, pp, v):
    """c = ⌈L/(pp·v)⌉: the blocks of a full chunk by the layout rule (L/(pp·v) when even,
    m/v with the embedding and the loss counted, the short-last-chunk rule's c)."""
    virtual = pp * v
    return xp.floor((num_blocks + virtual - 1) / virtual)


def end_chunk_blocks(xp, num_blocks, pp, v, stated=None):
    """(first, last): the blocks of a full chunk on the first and on the last stage (whose
    first, respectively last, chunk is the short one). By the rule c = ⌈L/(pp·v)⌉ on both; for
    a mapping file's layout, `stated` = its (first, middle, last) stage blocks: a stage's
    blocks/v when v divides them (equal chunks), else a middle stage's chunk, middle/v."""
    if stated is None:
        chunk = chunk_blocks(xp, num_blocks, pp, v)
        return chunk, chunk
    first, middle, last = stated
    return tuple(blocks / v if xp.floor(blocks / v) == blocks / v else middle / v for blocks in (first, last))


@lru_cache(maxsize=4096)
def layout_interleavings(num_blocks: int, pp: int) -> tuple[int, ...]:
    """The interleavings with which the layout rule lays L blocks out on pp stages (none: pp
    is not valid), ascending: divisors of the stage's share when pp divides L or L + 2, else
    those the short-last-chunk rule accepts (a chunk holds a block: pp·v ≤ L + 1)."""
    if pp == 1:
        return (1,)
    if num_blocks % pp == 0 or (pp > 2 and (num_blocks + EMBEDDING_AND_LOSS_BLOCKS) % pp == 0):
        candidates = range(1, (num_blocks + EMBEDDING_AND_LOSS_BLOCKS) // pp + 1)
    else:
        candidates = range(1, (num_blocks + 1) // pp + 1)
    return tuple(v for v in candidates if _derived_layout_problem(num_blocks, pp, v) is None)


def stage_blocks(xp, num_blocks, pp, first=None, last=None, interleaving=1):
    """(first, middle, last): the blocks a first, a middle and a last stage hold.

    With `first` and `last` None, the layout rule above for pp stages of `interleaving`
    chunks (either may be an array; they are assumed valid: `layout_problem` says why they are
    not). A mapping file's explicit layout (scalars) gives either or both; one left out is a
    middle stage (Megatron-LM's rule). With pp ≤ 2 there is no middle stage and `middle` is
    min(first, last): a stage the first and the last dominate in time, parameters and memory,
    so the formulas need no special case.

    Equal stages come back as one value (the same object three times), which the formulas
    recognise to skip what cannot differ between stages."""
    if first is None and last is None:
        return _derived_stage_blocks(xp, num_blocks, pp, interleaving)
    given = [b for b in (first, last) if b is not None]
    others = pp - len(given)
    if pp == 1:
        return float(num_blocks), float(num_blocks), float(num_blocks)
    middle = (num_blocks - sum(given)) / others if others > 0 else None
    first_blocks = float(first) if first is not None else middle
    last_blocks = float(last) if last is not None else middle
    if pp == 2:
        middle = min(first_blocks, last_blocks)
    return first_blocks, middle, last_blocks


def layout_problem(num_blocks: int, pp: int, interleaving: int, first: int | None = None,
                   last: int | None = None) -> str | None:
    """Why L = `num_blocks` blocks cannot be laid out on `pp` stages of `interleaving`
    chunks (with the explicit `first`/`last` stage blocks of a mapping file, when given),
    in one line naming the fields and values; None when they can."""
    v = interleaving
    if pp == 1 and v != 1:
        return f"pipeline_interleaving({v}) needs pipeline_par > 1"
    if first is None and last is None:
        return _derived_layout_problem(num_blocks, pp, v)
    named = [(FIRST_FIELD, first), (LAST_FIELD, last)]
    given = [(name, blocks) for name, blocks in named if blocks is not None]
    for name, blocks in given:
        if blocks < 1:
            return f"{name}({blocks}): a stage holds at least one block"
    if pp == 1:
        for name, blocks in given:
            if blocks != num_blocks:
                return (f"{name}({blocks}) ≠ num_blocks({num_blocks}): with pipeline_par(1) the one stage holds "
                        f"every block")
        return None
    stated = " + ".join(f"{name}({blocks})" for name, blocks in given)
    taken = sum(blocks for _, blocks in given)
    if len(given) > 1:
        stated += f" = {taken}"
    rest, others = num_blocks - taken, pp - len(given)
    if others == 0 and rest != 0:
        return f"{stated} ≠ num_blocks({num_blocks}): with pipeline_par(2) the two stages hold every block"
    share = (f"{stated} leave{'s' if len(given) == 1 else ''} num_blocks({num_blocks}) - {taken} = {rest} blocks for "
             f"the other {others} stages of pipeline_par({pp})")
    if others > 0 and rest < others:
        return f"{share}: fewer than one each"
    if others > 0 and rest % others:
        return f"{share}: not the same whole number each ({rest}/{others})"
    if v > 1:
        if others > 0 and (rest // others) % v:
            return f"pipeline_interleaving({v}) does not divide the {rest // others} blocks of each stage: {share}"
        chunk = rest // others // v if others > 0 else None
        for name, blocks in given:
            problem = _stage_chunks_problem(name, blocks, v, chunk)
            if problem is not None:
                return problem
    return None


def _stage_chunks_problem(name: str, blocks: int, v: int, chunk: int | None) -> str | None:
    """Why an explicit first (last) stage of `blocks` cannot be split into v chunks: v equal
    chunks, or — as a Megatron-LM pipeline_model_parallel_layout places the embedding in the
    first chunk and the MTP modules and the loss in the last — v - 1 chunks of a middle
    stage's `chunk` blocks and one shorter chunk (the first stage's first, the last stage's
    last; `chunk` None: no middle stage, only equal chunks)."""
    if blocks % v == 0:
        return None
    short = blocks - (v - 1) * chunk if chunk is not None else 0
    if chunk is not None and 0 <= short < chunk:
        return None
    full = f"{v - 1} chunks of a middle stage's {chunk} blocks and a shorter one" if chunk else "nothing else"
    return (f"pipeline_interleaving({v}) does not divide {name}({blocks}), nor is it {full}: a stage's blocks "
            f"split into {v} chunks (Megatron-LM's num_layers_in_first/last_pipeline_stage, or a layout whose "
            f"first chunk holds the embedding and last the loss)")


def _derived_layout_problem(num_blocks: int, pp: int, v: int) -> str | None:
    if num_blocks % pp == 0:
        per_stage = num_blocks // pp
        if per_stage % v:
            return (f"pipeline_interleaving({v}) does not divide num_blocks/pipeline_par = "
                    f"{num_blocks}/{pp} = {per_stage}")
        return None
    padded = num_blocks + EMBEDDING_AND_LOSS_BLOCKS
    if pp <= 2 or padded % pp:
        return _short_last_chunk_problem(num_blocks, pp, v)
    middle = padded // pp
    if middle < 2:
        return (f"pipeline_par({pp}) leaves no block for the first and the last stage: (num_blocks + 2)/pipeline_par "
                f"= {padded}/{pp} = {middle}, less the embedding and the loss")
    if middle % v:
        return (f"pipeline_interleaving({v}) does not divide (num_blocks + 2)/pipeline_par = {padded}/{pp} = "
                f"{middle}: uneven stages split into chunks of (num_blocks + 2)/(pipeline_par·pipeline_interleaving) "
                f"blocks, one fewer on the first and the last")
    return None


def _short_last_chunk_problem(num_blocks: int, pp: int, v: int) -> str | None:
    """Why the short-last-chunk rule cannot lay L blocks out on pp stages of v chunks: pp·v
    chunks of c = ⌈L/(pp·v)⌉ blocks exceed L by more than the last chunk holds (with v = 1,
    by as much: the last stage would hold no block)."""
    virtual = pp * v
    chunk = -(-num_blocks // virtual)
    deficit = virtual * chunk - num_blocks
    if deficit < chunk or (v > 1 and deficit == chunk):
        return None
    neither = f"divides neither num_blocks({num_blocks})"
    neither += f" nor num_blocks + 2 = {num_blocks + 2}" if pp > 2 else ""
    chunks = (f"{pp} stages of {chunk} = ⌈{num_blocks}/{pp}⌉ blocks" if v == 1 else
              f"{virtual} chunks (pipeline_par({pp})·pipeline_interleaving({v})) of {chunk} = "
              f"⌈{num_blocks}/{virtual}⌉ blocks")
    short = "leave the last stage no block" if v == 1 else "are more than the last chunk holds"
    return (f"pipeline_par({pp}) {neither}, and {chunks} are {deficit} too many: they {short} (a short last "
            f"chunk, Megatron-Bridge's DeepSeek-V3 layouts)")


def feature_problem(num_blocks: int, num_experts: int, mapping, latent: bool = False) -> str | None:
    """Why a mapping's memory features cannot apply to a model of `num_blocks` blocks laid
    out by the mapping (one line naming the field and both numbers); None when they can."""
    first, middle, last = stage_blocks(ScalarOps, num_blocks, mapping.pp, mapping.pipeline_first_stage_blocks,
                                       mapping.pipeline_last_stage_blocks, mapping.pipeline_interleaving)
    fewest = int(min(first, middle, last))
    n = mapping.activation_offload_blocks
    if n is not None and n > fewest:
        return (f"activation_offload_blocks({n}) > the {fewest} blocks of a pipeline stage (num_blocks {num_blocks}, "
                f"pipeline_par {mapping.pp})")
    chunk = fewest // mapping.pipeline_interleaving
    n = mapping.recompute_blocks
    if n is not None and n > chunk:
        return (f"recompute_blocks({n}) > the {chunk} blocks of a pipeline chunk (num_blocks {num_blocks}, "
                f"pipeline_par {mapping.pp}, pipeline_interleaving {mapping.pipeline_interleaving})")
    if mapping.recompute_modules is not None and "moe_act" in mapping.recompute_modules and not num_experts:
        return "recompute_modules: moe_act needs a mixture-of-experts model (num_experts > 0)"
    if mapping.recompute_modules is not None and "mla_up_proj" in mapping.recompute_modules and not latent:
        return "recompute_modules: mla_up_proj needs a model with latent attention (latent_attention)"
    return None
