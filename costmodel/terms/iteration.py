"""One training iteration: the block costs assembled into pipeline (costmodel.terms.pipeline_time),
data-parallel and optimizer time (costmodel.terms.data_parallel), and the memory a GPU of the
first, the second and the last pipeline stage holds (costmodel.terms.stage_memory).

Written once against the backend interface of costmodel.ops, so `m` may hold scalars (one
mapping) or numpy arrays (many). Every returned name is a term a person can trace.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from costmodel.terms.block_offload import moe_block_param_shares
from costmodel.terms.block_terms import BlockTerms, KindBlocks, block_terms, kind_block_terms, kind_terms
from costmodel.terms.context import Context
from costmodel.terms.data_parallel import ADAM_FLOPS_PER_PARAM, Sharding, gradient_sync, optimizer_step_s, stage_params
from costmodel.terms.layer_time import RMSNORM_FLOPS_PER_ELEM, eltwise_s, gemm_s, matmul_s
from costmodel.terms.memory_features import recompute_share
from costmodel.terms.pipeline import blocks_in_flight, blocks_in_flight_last_stage, bubble_microbatches
from costmodel.terms.pipeline_time import Stages, pipeline_time
from costmodel.terms.stage_costs import stage_blocks_terms, without_layers
from costmodel.terms.stage_memory import stage_memory
from costmodel.terms.stage_state import RESIDENT_BLOCKS
from costmodel.terms.step_terms import HEAD_KERNELS_FORWARD

# blocks_in_flight*, bubble_microbatches (costmodel.terms.pipeline), ADAM_FLOPS_PER_PARAM
# (costmodel.terms.data_parallel) and RESIDENT_BLOCKS (costmodel.terms.stage_state) are read from here too.
__all__ = ["ADAM_FLOPS_PER_PARAM", "MEMORY_TERMS", "MemoryTerms", "RESIDENT_BLOCKS", "TIME_TERMS", "TimeTerms", "BlockTerms", "IterationTerms",
           "block_terms", "blocks_in_flight", "blocks_in_flight_last_stage", "bubble_microbatches", "iteration_terms",
           "output_layer_s"]

# Softmax + cross-entropy over the logits: ~6 FLOP per logit, as the attention softmax.
CROSS_ENTROPY_FLOPS_PER_ELEM = 6.0

@dataclass(frozen=True)
class TimeTerms:
    """One iteration's time, term by term (s): they add up to the iteration's time; those of the
    pipeline (forward to offload) on the slowest stage (docs/cost-model.md gives each formula)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    """MoE token dispatch and combine all-to-alls (0 for a dense model)"""
    pp_comm_s: float
    bubble_s: float
    dp_comm_s: float
    optimizer_s: float
    offload_s: float

    @classmethod
    def of(cls, terms: "IterationTerms") -> "TimeTerms":
        return cls(**{name: getattr(terms, name) for name in TIME_TERMS})

    def as_dict(self) -> dict[str, float]:
        """By name, for output (JSON, tables)."""
        return {name: getattr(self, name) for name in TIME_TERMS}


@dataclass(frozen=True)
class MemoryTerms:
    """One GPU's memory, term by term (bytes): of the first pipeline stage unless named for the
    second or the last (docs/cost-model.md gives each formula)."""

    weights_bytes: float
    weight_grads_bytes: float
    optimizer_bytes: float
    sharding_buffer_bytes: float
    embedding_bytes: float
    activations_bytes: float
    activation_workspace_bytes: float
    output_layer_bytes: float
    logits_bytes: float
    last_stage_activations_bytes: float
    second_stage_activations_bytes: float
    runtime_reserve_bytes: float
    allocator_bytes: float
    first_stage_hbm_bytes: float
    second_stage_hbm_bytes: float
    last_stage_hbm_bytes: float

    @classmethod
    def of(cls, terms: "IterationTerms") -> "MemoryTerms":
        return cls(**{name: getattr(terms, name) for name in MEMORY_TERMS})

    def as_dict(self) -> dict[str, float]:
        """By name, for output (JSON, tables)."""
        return {name: getattr(self, name) for name in MEMORY_TERMS}


TIME_TERMS = tuple(f.name for f in fields(TimeTerms))
MEMORY_TERMS = tuple(f.name for f in fields(MemoryTerms))


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
    allocator_bytes: object
    """the caching allocator's fragmentation (a whole-step term; 0 without one)"""
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
    dp_per_microbatch_s: object = 0.0
    """the DP reduction's part that repeats every microbatch, unoverlapped (GradientSync); the
    search's block floors read it, no output does"""

    def named(self, names: tuple[str, ...]) -> dict:
        """The terms called `names`, by name, for output."""
        return {name: getattr(self, name) for name in names}


def output_layer_s(c: Context, m, xp):
    """Forward time of the logits GEMM and cross-entropy on the last stage, one microbatch
    (this GPU's b·s/cp tokens)."""
    tokens = m.microbatch * c.model.seq / m.cp
    vocab_cols = c.model.vocab / m.tp
    num_bytes = c.precision.elem_bytes * (tokens * c.model.hidden + c.model.hidden * vocab_cols + tokens * vocab_cols)
    # A BF16 GEMM under every precision recipe: Megatron-LM's output layer is its own
    # tensor_parallel.ColumnParallelLinear, not a Transformer Engine module (core/models/gpt/gpt_model.py).
    return (gemm_s(c, xp, tokens, vocab_cols, c.model.hidden, num_bytes, high_precision=True)
            + eltwise_s(c, xp, tokens * vocab_cols, CROSS_ENTROPY_FLOPS_PER_ELEM, 2 * c.precision.elem_bytes)
            + HEAD_KERNELS_FORWARD * c.step.outer_gap_extra_s)       # outside per-layer CUDA graphs


@dataclass(frozen=True)
class MtpTerms:
    """The multi-token prediction modules on the last stage, one microbatch, one GPU."""

    fwd_s: object
    """each module's block, its norms and 2h → h projection, its logits and loss, forward"""
    bwd_s: object
    """their backward (the block's own, with its recomputation), twice the rest's forward"""
    dense_params: object
    """the modules' parameters on this GPU outside their experts (tp splits them)"""
    expert_params: object
    """their experts' (tp and ep split them)"""
    stored_bytes: object
    """one microbatch's stored activations of the modules' blocks"""


def mtp_terms(c: Context, m, xp, blk: BlockTerms | None = None) -> MtpTerms:
    """DeepSeek-V3's multi-token prediction (arXiv:2412.19437 §2.2; Megatron-LM's
    MultiTokenPredictionLayer) after the last block: per module, RMSNorms of the hidden state
    and of the next token's embedding, their concatenation projected 2h → h (split tp ways),
    one block of the last block's kind, the final norm and the shared output layer with its
    cross-entropy (output_layer_s again). Its backward follows its forward at once on the last
    stage, so one microbatch's activations are held. `blk`: the module's block when the caller
    has it (KindBlocks.mtp)."""
    n = c.model.mtp_blocks
    blk = kind_terms(c, m, xp, c.model.mtp_kind) if blk is None else blk
    tokens = m.microbatch * c.model.seq / m.cp
    ln_tokens = xp.where(m.seq_par, tokens / m.tp, tokens)
    projection = matmul_s(c, xp, tokens, c.model.hidden / m.tp, 2 * c.model.hidden)
    norms = 3 * eltwise_s(c, xp, ln_tokens * c.model.hidden, RMSNORM_FLOPS_PER_ELEM, 2 * c.precision.elem_bytes)
    rest = projection + norms + output_layer_s(c, m, xp)
    dense, experts = (moe_block_param_shares(c, m) if c.model.mtp_block_is_moe else (c.model.block_params / m.tp, 0.0))
    return MtpTerms(fwd_s=n * (blk.block_fwd_s + rest), bwd_s=n * (blk.block_bwd_s + blk.recompute_s + 2 * rest),
                    dense_params=n * (dense + c.model.mtp_extra_params / m.tp), expert_params=n * experts,
                    stored_bytes=n * blk.activations.stored)


def unpaired_ep_s(c: Context, m, xp, blk: BlockTerms, pace_blocks, microbatches):
    """With moe_comm_overlap, the expert-parallel time of the passes no other microbatch's pass
    hides: Megatron-LM's combined 1F1B pairs each forward chunk with another microbatch's
    backward chunk, after (v−1)·g + 2·(p−1−rank) warm-up forward chunks plus one ("we schedule
    one extra micro-batch forward step before the 1f1b stages", megatron/core/pipeline_parallel/
    schedules.py, get_pp_rank_microbatches; g = p by default), and as many backward chunks in the
    cool-down; with p = 1 (combined_1f1b_schedule_for_no_pipelining) the first forward and the
    last backward. On the pacing stage (the last: rank p − 1) that is (v−1)·p + 1 chunks each
    way, at most every chunk, each of pace_blocks/v blocks: their dispatch and combine run
    exposed (BlockTerms.ep_unpaired_s; the fill itself is the pipeline's bubble). 0 without
    overlap."""
    if not c.settings.moe_comm_overlap or not c.model.moe_blocks:
        return 0.0
    v = m.interleaving
    chunks = xp.minimum((v - 1) * m.pp + 1, microbatches * v)
    return chunks * pace_blocks / v * blk.ep_unpaired_s


def _stage_parts(c: Context, m, xp, kinds: KindBlocks | None) -> tuple:
    """(stages, block kinds, the stages' blocks, the MTP terms or None, the sharding, the stages'
    parameters): what iteration_terms and stage_memory_terms both read."""
    stages = Stages.of(c, m, xp)
    if kinds is None:
        kinds = without_layers(kind_block_terms(c, m, xp, with_mtp=True))   # one block of each kind, one microbatch
    sb = stage_blocks_terms(c, m, xp, kinds, stages)
    mtp = mtp_terms(c, m, xp, kinds.mtp) if c.model.mtp_blocks else None
    return stages, kinds, sb, mtp, Sharding.of(m, xp), stage_params(c, m, xp, stages, sb, mtp)


def stage_memory_terms(c: Context, m, xp, kinds: KindBlocks | None = None):
    """The memory side of iteration_terms alone (costmodel.terms.stage_memory.stage_memory), the
    same sums on the same parts: what a capacity check reads, without the pipeline, the
    gradient reduction and the optimizer step's times."""
    stages, _, sb, mtp, sharding, params = _stage_parts(c, m, xp, kinds)
    return stage_memory(c, m, xp, sb, stages, sharding, params, mtp)


@dataclass(frozen=True)
class _TimeSide:
    """The parts iteration_terms reads (_stage_parts) and the time they give (iteration_s)."""

    stages: Stages
    kinds: KindBlocks
    sb: object                  # the stages' blocks (costmodel.terms.stage_costs.StageBlocks)
    mtp: MtpTerms | None
    sharding: Sharding
    params: object              # the stages' parameters (costmodel.terms.data_parallel.stage_params)
    pipe: object                # costmodel.terms.pipeline_time.pipeline_time
    dp: object                  # costmodel.terms.data_parallel.gradient_sync
    optimizer_s: object
    ep_unpaired_s: object
    iteration_s: object


def _time_side(c: Context, m, xp, kinds: KindBlocks | None) -> _TimeSide:
    stages, kinds, sb, mtp, sharding, params = _stage_parts(c, m, xp, kinds)
    head_fwd = output_layer_s(c, m, xp)
    if mtp is None:
        pipe = pipeline_time(c, m, xp, sb, stages, head_fwd)
    else:
        pipe = pipeline_time(c, m, xp, sb, stages, head_fwd + mtp.fwd_s, 2 * head_fwd + mtp.bwd_s)
    dp = gradient_sync(c, m, xp, stages, sharding, params)
    # the optimizer step, and a precision recipe's once-a-step quantization of the weights
    optimizer_s = optimizer_step_s(c, m, xp, sharding, params) + params.blocks * params.block.forward.weight_quantize_s
    ep_unpaired_s = unpaired_ep_s(c, m, xp, pipe.pace.block, pipe.pace.blocks, stages.microbatches)
    return _TimeSide(stages, kinds, sb, mtp, sharding, params, pipe, dp, optimizer_s, ep_unpaired_s,
                     pipe.pipeline_s + ep_unpaired_s + dp.exposed_s + dp.stolen_s + optimizer_s)


def iteration_time_s(c: Context, m, xp, kinds: KindBlocks | None = None):
    """iteration_terms' iteration_s alone, the same sums on the same parts, without the memory
    terms: what a search scores once the capacity checks are decided (costmodel.evaluate
    iteration_time_in_context)."""
    return _time_side(c, m, xp, kinds).iteration_s


def iteration_terms(c: Context, m, xp, kinds: KindBlocks | None = None) -> IterationTerms:
    """All named time (s), memory (bytes) and rate terms of one iteration: each stage's own
    blocks (costmodel.terms.stage_kinds, stage_costs), the pipeline at its slowest stage, the
    gradient reduction and the optimizer step, and the memory of the stages. `kinds`: each
    block kind's terms of these mappings when the caller has them (costmodel.evaluate
    computes them once per distinct block)."""
    side = _time_side(c, m, xp, kinds)
    stages, kinds, sb, mtp, pipe, dp = side.stages, side.kinds, side.sb, side.mtp, side.pipe, side.dp
    microbatches, iteration_s, ep_unpaired_s = stages.microbatches, side.iteration_s, side.ep_unpaired_s
    mem = stage_memory(c, m, xp, sb, stages, side.sharding, side.params, mtp)
    pace, pace_blocks = pipe.pace.block, pipe.pace.blocks

    fw = kinds.mean.forward             # (recomputation's FLOPs: the model's blocks, L times their mean)
    t, b = m.tp, m.microbatch
    model_flops = c.model.model_flops_per_sample * m.batch
    # (recompute_blocks: N/K of the blocks recompute in full, costmodel.terms.memory_features)
    full_share = recompute_share(c, m)
    full_flops = fw.matrix_flops if full_share is None else full_share * fw.matrix_flops
    recompute_flops = c.model.blocks * t * m.cp / b * (fw.kernel_recompute_flops + xp.where(
        m.recompute_full, full_flops, xp.where(m.recompute_attn_only, fw.selective_recompute_flops, 0.0)))
    peak = iteration_s * m.num_procs * c.compute.matrix_flops_per_s
    per_pace_block = microbatches * pace_blocks     # blocks the pacing stage runs per iteration
    first_state = mem.first_state
    return IterationTerms(
        iteration_s=iteration_s,
        forward_s=microbatches * (pace_blocks * pace.compute_fwd_s + pipe.pace_head_fwd_s),
        backward_s=microbatches * (pace_blocks * pace.compute_bwd_s + pipe.pace_head_bwd_s),
        recompute_s=per_pace_block * pace.recompute_s,
        tp_comm_s=per_pace_block * (pace.tp_fwd_s + pace.tp_bwd_s),
        cp_comm_s=per_pace_block * (pace.cp_fwd_s + pace.cp_bwd_s),
        ep_comm_s=per_pace_block * (pace.ep_fwd_s + pace.ep_bwd_s) + ep_unpaired_s,
        offload_s=per_pace_block * (pace.offload_fwd_s + pace.offload_bwd_s),
        pp_comm_s=microbatches * pipe.pp_comm_micro_s,
        bubble_s=pipe.bubble_s,
        dp_comm_s=dp.exposed_s + dp.stolen_s,
        dp_per_microbatch_s=dp.per_microbatch_s,
        optimizer_s=side.optimizer_s,
        weights_bytes=first_state.weights,
        weight_grads_bytes=first_state.grads,
        optimizer_bytes=first_state.optimizer,
        sharding_buffer_bytes=first_state.sharding_buffer,
        embedding_bytes=mem.embedding_bytes,
        activations_bytes=mem.activations_bytes,
        activation_workspace_bytes=sb.first.block.activations.workspace,
        output_layer_bytes=mem.output_layer_bytes,
        logits_bytes=mem.logits_bytes,
        last_stage_activations_bytes=mem.last_stage_activations_bytes,
        second_stage_activations_bytes=mem.second_stage_activations_bytes,
        runtime_reserve_bytes=c.memory.runtime_reserve_bytes,
        allocator_bytes=mem.allocator_bytes,
        first_stage_hbm_bytes=mem.first_stage_hbm_bytes,
        second_stage_hbm_bytes=mem.second_stage_hbm_bytes,
        last_stage_hbm_bytes=mem.last_stage_hbm_bytes,
        hbm_bytes=mem.hbm_bytes,
        weights_hbm_bytes=first_state.weights_hbm,
        optimizer_hbm_bytes=first_state.optimizer_hbm,
        activations_hbm_bytes=mem.activations_hbm_bytes,
        offload_bytes=mem.offload_bytes,
        offload_bytes_per_s_needed=kinds.mean.offload_bytes_per_s_needed,
        mfu=model_flops / peak,
        hfu=(model_flops + recompute_flops * m.batch) / peak,
        sample_rate=m.batch / iteration_s,
    )
