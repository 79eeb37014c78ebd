"""The pipeline: how the blocks are laid out on the stages, the 1F1B bubble, and how many
blocks' activations each stage keeps alive at its peak.

The layout rule (what `stage_blocks` derives from pp and the interleaving v alone: a searched
mapping's layout is never a choice of its own), for L blocks on pp stages of v chunks, the
first that applies to pp:

* pp divides L (even): every stage holds L/pp blocks, in v chunks of L/(pp·v);
* pp > 2 divides L + 2 (embedding and loss): the embedding and the loss each count as one
  block (Megatron-LM's `--account-for-embedding-in-pipeline-split` and
  `--account-for-loss-in-pipeline-split`), so the middle stages hold m = (L + 2)/pp blocks
  and the first and the last m − 1 each (Llama 3.1 405B: 126 blocks on 16 stages are 7,
  8 × 14, 7; Dubey et al. 2024 §3.3.2 "we reduce one Transformer layer each from the first
  and the last stages"); v divides m, every chunk holds m/v blocks, one fewer on the first
  chunk of the first stage and on the last chunk of the last (`get_num_layers_to_build` in
  megatron/core/transformer/transformer_block.py);
* otherwise (a short last chunk: Megatron-Bridge's DeepSeek-V3 layouts): the pp·v virtual
  stages (chunk k of stage i is virtual stage k·pp + i, Megatron-LM's
  `pipeline_model_parallel_layout`) hold c = ⌈L/(pp·v)⌉ blocks each but the last, which
  holds D = pp·v·c − L fewer, down to none (the MTP modules and the loss alone, 'mL'): the
  first stage holds the embedding and as many blocks as a middle one, the last stage the
  output layer, the MTP modules and the loss beside its fewer blocks. Valid when D ≤ c and,
  with v = 1, D < c (every stage holds a block). This is every layout of
  `set_deepseek_v3_pipeline_model_parallel_layout` (Megatron-Bridge
  recipes/deepseek/h100/deepseek_v3.py; 61 blocks: pp 16 'Et*4|(t*4|)*14tmL' = 4, 4 × 14, 1;
  pp 8 = 8, 8 × 6, 5; pp 4 = 16, 16, 16, 13; pp 4 × vp 2 and pp 8 × vp 2, pp 4 × vp 4 on
  the same virtual stages), and of Kimi-K2's pp 2 × vp 8 (recipes/kimi: the 16 virtual stages
  again, 32 and 29 blocks). It is the last-stage-only reading of those layouts: a layout that
  also shortens the first chunk (the 25.09 H100 run's pp 8 × vp 4 'Et|(tt|)*30mL') is one a
  mapping file states.

A mapping file may instead state the first and the last stage's blocks (Megatron-LM's
`--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`): the stages
between them hold equal whole numbers of blocks, and v divides every stage's blocks, or a
first (last) stage has v − 1 chunks of a middle stage's and a shorter first (last) one.

Every function but `layout_problem` and `layout_interleavings` takes the backend `xp`
(costmodel.ops), so pp, v and the microbatch count may be scalars or numpy arrays; an explicit
layout (one mapping file's) reaches `stage_blocks` as scalars.
"""

from __future__ import annotations




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


def blocks_in_flight_second_stage(xp, blocks_per_stage, p, v, microbatches):
    """Blocks alive at the peak on a GPU of the second stage (a middle one when p > 2): p - 1
    microbatches for 1F1B; interleaved, Megatron-LM's warm-up on rank 1, 2·(p - 2) + (v - 1)·p
    chunks, plus one (`get_pp_rank_microbatches` in megatron/core/pipeline_parallel/
    schedules.py); fewer if there are fewer microbatches. Later stages keep fewer still (the
    warm-up shrinks with the rank), so of the middle stages the second holds the most."""
    return xp.where(v == 1, blocks_per_stage * xp.minimum(p - 1.0, microbatches),
                    blocks_per_stage / v * xp.minimum(microbatches * v, p * v + p - 3))


def blocks_in_flight_rank(xp, blocks_per_stage, p, v, microbatches, rank):
    """Blocks alive at the peak on a GPU of pipeline rank `rank` (0 the first, p − 1 the
    last): p − rank microbatches for 1F1B; interleaved, Megatron-LM's warm-up on that rank,
    2·(p − 1 − rank) + (v − 1)·p chunks, plus one (`get_pp_rank_microbatches` in
    megatron/core/pipeline_parallel/schedules.py); fewer if there are fewer microbatches. Rank 1
    is blocks_in_flight_second_stage; a later middle rank keeps fewer of its own blocks."""
    return xp.where(v == 1, blocks_per_stage * xp.minimum(p - rank, microbatches),
                    blocks_per_stage / v * xp.minimum(microbatches * v, p * v + p - 1 - 2 * rank))


def blocks_in_flight_last_stage(xp, blocks_per_stage, p, v, microbatches):
    """Blocks whose activations are alive at the peak on a last-stage GPU: one microbatch
    for 1F1B (its backward follows its forward at once); (p·v - p + 1) chunks when
    interleaved (Megatron's warm-up of (v-1)·p chunks on the last rank, plus one); fewer if
    there are fewer microbatches. With p = 1 it equals blocks_in_flight."""
    return blocks_per_stage / v * xp.minimum(microbatches * v, p * v - p + 1)


def short_first_chunks_in_flight(xp, p, v, microbatches):
    """How many microbatches' first chunk a first-stage GPU keeps alive at its peak, in
    Megatron-LM's schedule (groups of p microbatches run through chunks 0 .. v-1 in turn):
    min(n, p) for 1F1B; interleaved, n below 2p, else max(2p - 1 - (v - 1)·r, p + r) with
    r = n mod p (2p - 1 when p divides n). When that chunk is one block short (uneven
    stages), the peak holds this many blocks fewer than with full chunks. Derived from the
    schedule and checked against a step-by-step replay of it (tests/test_uneven_stages.py)."""
    rest = microbatches - xp.floor(microbatches / p) * p
    interleaved = xp.where(microbatches < 2 * p, microbatches,
                           xp.maximum(2 * p - 1 - (v - 1) * rest, p + rest))
    return xp.where(v == 1, xp.minimum(p, microbatches), interleaved)


def short_last_chunks_in_flight(xp, p, v, microbatches):
    """How many microbatches' last chunk a last-stage GPU keeps alive at its peak:
    max(0, min(n, (v - 1)·(p - n) + 1)) — one for 1F1B; interleaved, all n when the warm-up
    holds every forward, none once n > p (at the peak every last chunk has run its backward).
    The counterpart of `short_first_chunks_in_flight`, checked the same way."""
    return xp.maximum(0.0, xp.minimum(microbatches, (v - 1) * (p - microbatches) + 1))


def stage_blocks_in_flight(xp, first, middle, last, p, v, microbatches, chunks=None):
    """(first, second, last): blocks alive at the peak on a GPU of the first, the second and
    the last stage, for stages of `first`, `middle` and `last` blocks in v chunks. `chunks`:
    (first, last) blocks of a full chunk on the first and the last stage (`end_chunk_blocks`);
    a stage whose blocks fall short of v such chunks has its first (last) chunk short by the
    difference — any number of blocks, down to an empty chunk: the short-chunk counts above
    are exact for every such shortfall (checked against the replay, tests/test_uneven_stages.py)."""
    if first is middle is last:          # equal stages (one value from stage_blocks): no short chunk
        return (blocks_in_flight(xp, first, p, v, microbatches),
                blocks_in_flight_second_stage(xp, first, p, v, microbatches),
                blocks_in_flight_last_stage(xp, first, p, v, microbatches))
    first_full, last_full = chunks[0] * v, chunks[1] * v
    first_alive = (blocks_in_flight(xp, first_full, p, v, microbatches)
                   - (first_full - first) * short_first_chunks_in_flight(xp, p, v, microbatches))
    last_alive = (blocks_in_flight_last_stage(xp, last_full, p, v, microbatches)
                  - (last_full - last) * short_last_chunks_in_flight(xp, p, v, microbatches))
    return first_alive, blocks_in_flight_second_stage(xp, middle, p, v, microbatches), last_alive
