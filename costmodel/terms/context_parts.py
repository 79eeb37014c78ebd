"""The parts of a problem's constants (costmodel.terms.context.Context), one per input: the
model's shape, the GPU's compute, its memory tiers, its networks, the datatype and precision
recipe, the whole-step terms and the kernel settings. A formula reads `c.model.hidden`,
`c.compute.gemm`, `c.net.bytes_per_s[i]`: the part says which input a number comes from."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.inputs.kernel_fits import AttentionTiming, GemmTiming
from costmodel.inputs.model import ModelFlops
from costmodel.inputs.precision import RecipeCosts
from costmodel.inputs.system import Collective
from costmodel.ops import Curve


@dataclass(frozen=True)
class ModelShape:
    """The model (costmodel.inputs.model.Model, with the sequence length it trains at): widths,
    blocks, parameters, its mixture of experts, attention variants, multi-token prediction and
    its blocks by kind."""

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
    dropout: bool = True         # dropout masks stored and applied (a model trained with dropout)
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
    expert_bias: bool = False          # the routed experts carry biases (gpt-oss: Model.bias with experts)
    router_has_bias: bool = False      # the router's logits carry a bias (Model.router_bias)
    clamped_activation: bool = False   # the experts' gate is clamped (Model.clamped_activation)
    router_load_balancing: str = "none"   # the router's load-balancing loss (Model.router_load_balancing)
    router_fp32: bool = False          # logits, scores and top-k in float32 (Model.router_fp32)
    router_expert_bias: bool = False   # tokens per expert counted for the bias update (Model.router_expert_bias)
    unfused_rope: bool = False         # RoPE as PyTorch operations (Model.yarn_rope outside latent attention)
    # attention variants (costmodel.terms.attention): latent attention's widths, and the sliding
    # window's share of the attention core's work
    v_head_size: float = 0.0           # d_v: a value head's width (0: head_size, d_qk = d_v)
    q_lora_rank: float = 0.0           # latent attention's r_q (0: no query compression)
    kv_lora_rank: float = 0.0          # r_kv (0: not latent attention)
    rope_head_size: float = 0.0        # d_r: the RoPE part of a latent-attention query/key head
    attention_core_scale: float = 1.0  # the attention core's work over a full causal core's, averaged over blocks
    # multi-token prediction modules on the last stage (costmodel.terms.iteration)
    mtp_blocks: float = 0.0
    mtp_block_is_moe: bool = False
    mtp_extra_params: float = 0.0      # one module's norms and 2h → h projection (beside its block)
    # blocks by kind (costmodel.terms.block.BLOCK_KINDS)
    kind_counts: tuple[tuple[str, float], ...] = ()
    """the model's blocks by kind when it has kinds beyond dense and MoE blocks; empty:
    `block_kinds` derives them"""
    kind_params: tuple[tuple[str, float], ...] = ()
    """parameters of one block of each kind beyond dense and MoE blocks (`kind_param_count`)"""
    kind_order: tuple[str, ...] = ()
    """each block's kind, first to last (costmodel.terms.stage_kinds.block_order); empty:
    `block_order` derives it from `block_kinds`"""
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
    def mtp_kind(self) -> str:
        """The kind of a multi-token prediction module's block: the last block's (DeepSeek-V3: MoE)."""
        return "moe" if self.mtp_block_is_moe else "dense"

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


@dataclass(frozen=True)
class ComputeRates:
    """The GPU's compute for the problem's datatype (costmodel.inputs.system.System.compute_for,
    in the whole step: costmodel.terms.step_terms). Under a precision recipe the matrix fields
    are its quantized GEMMs', and the GEMMs that stay BF16 (attention, output layer, router) run
    on the `hp_` fields (None: as the others)."""

    matrix_flops_per_s: float
    vector_flops_per_s: float
    matrix_curve: Curve | None          # the step curve by FLOP, or None with a fitted GEMM model
    gemm: GemmTiming | None             # the fitted shape-aware GEMM model (costmodel.terms.kernel_time)
    attention: AttentionTiming | None   # the fitted fused-attention model, if the system has one
    vector_curve: Curve
    grouped_gemm: GemmTiming | None = None   # the fitted grouped-GEMM model, if the system has one
    matrix_peak_name: str = ""
    """what `matrix_flops_per_s` is the peak of (MFU's denominator): "bfloat16 dense matrix peak",
    or under a recipe the peak of the datatype its GEMMs run ("float8 dense matrix peak (fp8-tensorwise
    recipe)"); empty: the datatype's"""
    hp_matrix_flops_per_s: float | None = None
    hp_matrix_curve: Curve | None = None
    hp_gemm: GemmTiming | None = None
    hp_grouped_gemm: GemmTiming | None = None
    router_tf32_flops_per_s: float = 0.0   # a float32 router's backward GEMMs: the system's float32 (TF32) peak
    router_tf32_curve: Curve | None = None  # and its step curve
    weight_grad_gemm: GemmTiming | None = None
    """the recipe's weight-gradient GEMMs at their own shape, where its file states their rate
    (RecipeCompute.weight_grad_efficiency; None: each as long as its forward GEMM)"""


@dataclass(frozen=True)
class MemoryTiers:
    """The GPU's memory tiers (System.hbm, System.offload, the HBM headroom and runtime reserve)."""

    hbm_bytes_per_s: float
    hbm_curve: Curve
    hbm_latency_s: float                # fixed cost of one element-wise (HBM-bound) kernel
    hbm_capacity_bytes: float           # usable: the capacity less the HBM headroom (System.usable_hbm_bytes)
    runtime_reserve_bytes: float        # CUDA context, communication buffers, fragmentation
    offload_bytes_per_s: float          # 0 without an offload tier
    offload_curve: Curve
    offload_capacity_bytes: float


@dataclass(frozen=True)
class Networks:
    """The system's networks (System.networks), each field indexed by network number."""

    size: tuple[float, ...]
    bytes_per_s: tuple[float, ...]      # bandwidth · efficiency
    latency_s: tuple[float, ...]
    usage: tuple[float, ...]            # share of compute stolen while overlapping
    must_fill: tuple[bool, ...]
    port_per_gpu: tuple[bool, ...]      # a port per GPU: groups cross domains on all their ports (costmodel.terms.comm)
    factor: dict[Collective, tuple[float, ...]]
    offset: dict[Collective, tuple[float, ...]]


@dataclass(frozen=True)
class PrecisionBytes:
    """The datatype and the precision recipe (the problem's Datatype; Kernels.precision,
    grad_datatype, optimizer_state): bytes per element and per parameter, and the recipe's costs."""

    elem_bytes: float            # bytes per weight/activation element (BF16's under a recipe)
    grad_comm_bytes: float       # bytes per gradient element on the DP network
    grad_bytes_per_param: float  # bytes per kept gradient (4: fp32 main gradients; 2: 16-bit)
    optimizer_bytes_per_param: float
    recipe: RecipeCosts | None = None
    """the precision recipe's costs (costmodel.inputs.precision); None is the datatype's costing
    (Calculon's)"""

    @property
    def gemm_elem_bytes(self) -> float:
        """Bytes of a quantized GEMM's operands in the fitted model's convention (elem_bytes
        without a recipe)."""
        return self.elem_bytes if self.recipe is None else self.recipe.gemm_bytes

    @property
    def quantized(self) -> bool:
        """A recipe that quantizes the blocks' GEMM operands (not bf16, not a datatype alone)."""
        return self.recipe is not None and self.recipe.format.quantized


@dataclass(frozen=True)
class StepOverheads:
    """The whole-step terms (a system file's `step:` section with Kernels.cuda_graphs,
    costmodel.terms.step_terms; all 0 without the section)."""

    kernel_gap_s: float = 0.0          # launch gap of a block's kernel, in the timings above (step curves: added)
    outer_gap_extra_s: float = 0.0     # what a kernel outside the blocks pays beyond that (per-layer CUDA graphs)
    allocator_fraction: float = 0.0    # allocator fragmentation, a share of the bytes freed every microbatch


@dataclass(frozen=True)
class KernelSettings:
    """The kernel and runtime settings the formulas read (costmodel.inputs.kernels.Kernels)."""

    fused_activation: bool
    fused_attention: bool
    capacity_factor: float = 1.0       # the busiest expert's tokens over the mean (Kernels.capacity_factor)
    fused_cross_entropy: bool = True   # Megatron's fused loss (6 bytes per logit) or eager PyTorch's (12)
    pp_comm_overlap: bool = False      # interleaved schedules' sends beside compute (Megatron's overlap_p2p_comm)
    moe_flex_dispatcher: bool = False  # DeepEP/HybridEP dispatch (Kernels.moe_dispatcher == "flex")
    moe_flex_backend: str = "deepep"   # the flex dispatcher's library (Kernels.moe_flex_backend)
    moe_comm_overlap: bool = False     # EP dispatch/combine beside another microbatch's compute
    moe_dispatcher_sm_share: float | None = None   # SMs the flex dispatcher holds while hidden (Kernels)
