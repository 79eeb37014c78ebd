"""Uneven pipeline stages (costmodel.terms.pipeline): the layout rule against Megatron-LM's, the
blocks in flight against a replay of Megatron-LM's schedule, Llama 3.1 405B on 16 stages
against a hand computation of the stage formulas, scalar = array, a mapping file's explicit
layout, and one-line errors for layouts that cannot be."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from costmodel.terms.layer_time import eltwise_s
from costmodel.terms.comm import collective_s
from costmodel.terms.context import Context
from costmodel.encoding import MappingArrays
from costmodel.errors import InputError
from costmodel.evaluate import _scalar_fields, evaluate, evaluate_arrays
from costmodel.terms.iteration import (ADAM_FLOPS_PER_PARAM, MEMORY_TERMS, TIME_TERMS, IterationTerms, block_terms,
                                 output_layer_s)
from costmodel.inputs.load import load_mapping, load_model, load_system
from costmodel.inputs.mapping import Mapping
from costmodel.ops import ArrayOps, ScalarOps
from costmodel.terms.pipeline import stage_blocks_in_flight
from costmodel.space.layout import end_chunk_blocks, layout_interleavings, layout_problem, stage_blocks
from costmodel.inputs.system import Collective
from solver.cli.app import cli
from tests.strategies import mappings, models, systems

ROOT = Path(__file__).resolve().parents[1]
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml")
LLAMA_405B = load_model(ROOT / "problems/models/llama-3.1-405b/config.json", seq_size=8192)


# ---------------------------------------------------------------- Megatron-LM, transcribed
def megatron_layers_to_build(num_layers, pp, vp, pp_rank, vp_stage, account_embedding=False, account_loss=False,
                             first=None, last=None):
    """megatron/core/transformer/transformer_block.py, get_num_layers_to_build (NVIDIA/
    Megatron-LM, commit d98e8a6), its asserts as None: the blocks of chunk `vp_stage` of
    rank `pp_rank` (vp None: no interleaving)."""
    if first is not None or last is not None:
        if account_embedding or account_loss:
            return None
        layers, stages = num_layers, pp
        if first is not None:
            layers, stages = layers - first, stages - 1
        if last is not None:
            layers, stages = layers - last, stages - 1
        if stages > 0 and layers % stages:
            return None
        per_rank = layers // stages if stages > 0 else 0
        if pp_rank == 0 and first is not None:
            per_rank = first
        if pp_rank == pp - 1 and last is not None:
            per_rank = last
    else:
        layers = num_layers + account_embedding + account_loss
        if layers % pp:
            return None
        per_rank = layers // pp
    if vp is not None and pp > 1:
        if per_rank % vp:
            return None
        build = per_rank // vp
    else:
        build = per_rank
    first_chunk = vp is None or vp_stage == 0
    last_chunk = vp is None or vp_stage == vp - 1
    if account_embedding and first_chunk and pp_rank == 0:
        build -= 1
    if account_loss and last_chunk and pp_rank == pp - 1:
        build -= 1
    return build if build >= 0 else None


def megatron_layout(num_blocks, pp, v, first=None, last=None):
    """Blocks per chunk of every rank as Megatron-LM builds them: with an explicit layout as
    given (--decoder-first/last-pipeline-num-layers); else even when pp divides L, and
    otherwise with --account-for-embedding/loss-in-pipeline-split (the tool's rule)."""
    uneven = first is None and last is None and num_blocks % pp != 0
    vp = v if v > 1 else None
    ranks = [[megatron_layers_to_build(num_blocks, pp, vp, rank, chunk, uneven, uneven, first, last)
              for chunk in range(v)] for rank in range(pp)]
    return None if any(b is None for rank in ranks for b in rank) else ranks


def megatron_peak_blocks(microbatches, p, v, rank, chunk_blocks):
    """Replay Megatron-LM's schedule on one rank (megatron/core/pipeline_parallel/schedules.py:
    get_schedule_table with microbatch groups of p, get_pp_rank_microbatches' warm-up,
    forward_backward_pipelining_with_interleaving's warm-up / 1F1B / cool-down; for v = 1
    the warm-up p - rank - 1 of the schedule without interleaving) and return the most
    blocks whose activations are alive at once (a chunk's freed at its backward)."""
    table = []
    for low in range(0, microbatches, p):
        high = microbatches if low + p >= microbatches else low + p
        table += [(mb, chunk) for chunk in range(v) for mb in range(low, high)]
    total = microbatches * v
    warmup = p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * p
    warmup = min(warmup, total)
    alive, peak = 0, 0
    for k in range(total):
        alive += chunk_blocks[table[k][1]]                    # forward k
        peak = max(peak, alive)
        if k >= warmup:                                       # then backward k - warmup
            alive -= chunk_blocks[v - 1 - table[k - warmup][1]]
    return peak


# ---------------------------------------------------------------- the layout rule
@pytest.mark.parametrize("num_blocks, pp, expected", [
    (126, 16, (7, 8, 7)),        # Llama 3.1 405B: (126 + 2)/16 = 8, one fewer on the first and the last
    (126, 8, (15, 16, 15)),
    (126, 32, (3, 4, 3)),
    (126, 4, (31, 32, 31)),
    (126, 1, (126, 126, 126)),
    (126, 2, (63, 63, 63)),
    (126, 6, (21, 21, 21)),
    (30, 4, (7, 8, 7)),
    (96, 16, (6, 6, 6)),
])
def test_stage_blocks_by_the_rule(num_blocks, pp, expected):
    assert stage_blocks(ScalarOps, float(num_blocks), float(pp)) == expected
    first, middle, last = expected
    assert first + last + max(pp - 2, 0) * middle == num_blocks or pp == 1
    assert layout_problem(num_blocks, pp, 1) is None


def test_stage_blocks_on_arrays_of_pp_equal_the_scalars():
    pps = np.array([1, 2, 3, 4, 6, 7, 8, 9, 14, 16, 18, 21, 32, 42, 63, 64, 126], dtype=float)
    assert all(layout_problem(126, int(p), 1) is None for p in pps)
    arrays = stage_blocks(ArrayOps, 126.0, pps)
    for i, p in enumerate(pps):
        assert tuple(float(a[i]) for a in arrays) == stage_blocks(ScalarOps, 126.0, float(p))


@pytest.mark.parametrize("num_blocks, pp, interleaving, fragments", [
    (126, 40, 1, ["pipeline_par(40) divides neither num_blocks(126) nor num_blocks + 2 = 128",
                  "40 stages of 4 = ⌈126/40⌉ blocks are 34 too many", "leave the last stage no block"]),
    (126, 60, 1, ["60 stages of 3 = ⌈126/60⌉ blocks are 54 too many"]),
    (7, 6, 1, ["pipeline_par(6) divides neither num_blocks(7) nor num_blocks + 2 = 9"]),
    (1, 2, 1, ["pipeline_par(2) divides neither num_blocks(1), and 2 stages of 1"]),
    (61, 16, 2, ["32 chunks (pipeline_par(16)·pipeline_interleaving(2)) of 2 = ⌈61/32⌉ blocks are 3 too many",
                 "more than the last chunk holds"]),
    (61, 32, 1, ["leave the last stage no block"]),
    (126, 128, 1, ["pipeline_par(128) leaves no block for the first and the last stage", "128/128 = 1"]),
    (126, 16, 3, ["pipeline_interleaving(3) does not divide (num_blocks + 2)/pipeline_par = 128/16 = 8"]),
    (126, 6, 4, ["pipeline_interleaving(4) does not divide num_blocks/pipeline_par = 126/6 = 21"]),
    (126, 1, 2, ["pipeline_interleaving(2) needs pipeline_par > 1"]),
])
def test_layouts_the_rule_refuses(num_blocks, pp, interleaving, fragments):
    reason = layout_problem(num_blocks, pp, interleaving)
    assert reason is not None and "\n" not in reason
    for fragment in fragments:
        assert fragment in reason


def bridge_layout(num_blocks, pp, v):
    """Blocks per chunk of every rank of a Megatron-Bridge DeepSeek-V3-style layout list
    (recipes/deepseek/h100/deepseek_v3.py, set_deepseek_v3_pipeline_model_parallel_layout):
    pp·v virtual stages of ⌈L/(pp·v)⌉ decoders, the last one short by what is left over (and
    holding the loss), virtual stage i on rank i mod pp as its chunk i // pp; None when the
    last one would need fewer than no decoders."""
    virtual = pp * v
    chunk = -(-num_blocks // virtual)
    short = num_blocks - (virtual - 1) * chunk
    if short < 0:
        return None
    stages = [chunk] * (virtual - 1) + [short]
    return [[stages[k * pp + rank] for k in range(v)] for rank in range(pp)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(1, 64), st.sampled_from([1, 2, 3, 4, 8]))
@example(126, 16, 1)
@example(126, 16, 2)
@example(126, 32, 4)
@example(126, 16, 8)
@example(126, 16, 3)
@example(61, 16, 1)
@example(61, 8, 2)
@example(61, 2, 8)
@example(61, 4, 4)
@example(61, 16, 2)
def test_the_rule_is_megatrons_split_or_bridges_short_last_chunk(num_blocks, pp, v):
    """Valid by the rule exactly when Megatron-LM builds it (even, or with both
    account_for_* flags when pp does not divide L) or, where pp divides neither L nor L + 2,
    when a Megatron-Bridge layout list with a short last virtual stage lays it out, with a
    block on every stage; with the same blocks per stage, and the chunks
    `stage_blocks_in_flight` is given (`end_chunk_blocks`): full chunks, the first chunk of
    the first stage and the last of the last one short (a chunk may be empty, as Megatron-LM
    allows)."""
    if pp == 1 and v > 1:
        return
    ours = layout_problem(num_blocks, pp, v) is None
    theirs = megatron_layout(num_blocks, pp, v)
    if num_blocks % pp and (pp <= 2 or (num_blocks + 2) % pp):
        theirs = bridge_layout(num_blocks, pp, v)
    valid_theirs = theirs is not None and min(map(sum, theirs)) >= 1
    assert ours == valid_theirs
    assert ours == (v in layout_interleavings(num_blocks, pp))
    if not ours:
        return
    first, middle, last = stage_blocks(ScalarOps, float(num_blocks), float(pp), interleaving=float(v))
    assert [sum(rank) for rank in theirs] == [first] + [middle] * (pp - 2) + [last] * (pp > 1)
    full_first, full_last = end_chunk_blocks(ScalarOps, float(num_blocks), float(pp), float(v))
    assert theirs[0] == [first - (v - 1) * full_first] + [full_first] * (v - 1)
    if pp > 1:
        assert theirs[-1] == [full_last] * (v - 1) + [last - (v - 1) * full_last]


@pytest.mark.parametrize("first, last, v", [(7, 7, 1), (6, 8, 1), (6, 8, 2), (2, 12, 2), (6, None, 2), (None, 6, 2)])
def test_an_explicit_layout_is_megatrons_first_and_last_pipeline_num_layers(first, last, v):
    assert layout_problem(126, 16, v, first, last) is None
    theirs = megatron_layout(126, 16, v, first, last)
    f, m, l_ = stage_blocks(ScalarOps, 126.0, 16.0, first, last)
    assert [sum(rank) for rank in theirs] == [f] + [m] * 14 + [l_]
    assert all(len(set(rank)) == 1 for rank in theirs)        # equal chunks on every stage


# ---------------------------------------------------------------- blocks in flight
@pytest.mark.parametrize("p", [3, 4, 5, 8, 16])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_blocks_in_flight_per_stage_replay_megatrons_schedule(p, v):
    """The closed forms of costmodel.terms.pipeline against a replay of Megatron-LM's schedule, for
    the rule's uneven chunks (first and last stage one block short) and equal chunks, with as
    many microbatches as 1 .. 3p + 2 (not multiples of p included)."""
    counts = range(1, 3 * p + 3) if p <= 5 else sorted({1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1,
                                                        2 * p + p // 2, 3 * p - 1, 3 * p, 3 * p + 2})
    for chunk in (1, 2, 3):                                   # blocks of a full chunk
        middle = v * chunk
        # one block short on both ends (the embedding and the loss counted), none, and the
        # last chunk short by 2 .. all its blocks (a short last chunk)
        ends = [(middle - 1, middle - 1), (middle, middle)] + [(middle, middle - k) for k in range(2, chunk + 1)]
        for first, last in ends:
            short_first = [chunk - (middle - first)] + [chunk] * (v - 1)
            short_last = [chunk] * (v - 1) + [chunk - (middle - last)]
            for n in counts:
                got = stage_blocks_in_flight(ScalarOps, float(first), float(middle), float(last), float(p), float(v),
                                             float(n), (float(chunk), float(chunk)))
                want = (megatron_peak_blocks(n, p, v, 0, short_first), megatron_peak_blocks(n, p, v, 1, [chunk] * v),
                        megatron_peak_blocks(n, p, v, p - 1, short_last))
                assert got == want, (first, middle, last, n)
    for n in counts:                                          # the second is the fullest middle stage
        second = megatron_peak_blocks(n, p, v, 1, [1] * v)
        assert all(megatron_peak_blocks(n, p, v, r, [1] * v) <= second for r in range(2, p - 1))


# ---------------------------------------------------------------- Llama 3.1 405B on 16 stages
def _405b(pp=16, dp=1, **fields) -> Mapping:
    return Mapping(**{"num_procs": 8 * pp * dp, "tensor_par": 8, "pipeline_par": pp, "data_par": dp,
                      "batch_size": 32 * dp, "microbatch_size": 1, "tensor_par_comm_type": "rs_ag",
                      "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
                      "activation_recompute": "none", **fields})


def _by_hand(mapping: Mapping, first: int, middle: int, last: int, alive: tuple):
    """The stage formulas worked out from one block's terms: (pipeline time, optimizer time,
    first, second, last stage HBM). `alive`: blocks in flight on the three stages."""
    c = Context.build(LLAMA_405B, H100, mapping.datatype, mapping.kernels)
    view = _scalar_fields(mapping)
    blk = block_terms(c, view, ScalarOps)
    head = output_layer_s(c, view, ScalarOps)
    p, v, t = mapping.pp, mapping.pipeline_interleaving, mapping.tp
    n = mapping.num_microbatches
    per_block = blk.block_fwd_s + blk.offload_fwd_s + blk.block_bwd_s + blk.recompute_s + blk.offload_bwd_s
    stage_s = max(first * per_block, middle * per_block, last * per_block + 3 * head)
    p2p = collective_s(c, ScalarOps, Collective.p2p, p, blk.act_message_bytes / t, 1)
    micro = stage_s + 2 * v * p2p
    pipeline = (n + (p - 1) / v) * micro
    # parameters of each stage on one GPU: the blocks, the embedding, the output layer
    block_params = c.model.block_params / t
    params = max(first * block_params + c.model.embedding_params / t, middle * block_params,
                 last * block_params + c.model.output_layer_params / t)
    optimizer = eltwise_s(c, ScalarOps, params, ADAM_FLOPS_PER_PARAM, 4 + 2 * 12 + 2)
    state = 2 + 4 + 12                         # bf16 weights, fp32 gradients, fp32 master + Adam
    every = blk.activations.workspace + c.memory.runtime_reserve_bytes
    tokens = 8192 * mapping.microbatch_size
    logits = tokens * c.model.vocab / t * 6 + 2 * tokens * c.model.hidden / t
    hbm = (first * block_params * state + every + alive[0] * blk.activations.stored + c.model.embedding_params / t * state,
           middle * block_params * state + every + alive[1] * blk.activations.stored,
           last * block_params * state + every + alive[2] * blk.activations.stored
           + (c.model.output_layer_params / t + c.model.final_norm_params) * state + logits)
    return pipeline, optimizer, hbm


@pytest.mark.parametrize("v", [1, 2])
def test_llama_405b_on_16_stages_by_hand(v):
    """126 blocks as 7, 8 × 14, 7: the middle stages (8 blocks) are slowest (the output layer
    costs less than a block) and hold the most parameters; the second stage (8 blocks, 15
    microbatches in flight) needs more HBM than the first (7 blocks, 16 microbatches)."""
    mapping = _405b(pipeline_interleaving=v)
    ev = evaluate(LLAMA_405B, H100, mapping)
    n = mapping.num_microbatches
    chunks = {1: ([7], [8], [7]), 2: ([3, 4], [4, 4], [4, 3])}[v]    # Megatron-LM's chunks of 7, 8, 7
    alive = tuple(megatron_peak_blocks(n, 16, v, rank, blocks) for rank, blocks in zip((0, 1, 15), chunks))
    if v == 1:
        assert alive == (7 * 16, 8 * 15, 7)
    pipeline, optimizer, hbm = _by_hand(mapping, 7, 8, 7, alive)
    assert ev.iteration_time_s - ev.time.dp_comm_s - ev.time.optimizer_s == pytest.approx(pipeline, rel=1e-12)
    assert ev.time.optimizer_s == pytest.approx(optimizer, rel=1e-12)
    memory = ev.memory
    assert (memory.first_stage_hbm_bytes, memory.second_stage_hbm_bytes, memory.last_stage_hbm_bytes) == \
        pytest.approx(hbm, rel=1e-12)
    assert ev.hbm_bytes == memory.second_stage_hbm_bytes > memory.first_stage_hbm_bytes
    # the breakdown is the slowest stage's: 8 blocks and no output layer
    blk = block_terms(Context.build(LLAMA_405B, H100, mapping.datatype, mapping.kernels), _scalar_fields(mapping),
                      ScalarOps)
    assert ev.time.forward_s == pytest.approx(n * 8 * blk.compute_fwd_s, rel=1e-12)
    assert math.isclose(sum(ev.time.as_dict().values()), ev.iteration_time_s, rel_tol=1e-12)


def test_a_last_stage_with_a_middle_stages_blocks_sets_the_pace_and_the_parameters():
    """An explicit 6, 8 × 14, 8: the last stage's 8 blocks and the output layer are slowest and
    hold the most parameters; ZB-H1's bubble uses that stage's weight-gradient GEMMs."""
    mapping = _405b(pipeline_first_stage_blocks=6, pipeline_last_stage_blocks=8)
    ev = evaluate(LLAMA_405B, H100, mapping)
    pipeline, optimizer, hbm = _by_hand(mapping, 6, 8, 8, (6 * 16, 8 * 15, 8))
    assert ev.iteration_time_s - ev.time.dp_comm_s - ev.time.optimizer_s == pytest.approx(pipeline, rel=1e-12)
    assert ev.time.optimizer_s == pytest.approx(optimizer, rel=1e-12)
    memory = ev.memory
    assert (memory.first_stage_hbm_bytes, memory.second_stage_hbm_bytes, memory.last_stage_hbm_bytes) == \
        pytest.approx(hbm, rel=1e-12)
    c = Context.build(LLAMA_405B, H100, mapping.datatype, mapping.kernels)
    view = _scalar_fields(mapping)
    blk, head = block_terms(c, view, ScalarOps), output_layer_s(c, view, ScalarOps)
    n = mapping.num_microbatches
    assert ev.time.forward_s == pytest.approx(n * (8 * blk.compute_fwd_s + head), rel=1e-12)
    zb = evaluate(LLAMA_405B, H100, mapping.model_copy(update={"pipeline_schedule": "zb-h1"}))
    micro = pipeline / (n + 15)
    assert zb.time.bubble_s == pytest.approx(15 * (micro - 2 * 8 * blk.forward.gemm_s), rel=1e-12)


def test_the_data_parallel_reduction_moves_the_fullest_stages_gradients():
    mapping = _405b(dp=2)
    ev = evaluate(LLAMA_405B, H100, mapping)
    c = Context.build(LLAMA_405B, H100, mapping.datatype, mapping.kernels)
    middle_params = 8 * c.model.block_params / 8                    # 8 blocks beat 7 and the embedding
    assert middle_params > 7 * c.model.block_params / 8 + c.model.embedding_params / 8
    reduce = collective_s(c, ScalarOps, Collective.all_reduce, 2, middle_params * c.precision.grad_comm_bytes, 1)
    assert ev.time.dp_comm_s == pytest.approx(reduce, rel=1e-12)


# ---------------------------------------------------------------- scalar = array
UNEVEN = {30: (4, 8, 16), 46: (4, 6, 8, 12, 16, 24), 62: (4, 8, 16, 32),
          61: (2, 4, 8, 16), 37: (2, 4, 8)}          # (a short last chunk: pp divides neither L nor L + 2)


@st.composite
def uneven_problems(draw):
    num_blocks = draw(st.sampled_from(sorted(UNEVEN)))
    model = draw(models()).model_copy(update={"num_blocks": num_blocks})
    system = draw(systems())
    batch = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(mappings(model, system))
        pp = draw(st.sampled_from(UNEVEN[num_blocks] + (1, 2)))
        v = draw(st.sampled_from(layout_interleavings(num_blocks, pp)))
        batch.append(Mapping.model_validate({**base.model_dump(), "pipeline_par": pp, "pipeline_interleaving": v,
                                             "pipeline_schedule": base.pipeline_schedule,
                                             "num_procs": base.tp * base.cp * pp * base.dp}))
    kernel = {"datatype": batch[0].datatype, "fused_attention": batch[0].fused_attention,
              "grad_datatype": batch[0].grad_datatype, "cuda_graphs": batch[0].cuda_graphs,
              "fused_cross_entropy": batch[0].fused_cross_entropy, "fused_activation": batch[0].fused_activation}
    return model, system, [m.model_copy(update=kernel) for m in batch]


@settings(max_examples=80, deadline=None)
@given(uneven_problems())
def test_scalar_and_array_evaluators_agree_on_uneven_stages(problem):
    model, system, batch = problem
    scalar = [evaluate(model, system, m) for m in batch]
    arrays = evaluate_arrays(model, system, MappingArrays.from_mappings(batch), batch[0].datatype, batch[0].kernels)
    for i, ev in enumerate(scalar):
        assert ev.feasible == bool(arrays.feasible[i])
        for name in ("iteration_time_s", "mfu", "hfu", "hbm_bytes", "offload_bytes"):
            assert math.isclose(getattr(ev, name), float(getattr(arrays, name)[i]), rel_tol=1e-12, abs_tol=1e-9), name
        for name in TIME_TERMS:
            assert math.isclose(getattr(ev.time, name), float(getattr(arrays.terms, name)[i]), rel_tol=1e-12, abs_tol=1e-12)
        for name in MEMORY_TERMS:
            array_value = float(np.broadcast_to(getattr(arrays.terms, name), (len(batch),))[i])
            assert math.isclose(getattr(ev.memory, name), array_value, rel_tol=1e-12, abs_tol=1e-6), name
        assert math.isclose(sum(ev.time.as_dict().values()), ev.iteration_time_s, rel_tol=1e-9)
        stages = [getattr(ev.memory, f"{s}_stage_hbm_bytes") for s in ("first", "second", "last")]
        assert ev.hbm_bytes == max(stages)


@settings(max_examples=40, deadline=None)
@given(uneven_problems())
def test_even_mappings_score_bit_for_bit_the_same_beside_uneven_ones(problem):
    """Equal stages take shorter formulas (costmodel.terms.iteration); beside uneven mappings in one
    array they take the general ones, which must give exactly the same numbers."""
    model, system, batch = problem
    even = [m for m in batch if model.num_blocks % m.pp == 0]
    uneven = [m for m in batch if model.num_blocks % m.pp]
    assume(even and uneven)
    kernel = (batch[0].datatype, batch[0].kernels)
    alone = evaluate_arrays(model, system, MappingArrays.from_mappings(even), *kernel).terms
    mixed = evaluate_arrays(model, system, MappingArrays.from_mappings(even + uneven), *kernel).terms
    for field in dataclasses.fields(IterationTerms):
        got = np.broadcast_to(getattr(mixed, field.name), (len(batch),))[:len(even)]
        assert np.array_equal(got, np.broadcast_to(getattr(alone, field.name), (len(even),))), field.name


# ---------------------------------------------------------------- the mapping file's layout
def test_an_explicit_layout_equal_to_the_rule_evaluates_the_same():
    derived = evaluate(LLAMA_405B, H100, _405b(pipeline_interleaving=2))
    stated = evaluate(LLAMA_405B, H100, _405b(pipeline_interleaving=1, pipeline_first_stage_blocks=7,
                                              pipeline_last_stage_blocks=7))
    plain = evaluate(LLAMA_405B, H100, _405b())
    assert (stated.iteration_time_s, stated.hbm_bytes, stated.memory) == \
        (plain.iteration_time_s, plain.hbm_bytes, plain.memory)
    assert derived.iteration_time_s != plain.iteration_time_s
    # an even layout stated explicitly is the default even layout
    even = _405b(pp=14, pipeline_interleaving=3)
    assert evaluate(LLAMA_405B, H100, even).to_dict() == \
        {**evaluate(LLAMA_405B, H100, even.model_copy(update={"pipeline_first_stage_blocks": 9})).to_dict(),
         "mapping": even.with_model_defaults(False).model_dump(mode="json")}   # etp resolved: 1, dense


def test_the_layout_fields_round_trip_and_are_left_out_when_not_stated():
    stated = _405b(pipeline_first_stage_blocks=6, pipeline_last_stage_blocks=8)
    dumped = stated.model_dump(mode="json")
    assert (dumped["pipeline_first_stage_blocks"], dumped["pipeline_last_stage_blocks"]) == (6, 8)
    assert Mapping.model_validate(dumped) == stated
    assert Mapping.model_validate(json.loads(stated.model_dump_json())) == stated
    plain = _405b().model_dump(mode="json")
    assert not any("stage_blocks" in key for key in plain)
    assert Mapping.model_validate(plain).pipeline_first_stage_blocks is None


def test_even_stages_never_size_by_the_second_stage():
    ev = evaluate(LLAMA_405B, H100, _405b(pp=14))               # 9 blocks each
    memory = ev.memory
    assert memory.second_stage_hbm_bytes < memory.first_stage_hbm_bytes == ev.hbm_bytes


def test_explicit_stages_with_a_short_chunk_cost_as_the_derived_layout():
    # 126 blocks on 16 stages of 2 chunks: the rule gives 7, 8, ..., 8, 7 (a first and a last
    # chunk of 3 beside chunks of 4); stated explicitly, as a Megatron-LM layout string would
    # place them, the same stages must cost the same to the last bit.
    derived = evaluate(LLAMA_405B, H100, _405b(pipeline_interleaving=2))
    stated = evaluate(LLAMA_405B, H100, _405b(pipeline_interleaving=2, pipeline_first_stage_blocks=7,
                                              pipeline_last_stage_blocks=7))
    assert stated.iteration_time_s == derived.iteration_time_s
    assert stated.memory == derived.memory


@pytest.mark.parametrize("fields, fragments", [
    ({"pipeline_first_stage_blocks": 6, "pipeline_last_stage_blocks": 6},
     ["pipeline_first_stage_blocks(6) + pipeline_last_stage_blocks(6) = 12", "114 blocks for the other 14 stages",
      "pipeline_par(16)"]),
    ({"pipeline_first_stage_blocks": 5}, ["pipeline_first_stage_blocks(5) leaves num_blocks(126) - 5 = 121"]),
    ({"pipeline_first_stage_blocks": 100, "pipeline_last_stage_blocks": 20}, ["fewer than one each"]),
    ({"pipeline_first_stage_blocks": 3, "pipeline_last_stage_blocks": 11, "pipeline_interleaving": 2},
     ["pipeline_interleaving(2) does not divide pipeline_first_stage_blocks(3)",
      "nor is it 1 chunks of a middle stage's 4 blocks"]),
    ({"pipeline_first_stage_blocks": 6, "pipeline_interleaving": 3},
     ["pipeline_interleaving(3) does not divide the 8 blocks of each stage"]),
    ({"pipeline_par": 40, "num_procs": 320}, ["pipeline_par(40) divides neither num_blocks(126) nor"]),
    ({"pipeline_par": 2, "num_procs": 16, "pipeline_first_stage_blocks": 60, "pipeline_last_stage_blocks": 60},
     ["= 120 ≠ num_blocks(126): with pipeline_par(2)"]),
    ({"pipeline_par": 1, "num_procs": 8, "pipeline_first_stage_blocks": 120},
     ["pipeline_first_stage_blocks(120) ≠ num_blocks(126): with pipeline_par(1)"]),
])
def test_a_layout_that_cannot_be_is_a_one_line_error(fields, fragments):
    with pytest.raises(InputError) as excinfo:
        evaluate(LLAMA_405B, H100, _405b(**fields))
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_file_stating_no_blocks_on_a_stage_is_refused_naming_the_field(write_file, mapping_data):
    path = write_file("mapping.json", {**mapping_data, "pipeline_first_stage_blocks": 0})
    with pytest.raises(InputError) as excinfo:
        load_mapping(path)
    assert "\n" not in str(excinfo.value) and "pipeline_first_stage_blocks" in str(excinfo.value)


def test_mapsat_eval_reads_a_layout_from_a_mapping_file(write_file):
    mapping = _405b(pipeline_first_stage_blocks=6, pipeline_last_stage_blocks=8).model_dump(mode="json")
    path = write_file("mapping.json", mapping)
    run = CliRunner().invoke(cli, ["eval", "--model", str(ROOT / "problems/models/llama-3.1-405b/config.json"),
                                   "--seq-size", "8192", "--system", str(ROOT / "problems/systems/h100-80g-nvl8.yaml"),
                                   "--mapping", str(path), "--json"])
    doc = json.loads(run.stdout)
    assert run.exit_code == (0 if doc["feasible"] else 1), run.output   # a mapping that does not fit exits 1
    assert doc["mapping"]["pipeline_first_stage_blocks"] == 6 and doc["mapping"]["pipeline_last_stage_blocks"] == 8
    assert doc["memory"]["hbm_bytes"] == max(doc["memory"][f"{s}_stage_hbm_bytes"] for s in ("first", "second", "last"))
