"""The constants of one problem (model × system × datatype × kernels), built once for the formulas
in parts, one per input (costmodel.terms.context_parts)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodel.errors import InputError
from costmodel.terms.context_parts import (ComputeRates, KernelSettings, MemoryTiers, ModelShape, Networks,
                                           PrecisionBytes, StepOverheads)
from costmodel.terms.kernel_time import GemmTiming
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.ops import Curve
from costmodel.inputs.precision import RecipeCosts, bf16_costs, recipe_costs, recipe_peak_name, system_recipe
from costmodel.terms.stage_kinds import block_order
from costmodel.terms.step_terms import StepGaps, attention_in_step, gemm_in_step, step_gaps
from costmodel.inputs.system import Collective, Compute, Datatype, System

# Passes over a 16-bit mask or bias are negligible; masks are 1 byte per element (Megatron
# stores dropout masks as uint8), as in Korthikanti et al. 2022 §4.1.
MASK_BYTES = 1.0

# Mixed-precision training keeps an fp32 gradient accumulator (4 bytes), an fp32 master copy
# (4 bytes, unless the compute datatype is fp32 already) and Adam's two fp32 moments (8 bytes)
# per parameter: 2 + 4 + 12 = 18 bytes with 16-bit weights (Korthikanti et al. 2022, Fig. 1).
GRAD_BYTES_PER_PARAM = 4.0
GRAD_16BIT_BYTES_PER_PARAM = 2.0
"""16-bit gradients (Kernels.grad_datatype "16bit"): DeepSpeed's, the ZeRO paper's 2Ψ bytes
(Rajbhandari et al. 2020 §3.1). fp32 compute keeps fp32 gradients whatever the setting."""
ADAM_MOMENT_BYTES_PER_PARAM = 8.0
ADAM_BF16_MOMENT_BYTES_PER_PARAM = 4.0
"""Kernels.optimizer_state "bf16": both moments in bf16 (costmodel.inputs.precision.OPTIMIZER_STATES)."""
MASTER_WEIGHT_BYTES_PER_PARAM = 4.0


@dataclass(frozen=True)
class Context:
    """Everything the formulas read that does not vary between mappings of one problem, in parts
    one per input (costmodel.terms.context_parts): `model` (the model's shape), `compute` (the
    GPU's compute for the datatype), `memory` (its memory tiers), `net` (the networks),
    `precision` (the datatype and precision recipe), `step` (the whole-step terms) and
    `settings` (the kernel settings)."""

    model: ModelShape
    compute: ComputeRates
    memory: MemoryTiers
    net: Networks
    precision: PrecisionBytes
    step: StepOverheads
    settings: KernelSettings

    def bf16_blocks(self) -> "Context":
        """The same problem for the blocks a recipe keeps in BF16 (costmodel.terms.block_terms mixes
        them in by their share): the BF16 GEMMs and no quantization."""
        compute = self.compute
        return replace(self, precision=replace(self.precision, recipe=bf16_costs()),
                       compute=replace(compute, matrix_flops_per_s=compute.hp_matrix_flops_per_s,
                                       matrix_curve=compute.hp_matrix_curve, gemm=compute.hp_gemm,
                                       grouped_gemm=compute.hp_grouped_gemm))

    @staticmethod
    def build(model: Model, system: System, datatype: Datatype, kernels: Kernels = Kernels()) -> "Context":
        """The constants of one problem, for costing whole iterations (evaluate, solve, explain,
        brute); `Context.of` builds them for any model."""
        return Context.of(model, system, datatype, kernels)

    @staticmethod
    def of(model: Model, system: System, datatype: Datatype, kernels: Kernels = Kernels()) -> "Context":
        """The constants of one problem, any model, part by part. The attention kind is the
        model's (`kv_heads`: 1 is multi-query, attn_heads multi-head, in between grouped-query)."""
        if model.num_experts and kernels.capacity_factor > model.num_experts / model.experts_per_token:
            raise InputError(f"capacity_factor {kernels.capacity_factor:g} exceeds num_experts / experts_per_token "
                             f"({model.num_experts}/{model.experts_per_token}): the busiest expert cannot receive "
                             f"more than every token")
        step = system.step
        gaps = step_gaps(step.kernel_gap_s if step else 0.0, kernels.cuda_graphs)
        recipe = _recipe(model, system, datatype, kernels) if kernels.precision is not None else None
        return Context(
            model=_model_shape(model), compute=_compute_rates(system, datatype, gaps, recipe),
            memory=_memory_tiers(system, gaps), net=_networks(system),
            precision=_precision_bytes(datatype, kernels, recipe),
            step=StepOverheads(kernel_gap_s=gaps.block_s, outer_gap_extra_s=gaps.outer_extra_s,
                               allocator_fraction=step.allocator_fragmentation if step else 0.0),
            settings=_kernel_settings(kernels),
        )


def _model_shape(model: Model) -> ModelShape:
    """The model's part (Context.model)."""
    return ModelShape(
        hidden=model.hidden, feedforward=model.feedforward, seq=model.seq_size, heads=model.attn_heads,
        kv_heads=model.kv_groups, head_size=model.attn_size, blocks=model.num_blocks, vocab=model.vocab_size,
        gated_mlp=model.gated, mlp=model.mlp, rmsnorm=model.norm == "rmsnorm", rope=model.position == "rope",
        tied_embeddings=model.tied_embeddings, dropout=model.dropout,
        block_params=float(model.block_params), embedding_params=float(model.embedding_params),
        output_layer_params=float(model.vocab_size * model.hidden), final_norm_params=float(model.norm_params),
        model_flops_per_sample=model.model_flops_per_sample(), model_flops=model.model_flops(),
        **_moe_fields(model), **_attention_fields(model),
        mtp_blocks=float(model.mtp_blocks), mtp_block_is_moe=model.mtp_block_is_moe,
        mtp_extra_params=float(model.mtp_module_params - (model.moe_block_params if model.mtp_block_is_moe
                                                          else model.block_params)),
        **model.pattern_context_fields(), kind_order=block_order(model),
    )


@dataclass(frozen=True)
class _Recipe:
    """A precision recipe on this system: its costs, the compute its quantized GEMMs run on and
    their peak over that compute's."""

    costs: RecipeCosts
    gemm_compute: Compute
    peak_ratio: float
    peak_name: str
    weight_grad_efficiency: float | None = None


def _recipe(model: Model, system: System, datatype: Datatype, kernels: Kernels) -> _Recipe:
    """The problem's precision recipe (Kernels.precision), checked against the datatype and the
    model's blocks."""
    if datatype is not Datatype.bfloat16:
        raise InputError(f"precision {kernels.precision.value}: a recipe keeps its non-GEMM work in bfloat16; "
                         f"datatype {datatype.value} cannot go with it (leave --datatype out)")
    how = system_recipe(system, kernels.precision)
    gemm_compute = system.compute_for(Datatype(how.gemm))
    peak_ratio = (how.gemm_tflops or gemm_compute.matrix_tflops) / gemm_compute.matrix_tflops
    ends = kernels.bf16_first_last_blocks
    if 2 * ends > model.num_blocks:
        raise InputError(f"bf16_first_last_blocks {ends}: {ends} blocks at each end are 2·{ends} = {2 * ends} "
                         f"> num_blocks({model.num_blocks}); at most {model.num_blocks // 2}")
    share = 2 * ends / model.num_blocks
    layouts = system.precision.fp8_gemm_layouts if system.precision is not None else "tn"
    costs = recipe_costs(kernels.precision, layouts, kernels.param_gather_low_precision, share)
    if how.weight_grad_efficiency is not None and gemm_compute.gemm is None:
        raise InputError(f"precision.recipes.{kernels.precision.value}.weight_grad_efficiency: needs a fitted GEMM "
                         f"model (compute.{how.gemm}.gemm) in {system.name}'s file")
    return _Recipe(costs, gemm_compute, peak_ratio, recipe_peak_name(kernels.precision, costs.format),
                   how.weight_grad_efficiency)


def _compute_rates(system: System, datatype: Datatype, gaps: StepGaps,
                   recipe: _Recipe | None) -> ComputeRates:
    """The compute part (Context.compute): the datatype's, or a recipe's quantized GEMMs with the
    datatype's BF16 GEMMs beside them, in the whole step."""
    compute = system.compute_for(datatype)
    step = system.step
    window = step.power_window_s if step is not None else 0.0
    sustained = system.clocks is not None    # every GEMM at the sustained clock (Clocks)

    def in_step(fit, gemm_compute: Compute, ratio: float) -> GemmTiming | None:
        return gemm_in_step(_timing(fit, ratio), gaps.block_s, window, gemm_compute.matrix_flops_per_s * ratio,
                            sustained)

    gemm_compute, peak_ratio = (compute, 1.0) if recipe is None else (recipe.gemm_compute, recipe.peak_ratio)
    high_precision = {} if recipe is None else dict(
        matrix_peak_name=recipe.peak_name, hp_matrix_flops_per_s=compute.matrix_flops_per_s,
        hp_matrix_curve=_curve(compute, 1.0), hp_gemm=in_step(compute.gemm, compute, 1.0),
        hp_grouped_gemm=in_step(compute.grouped_gemm, compute, 1.0))
    gemm = in_step(gemm_compute.gemm, gemm_compute, peak_ratio)
    return ComputeRates(
        matrix_flops_per_s=gemm_compute.matrix_flops_per_s * peak_ratio,
        vector_flops_per_s=compute.vector_flops_per_s,
        matrix_curve=_curve(gemm_compute, peak_ratio),
        gemm=gemm,
        attention=attention_in_step(compute.attention.timing() if compute.attention is not None else None,
                                    gaps.block_s),
        vector_curve=Curve.of(compute.vector_efficiency),
        grouped_gemm=in_step(gemm_compute.grouped_gemm, gemm_compute, peak_ratio),
        **high_precision, **_router_rates(system), **_weight_grad_rate(recipe, gemm),
    )


def _weight_grad_rate(recipe: _Recipe | None, gemm: GemmTiming | None) -> dict:
    """A recipe's weight-gradient GEMMs where its file states their rate: the recipe's GEMM
    model in the step (`gemm`) with its efficiency scaled (RecipeCompute.weight_grad_efficiency)."""
    if recipe is None or recipe.weight_grad_efficiency is None:
        return {}
    return dict(weight_grad_gemm=replace(gemm, efficiency=gemm.efficiency * recipe.weight_grad_efficiency))


def _router_rates(system: System) -> dict:
    """A float32 router's backward GEMMs run on TF32 tensor cores (TE cublaslt_gemm.cu: pure FP32
    GEMMs take CUBLAS_COMPUTE_32F_FAST_TF32): the system's float32 compute, where it has one
    (read only when the model's router is float32)."""
    if Datatype.float32 not in system.compute:
        return {}
    compute = system.compute[Datatype.float32]
    return dict(router_tf32_flops_per_s=compute.matrix_flops_per_s,
                router_tf32_curve=_curve(compute, 1.0) or Curve.of([(0.0, 1.0)]))


def _memory_tiers(system: System, gaps: StepGaps) -> MemoryTiers:
    """The memory part (Context.memory): HBM, with a kernel's launch gap in its latency, and the
    offload tier."""
    offload = system.offload
    return MemoryTiers(
        hbm_bytes_per_s=system.hbm.bandwidth_bytes_per_s, hbm_curve=Curve.of(system.hbm.efficiency),
        hbm_latency_s=system.hbm.latency_s + gaps.block_s,
        hbm_capacity_bytes=system.usable_hbm_bytes, runtime_reserve_bytes=system.runtime_reserve_bytes,
        offload_bytes_per_s=offload.bandwidth_bytes_per_s if offload else 0.0,
        offload_curve=Curve.of(offload.efficiency if offload else [(0, 1.0)]),
        offload_capacity_bytes=offload.capacity_bytes if offload else 0.0,
    )


def _precision_bytes(datatype: Datatype, kernels: Kernels, recipe: _Recipe | None) -> PrecisionBytes:
    """The precision part (Context.precision): bytes per element, gradient and optimizer state."""
    elem = float(datatype.bytes)
    master = 0.0 if datatype is Datatype.float32 else MASTER_WEIGHT_BYTES_PER_PARAM
    moments = ADAM_MOMENT_BYTES_PER_PARAM if kernels.optimizer_state == "fp32" else ADAM_BF16_MOMENT_BYTES_PER_PARAM
    return PrecisionBytes(
        elem_bytes=elem,
        # Gradients travel in 16 bits even with fp8 compute (Transformer Engine keeps
        # wgrads in bf16); fp32 training sends fp32.
        grad_comm_bytes=max(elem, 2.0),
        grad_bytes_per_param=(GRAD_BYTES_PER_PARAM if kernels.grad_datatype == "float32" or datatype is Datatype.float32
                              else GRAD_16BIT_BYTES_PER_PARAM),
        optimizer_bytes_per_param=master + moments,
        recipe=None if recipe is None else recipe.costs,
    )


def _networks(system: System) -> Networks:
    """The networks part (Context.net), indexed by network number."""
    nets = system.networks
    return Networks(
        size=tuple(float(n.size) for n in nets),
        bytes_per_s=tuple(n.bandwidth_bytes_per_s * n.efficiency for n in nets),
        latency_s=tuple(n.latency_s for n in nets),
        usage=tuple(n.processor_usage for n in nets),
        must_fill=tuple(n.must_be_filled for n in nets),
        port_per_gpu=tuple(n.port_per_gpu for n in nets),
        factor={op: tuple(n.collectives[op].bytes_factor for n in nets) for op in Collective},
        offset={op: tuple(n.collectives[op].n_offset for n in nets) for op in Collective},
    )


def _moe_fields(model: Model) -> dict:
    """A mixture-of-experts model's constants (all 0 for a dense one)."""
    return dict(
        experts=float(model.num_experts), experts_per_token=float(model.experts_per_token),
        expert_feedforward=float(model.expert_feedforward),
        shared_feedforward=float(model.shared_experts * model.shared_expert_feedforward),
        shared_expert_gate=model.shared_expert_gate, moe_blocks=float(model.moe_blocks),
        moe_block_params=float(model.moe_block_params), routed_expert_params=float(model.routed_expert_params),
        shared_expert_params=float(model.shared_expert_params), router_params=float(model.router_params),
        expert_bias=bool(model.num_experts) and model.bias, router_has_bias=model.router_bias,
        clamped_activation=model.clamped_activation, router_load_balancing=model.router_load_balancing,
        router_fp32=model.router_fp32, router_expert_bias=model.router_expert_bias,
        unfused_rope=model.yarn_rope and model.latent_attention is None,
    )


def _kernel_settings(kernels: Kernels) -> KernelSettings:
    """The settings part (Context.settings): the kernel and runtime settings the formulas read."""
    return KernelSettings(
        fused_activation=kernels.fused_activation, fused_attention=kernels.fused_attention,
        capacity_factor=float(kernels.capacity_factor),
        fused_cross_entropy=kernels.fused_cross_entropy, pp_comm_overlap=kernels.pp_comm_overlap,
        moe_flex_dispatcher=kernels.moe_dispatcher == "flex", moe_flex_backend=kernels.moe_flex_backend,
        moe_comm_overlap=kernels.moe_comm_overlap,
        moe_dispatcher_sm_share=kernels.moe_dispatcher_sm_share if kernels.moe_dispatcher == "flex" else None,
    )


def window_core_ratio(window: float, seq: float) -> float:
    """The work of a causal attention core whose queries see at most `window` keys, over a full
    causal core's: (2·s·w − w²) / s² (the s·w − w²/2 query-key pairs under the band against
    s²/2), 1 when the window spans the sequence. A sliding-window kernel (FlashAttention's
    window_size) skips the tiles outside the band."""
    if window <= 0 or window >= seq:
        return 1.0
    return (2 * seq * window - window * window) / (seq * seq)


def _attention_fields(model: Model) -> dict:
    """The attention variants' constants: latent attention's ranks and widths, and the mean
    attention-core scale over the blocks (window_blocks of them at window_core_ratio)."""
    share = model.window_blocks / model.num_blocks
    fields = {"attention_core_scale": 1 - share + share * window_core_ratio(model.sliding_window, model.seq_size)}
    mla = model.latent_attention
    if mla is not None:
        fields.update(v_head_size=float(mla.v_head_dim), q_lora_rank=float(mla.q_lora_rank),
                      kv_lora_rank=float(mla.kv_lora_rank), rope_head_size=float(mla.qk_rope_head_dim))
    return fields


def _curve(compute: Compute, peak_ratio: float) -> Curve | None:
    """The step curve of a compute entry run at `peak_ratio` × its peak: the same efficiency
    at the same time, so its sizes (FLOP) scale with the peak (as the B200 file scales the
    H100's fit)."""
    if compute.matrix_efficiency is None:
        return None
    return Curve.of([(size * peak_ratio, eff) for size, eff in compute.matrix_efficiency])


def _timing(fit, peak_ratio: float) -> GemmTiming | None:
    """A fitted GEMM model run at `peak_ratio` × its entry's peak (NVFP4 on the float8 fit):
    `power_flops` scales with the peak, so the clocks drop after the same time at full rate."""
    if fit is None:
        return None
    timing = fit.timing()
    return timing if peak_ratio == 1.0 else replace(timing, power_flops=timing.power_flops * peak_ratio)
