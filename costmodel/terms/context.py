"""The constants of one problem (model × system × datatype), flattened once for the formulas."""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodel.errors import InputError
from costmodel.terms.kernel_time import AttentionTiming, GemmTiming
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model, ModelFlops
from costmodel.ops import Curve
from costmodel.inputs.precision import RecipeCosts, bf16_costs, recipe_costs, recipe_peak_name, system_recipe
from costmodel.terms.stage_kinds import block_order
from costmodel.terms.step_terms import attention_in_step, gemm_in_step, step_gaps
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
    """Everything the formulas read that does not vary between mappings of one problem."""

    # model
    hidden: float
    feedforward: float
    seq: float
    heads: float
    kv_heads: float              # g: key/value heads (= heads unless grouped-query attention)
    head_size: float
    blocks: float
    vocab: float
    gated_mlp: bool              # swiglu/geglu: the h→f GEMM is h→2f and an element-wise gate follows
    mlp: str                     # gelu | swiglu | geglu | squared_relu
    rmsnorm: bool
    rope: bool
    tied_embeddings: bool
    block_params: float
    embedding_params: float      # input side (token embedding, learned positions): first stage
    output_layer_params: float   # V·h: the output matrix (own when untied, a copy on the last stage when tied)
    final_norm_params: float
    model_flops_per_sample: float
    model_flops: ModelFlops      # the MFU numerator, term by term
    # datatype
    elem_bytes: float            # bytes per weight/activation element
    grad_comm_bytes: float       # bytes per gradient element on the DP network
    grad_bytes_per_param: float  # bytes per kept gradient (4: fp32 main gradients; 2: 16-bit)
    optimizer_bytes_per_param: float
    fused_activation: bool
    fused_attention: bool
    # compute
    matrix_flops_per_s: float
    vector_flops_per_s: float
    matrix_curve: Curve | None          # the step curve by FLOP, or None with a fitted GEMM model
    gemm: GemmTiming | None             # the fitted shape-aware GEMM model (costmodel.terms.kernel_time)
    attention: AttentionTiming | None   # the fitted fused-attention model, if the system has one
    vector_curve: Curve
    # memory tiers
    hbm_bytes_per_s: float
    hbm_curve: Curve
    hbm_latency_s: float                # fixed cost of one element-wise (HBM-bound) kernel
    hbm_capacity_bytes: float           # usable: the capacity less the HBM headroom (System.usable_hbm_bytes)
    runtime_reserve_bytes: float  # CUDA context, communication buffers, fragmentation
    offload_bytes_per_s: float   # 0 without an offload tier
    offload_curve: Curve
    offload_capacity_bytes: float
    # networks, indexed by network number
    net_size: tuple[float, ...]
    net_bytes_per_s: tuple[float, ...]   # bandwidth · efficiency
    net_latency_s: tuple[float, ...]
    net_usage: tuple[float, ...]         # share of compute stolen while overlapping
    net_must_fill: tuple[bool, ...]
    net_port_per_gpu: tuple[bool, ...]  # a port per GPU: groups cross domains on all their ports (costmodel.terms.comm)
    net_factor: dict[Collective, tuple[float, ...]]
    net_offset: dict[Collective, tuple[float, ...]]
    # mixture of experts (all 0 for a dense model; costmodel/terms/moe.py reads them)
    experts: float = 0.0               # E: routed experts per MoE block
    experts_per_token: float = 0.0     # k
    expert_feedforward: float = 0.0    # f_e: one routed expert's intermediate width
    shared_feedforward: float = 0.0    # shared_experts · f_s: the shared experts run as one MLP of this width
    shared_expert_gate: bool = False   # an h × 1 sigmoid gate on the shared experts' output (Qwen2-MoE)
    moe_blocks: float = 0.0            # blocks with experts (the others are dense)
    moe_block_params: float = 0.0      # parameters of one MoE block (costmodel.inputs.model.Model.moe_block_params)
    routed_expert_params: float = 0.0  # the E routed experts of one MoE block (what ep splits)
    shared_expert_params: float = 0.0  # one MoE block's shared experts (split tp ways)
    router_params: float = 0.0         # one MoE block's router (and shared-expert gate): replicated
    capacity_factor: float = 1.0       # the busiest expert's tokens over the mean (Kernels.capacity_factor)
    grouped_gemm: GemmTiming | None = None   # the fitted grouped-GEMM model, if the system has one
    # precision recipe (costmodel.inputs.precision): None is the datatype's costing (Calculon's). Under a
    # recipe the matrix fields above are its quantized GEMMs', elem_bytes is BF16, and the GEMMs
    # that stay BF16 (attention, output layer, router) run on these (None: as the others).
    recipe: RecipeCosts | None = None
    matrix_peak_name: str = ""
    """what `matrix_flops_per_s` is the peak of (MFU's denominator): "bfloat16 dense matrix peak",
    or under a recipe the peak of the datatype its GEMMs run ("float8 dense matrix peak (fp8-tensorwise
    recipe)"); empty: the datatype's"""
    hp_matrix_flops_per_s: float | None = None
    hp_matrix_curve: Curve | None = None
    hp_gemm: GemmTiming | None = None
    hp_grouped_gemm: GemmTiming | None = None
    # whole-step terms (costmodel.terms.step_terms; all 0 without the system's `step:` section)
    kernel_gap_s: float = 0.0          # launch gap of a block's kernel, in the timings above (step curves: added)
    outer_gap_extra_s: float = 0.0     # what a kernel outside the blocks pays beyond that (per-layer CUDA graphs)
    allocator_fraction: float = 0.0    # allocator fragmentation, a share of the bytes freed every microbatch
    dropout: bool = True               # dropout masks stored and applied (a model trained with dropout)
    pp_comm_overlap: bool = False      # interleaved schedules' sends beside compute (Megatron's overlap_p2p_comm)
    moe_flex_dispatcher: bool = False  # DeepEP/HybridEP dispatch (Kernels.moe_dispatcher == "flex")
    moe_flex_backend: str = "deepep"   # the flex dispatcher's library (Kernels.moe_flex_backend)
    moe_comm_overlap: bool = False     # EP dispatch/combine beside another microbatch's compute
    moe_dispatcher_sm_share: float | None = None   # SMs the flex dispatcher holds while hidden (Kernels)
    fused_cross_entropy: bool = True   # Megatron's fused loss (6 bytes per logit) or eager PyTorch's (12)
    expert_bias: bool = False          # the routed experts carry biases (gpt-oss: Model.bias with experts)
    router_has_bias: bool = False      # the router's logits carry a bias (Model.router_bias)
    router_load_balancing: str = "none"   # the router's load-balancing loss (Model.router_load_balancing)
    router_fp32: bool = False          # logits, scores and top-k in float32 (Model.router_fp32)
    router_expert_bias: bool = False   # tokens per expert counted for the bias update (Model.router_expert_bias)
    router_tf32_flops_per_s: float = 0.0   # a float32 router's backward GEMMs: the system's float32 (TF32) peak
    router_tf32_curve: Curve | None = None  # and its step curve
    clamped_activation: bool = False   # the experts' gate is clamped (Model.clamped_activation)
    unfused_rope: bool = False         # RoPE as PyTorch operations (Model.yarn_rope outside latent attention)
    # attention variants (costmodel.terms.block): latent attention's widths, and the sliding window's
    # share of the attention core's work
    v_head_size: float = 0.0           # d_v: a value head's width (0: head_size, d_qk = d_v)
    q_lora_rank: float = 0.0           # latent attention's r_q (0: no query compression)
    kv_lora_rank: float = 0.0          # r_kv (0: not latent attention)
    rope_head_size: float = 0.0        # d_r: the RoPE part of a latent-attention query/key head
    attention_core_scale: float = 1.0  # the attention core's work over a full causal core's, averaged over blocks
    # multi-token prediction modules on the last stage (costmodel.terms.iteration)
    mtp_blocks: float = 0.0
    mtp_block_is_moe: bool = False
    kind_counts: tuple[tuple[str, float], ...] = ()
    """the model's blocks by kind (costmodel.terms.block.BLOCK_KINDS) when it has kinds beyond
    dense and MoE blocks; empty: Context.block_kinds derives them"""
    kind_params: tuple[tuple[str, float], ...] = ()
    kind_order: tuple[str, ...] = ()
    """each block's kind, first to last (costmodel.terms.stage_kinds.block_order); empty:
    Context.block_order derives it from block_kinds"""
    """parameters of one block of each kind beyond dense and MoE blocks (Context.kind_param_count)"""
    mtp_extra_params: float = 0.0      # one module's norms and 2h → h projection (beside its block)
    mamba: object = None
    """a layer pattern's Mamba-2 shape (costmodel.inputs.mamba.MambaShape), None without Mamba layers"""

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (DeepSeek-V3)."""
        return self.kv_lora_rank > 0

    @property
    def value_head_size(self) -> float:
        """d_v: as head_size except under latent attention."""
        return self.v_head_size or self.head_size

    @property
    def kv_width(self) -> float:
        """Elements of K and V per token, all heads: g·(d_qk + d_v)."""
        return self.kv_heads * (self.head_size + self.value_head_size)

    @property
    def gemm_elem_bytes(self) -> float:
        """Bytes of a quantized GEMM's operands in the fitted model's convention (elem_bytes
        without a recipe)."""
        return self.elem_bytes if self.recipe is None else self.recipe.gemm_bytes

    @property
    def block_kinds(self) -> tuple[tuple[str, float], ...]:
        """The model's blocks by kind (costmodel.terms.block.BLOCK_KINDS) and count, the kinds
        it has: `kind_counts` when a model states them, else its dense blocks, then its blocks
        with experts."""
        kinds = self.kind_counts or (("dense", self.blocks - self.moe_blocks), ("moe", self.moe_blocks))
        return tuple((kind, count) for kind, count in kinds if count)

    @property
    def block_order(self) -> tuple[str, ...]:
        """Each block's kind, first to last: `kind_order`, else block_kinds' kinds in turn."""
        return self.kind_order or tuple(kind for kind, count in self.block_kinds for _ in range(int(count)))

    def kind_param_count(self, kind: str) -> float:
        """Parameters of one block of a kind without experts: `kind_params`' when stated, else a
        dense block's."""
        return dict(self.kind_params).get(kind, self.block_params)

    @property
    def quantized(self) -> bool:
        """A recipe that quantizes the blocks' GEMM operands (not bf16, not a datatype alone)."""
        return self.recipe is not None and self.recipe.format.quantized

    def bf16_blocks(self) -> "Context":
        """The same problem for the blocks a recipe keeps in BF16 (costmodel.terms.block_terms mixes
        them in by their share): the BF16 GEMMs and no quantization."""
        return replace(self, recipe=bf16_costs(), matrix_flops_per_s=self.hp_matrix_flops_per_s,
                       matrix_curve=self.hp_matrix_curve, gemm=self.hp_gemm, grouped_gemm=self.hp_grouped_gemm)

    @staticmethod
    def build(model: Model, system: System, datatype: Datatype, kernels: Kernels = Kernels()) -> "Context":
        """The constants of one problem, for costing whole iterations (evaluate, solve, explain,
        brute); `Context.of` builds them for any model."""
        return Context.of(model, system, datatype, kernels)

    @staticmethod
    def of(model: Model, system: System, datatype: Datatype, kernels: Kernels = Kernels()) -> "Context":
        """The constants of one problem, any model. The attention kind is the model's
        (`kv_heads`: 1 is multi-query, attn_heads multi-head, in between grouped-query)."""
        compute = system.compute_for(datatype)
        if model.num_experts and kernels.capacity_factor > model.num_experts / model.experts_per_token:
            raise InputError(f"capacity_factor {kernels.capacity_factor:g} exceeds num_experts / experts_per_token "
                             f"({model.num_experts}/{model.experts_per_token}): the busiest expert cannot receive "
                             f"more than every token")
        elem = float(datatype.bytes)
        master = 0.0 if datatype is Datatype.float32 else MASTER_WEIGHT_BYTES_PER_PARAM
        moments = ADAM_MOMENT_BYTES_PER_PARAM if kernels.optimizer_state == "fp32" else ADAM_BF16_MOMENT_BYTES_PER_PARAM
        step = system.step
        gaps = step_gaps(step.kernel_gap_s if step else 0.0, kernels.cuda_graphs)
        window = step.power_window_s if step is not None else 0.0
        sustained = system.clocks is not None    # every GEMM at the sustained clock (Clocks)
        gemm_compute, peak_ratio, recipe_fields = compute, 1.0, {}
        if kernels.precision is not None:
            gemm_compute, peak_ratio, recipe_fields = _recipe_fields(model, system, datatype, kernels, gaps, window,
                                                                     sustained)
        return Context(
            hidden=model.hidden, feedforward=model.feedforward, seq=model.seq_size, heads=model.attn_heads,
            kv_heads=model.kv_groups, head_size=model.attn_size, blocks=model.num_blocks, vocab=model.vocab_size,
            gated_mlp=model.gated, mlp=model.mlp, rmsnorm=model.norm == "rmsnorm", rope=model.position == "rope",
            tied_embeddings=model.tied_embeddings, dropout=model.dropout,
            block_params=float(model.block_params), embedding_params=float(model.embedding_params),
            output_layer_params=float(model.vocab_size * model.hidden), final_norm_params=float(model.norm_params),
            model_flops_per_sample=model.model_flops_per_sample(), model_flops=model.model_flops(),
            elem_bytes=elem,
            # Gradients travel in 16 bits even with fp8 compute (Transformer Engine keeps
            # wgrads in bf16); fp32 training sends fp32.
            grad_comm_bytes=max(elem, 2.0),
            grad_bytes_per_param=(GRAD_BYTES_PER_PARAM if kernels.grad_datatype == "float32" or datatype is Datatype.float32
                                  else GRAD_16BIT_BYTES_PER_PARAM),
            optimizer_bytes_per_param=master + moments,
            fused_activation=kernels.fused_activation, fused_attention=kernels.fused_attention,
            matrix_flops_per_s=gemm_compute.matrix_flops_per_s * peak_ratio,
            vector_flops_per_s=compute.vector_flops_per_s,
            matrix_curve=_curve(gemm_compute, peak_ratio),
            gemm=gemm_in_step(_timing(gemm_compute.gemm, peak_ratio), gaps.block_s, window,
                              gemm_compute.matrix_flops_per_s * peak_ratio, sustained),
            attention=attention_in_step(compute.attention.timing() if compute.attention is not None else None,
                                        gaps.block_s),
            vector_curve=Curve.of(compute.vector_efficiency),
            hbm_bytes_per_s=system.hbm.bandwidth_bytes_per_s, hbm_curve=Curve.of(system.hbm.efficiency),
            hbm_latency_s=system.hbm.latency_s + gaps.block_s,
            hbm_capacity_bytes=system.usable_hbm_bytes, runtime_reserve_bytes=system.runtime_reserve_bytes,
            offload_bytes_per_s=system.offload.bandwidth_bytes_per_s if system.offload else 0.0,
            offload_curve=Curve.of(system.offload.efficiency if system.offload else [(0, 1.0)]),
            offload_capacity_bytes=system.offload.capacity_bytes if system.offload else 0.0,
            **_network_fields(system),
            **_moe_fields(model), **_router_fields(model, system),
            capacity_factor=float(kernels.capacity_factor),
            grouped_gemm=gemm_in_step(_timing(gemm_compute.grouped_gemm, peak_ratio), gaps.block_s, window,
                                      gemm_compute.matrix_flops_per_s * peak_ratio, sustained),
            kernel_gap_s=gaps.block_s, outer_gap_extra_s=gaps.outer_extra_s,
            allocator_fraction=step.allocator_fragmentation if step else 0.0,
            **_kernel_fields(kernels),
            **_attention_fields(model), mtp_blocks=float(model.mtp_blocks), mtp_block_is_moe=model.mtp_block_is_moe,
            mtp_extra_params=float(model.mtp_module_params - (model.moe_block_params if model.mtp_block_is_moe
                                                              else model.block_params)),
            **recipe_fields, **model.pattern_context_fields(), kind_order=block_order(model),
        )


def _recipe_fields(model: Model, system: System, datatype: Datatype, kernels: Kernels, gaps, window: float,
                   sustained: bool) -> tuple[Compute, float, dict]:
    """A precision recipe's GEMMs (Context.recipe and the BF16 GEMMs it keeps): (the compute its
    quantized GEMMs run on, their peak over that compute's, the Context fields)."""
    compute = system.compute_for(datatype)
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
    recipe = recipe_costs(kernels.precision, layouts, kernels.param_gather_low_precision, share)
    return gemm_compute, peak_ratio, dict(
        recipe=recipe, matrix_peak_name=recipe_peak_name(kernels.precision, recipe.format),
        hp_matrix_flops_per_s=compute.matrix_flops_per_s, hp_matrix_curve=_curve(compute, 1.0),
        hp_gemm=gemm_in_step(_timing(compute.gemm, 1.0), gaps.block_s, window, compute.matrix_flops_per_s,
                             sustained),
        hp_grouped_gemm=gemm_in_step(_timing(compute.grouped_gemm, 1.0), gaps.block_s, window,
                                     compute.matrix_flops_per_s, sustained))


def _network_fields(system: System) -> dict:
    """The system's networks, indexed by network number (Context.net_*)."""
    nets = system.networks
    return dict(
        net_size=tuple(float(n.size) for n in nets),
        net_bytes_per_s=tuple(n.bandwidth_bytes_per_s * n.efficiency for n in nets),
        net_latency_s=tuple(n.latency_s for n in nets),
        net_usage=tuple(n.processor_usage for n in nets),
        net_must_fill=tuple(n.must_be_filled for n in nets),
        net_port_per_gpu=tuple(n.port_per_gpu for n in nets),
        net_factor={op: tuple(n.collectives[op].bytes_factor for n in nets) for op in Collective},
        net_offset={op: tuple(n.collectives[op].n_offset for n in nets) for op in Collective},
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


def _kernel_fields(kernels: Kernels) -> dict:
    """The kernel and runtime settings the formulas read."""
    return dict(
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


def _router_fields(model: Model, system: System) -> dict:
    """A float32 router's backward GEMMs run on TF32 tensor cores (TE cublaslt_gemm.cu: pure FP32
    GEMMs take CUBLAS_COMPUTE_32F_FAST_TF32): the system's float32 compute, where it has one."""
    if not model.router_fp32 or Datatype.float32 not in system.compute:
        return {}
    compute = system.compute[Datatype.float32]
    return dict(router_tf32_flops_per_s=compute.matrix_flops_per_s,
                router_tf32_curve=_curve(compute, 1.0) or Curve.of([(0.0, 1.0)]))


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
