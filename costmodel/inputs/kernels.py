"""How a problem's layers run: kernel choices that are constants of the problem, not
searched dimensions of the mapping."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Literal

import costmodel.inputs.limits as limits
from costmodel.errors import InputError
from costmodel.inputs.precision import FORMATS, OPTIMIZER_STATES, OptimizerState, Precision

ATTENTION_KERNELS = ("fused", "unfused")
"""How the attention core runs: one FlashAttention kernel, or four kernels through HBM."""

CudaGraphs = Literal["none", "per-layer", "full-iteration"]
MoeDispatcher = Literal["alltoall", "flex"]
MOE_DISPATCHERS = ("alltoall", "flex")
MoeFlexBackend = Literal["deepep", "hybridep"]
MOE_FLEX_BACKENDS = ("deepep", "hybridep")
"""The flex dispatcher's library (Megatron-LM's `moe_flex_dispatcher_backend`, default deepep:
megatron/core/transformer/transformer_config.py): DeepEP's normal kernels, or HybridEP's. They
launch different kernels around the same communication (costmodel.terms.moe_kernels)."""
CUDA_GRAPHS: tuple[str, ...] = ("none", "per-layer", "full-iteration")
"""How CUDA graphs were captured: none; each block's forward and backward (Transformer Engine's
`make_graphed_callables`, Megatron-Core's per-layer graphs); the whole forward and backward
(Megatron's `cuda_graph_scope` full_iteration). A graph replays its kernels without a launch
gap between them (the whole-step `kernel_gap_us`, costmodel.terms.step_terms)."""

GradDatatype = Literal["float32", "16bit"]
GRAD_DATATYPES: tuple[str, ...] = ("float32", "16bit")
"""How gradients are kept: fp32 main gradients (Megatron-LM's `--accumulate-allreduce-grads-in-fp32`,
its default with bf16) or in the 16-bit compute type (DeepSpeed's fp16/bf16 ZeRO, and the ZeRO
paper's 2Ψ bytes of gradients)."""


PRECISION_DEFAULTS = {"precision": None, "optimizer_state": "fp32", "low_precision_param_gather": None,
                      "bf16_first_last_blocks": 0}
"""The precision settings' defaults: no recipe (the datatype's costing), fp32 moments, the
recipe's own weight all-gather, no BF16 blocks."""


@dataclass(frozen=True)
class Kernels:
    """The kernels every mapping of one problem shares."""

    fused_activation: bool = True
    """GeLU fused into the epilogue of the preceding matrix multiply."""
    fused_attention: bool = True
    """FlashAttention (Dao et al. 2022): the attention core is one kernel and the s×s scores
    never reach HBM; False: four kernels through HBM, as Megatron-LM in 2022 (the Selene
    measurements) and Calculon model it."""
    grad_datatype: GradDatatype = "float32"
    """How gradients are kept (GRAD_DATATYPES): a setting of the problem, like the kernels —
    not searched, since it changes the numerics of training, not only its speed."""
    capacity_factor: float = 1.0
    """Mixture-of-experts load imbalance: the tokens the busiest expert receives over the mean,
    k·T/E (the "capacity factor" of GShard and Switch Transformer, whose expert capacity is
    capacity_factor × tokens/experts; Fedus et al. 2022, §2.2). The busiest expert sets the
    grouped GEMMs' time and the all-to-all's volume. 1.0 (default) is perfect balance, what the
    auxiliary load-balancing loss aims at and Switch Transformer's smallest trained setting
    (Table 1 compares 1.0, 1.25 and 2.0); Megatron-LM's default (`--moe-expert-capacity-factor`
    None) drops no token and caps nothing, so 1.0 is its best case. A problem setting, not
    searched: it is the router's, not the mapping's. Ignored by dense models."""
    precision: Precision | None = None
    """The precision recipe (costmodel.inputs.precision): which tensors are quantized, into how many
    bytes, by which passes. None: the datatype alone decides every byte (Calculon's costing;
    `--datatype float8` is its all-FP8). A setting of the problem, not searched: it changes
    the numerics of training."""
    optimizer_state: OptimizerState = "fp32"
    """Adam's moments in fp32 or bf16 (OPTIMIZER_STATES); the fp32 master weights stay."""
    low_precision_param_gather: bool | None = None
    """Weights kept and all-gathered in the recipe's format beside the fp32 main copy (Megatron's
    fp8_param_gather / fp4_param_gather); None: as Megatron-Bridge's recipe of that name sets it."""
    bf16_first_last_blocks: int = 0
    """Blocks at each end of the model kept in BF16 under an FP8/FP4 recipe (Megatron's
    first_last_layers_bf16 with num_layers_at_start/end_in_bf16; Megatron-Bridge's performance
    scripts set none)."""

    cuda_graphs: CudaGraphs = "none"
    """CUDA graphs (CUDA_GRAPHS): which kernels run without a launch gap. A setting of the
    problem, as the framework runs it; it matters only on systems with whole-step terms."""
    pp_comm_overlap: bool = False
    """Megatron's overlap_p2p_comm: with an interleaved schedule (v > 1) the stage-boundary sends
    and receives run asynchronously beside the chunks' compute instead of between them
    (costmodel.terms.pipeline_time). Megatron-Bridge turns it on whenever vp > 1; False keeps the sends
    exposed (Calculon's costing). A setting of the problem, not searched."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """Megatron-LM's token dispatcher (`moe_token_dispatcher_type`): alltoall (NCCL all-to-all
    between separate permute and unpermute passes) or flex (DeepEP / HybridEP: permutation fused
    into the dispatch and combine kernels, each token sent once per destination GPU:
    costmodel.terms.moe). A setting of the problem, not searched."""
    moe_flex_backend: MoeFlexBackend = "deepep"
    """With the flex dispatcher: the library that runs it (MOE_FLEX_BACKENDS; Megatron-LM's
    `moe_flex_dispatcher_backend`). A setting of the problem, not searched."""
    moe_comm_overlap: bool = False
    """Megatron-LM's overlap_moe_expert_parallel_comm (with delay_wgrad_compute): the dispatch and
    combine of one microbatch run beside another microbatch's forward and backward compute
    (costmodel.terms.block_terms). A setting of the problem, not searched."""
    moe_dispatcher_sm_share: float | None = None
    """With the flex dispatcher and moe_comm_overlap: the share of the GPU's SMs the DeepEP /
    HybridEP kernels hold while they run beside another microbatch's compute (their SM count
    over the GPU's: costmodel.measured.run_bridge); the compute they overlap is slowed by that share.
    None: the expert-parallel network's processor_usage (an NCCL all-to-all's). A setting of the
    problem, not searched."""
    fused_cross_entropy: bool = True
    """The loss as Megatron-LM computes it: a vocab-parallel cross-entropy that keeps the fp32
    softmax and forms the gradient in place (6 bytes per logit); False: eager PyTorch's
    log-softmax and NLL on fp32 logits (12 bytes per logit at the loss's backward)."""

    def __post_init__(self) -> None:
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise InputError(f"cuda_graphs {self.cuda_graphs!r} does not exist (choose from {', '.join(CUDA_GRAPHS)})")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise InputError(f"moe_dispatcher {self.moe_dispatcher!r} does not exist (choose from "
                             f"{', '.join(MOE_DISPATCHERS)})")
        if self.moe_flex_backend not in MOE_FLEX_BACKENDS:
            raise InputError(f"moe_flex_backend {self.moe_flex_backend!r} does not exist (choose from "
                             f"{', '.join(MOE_FLEX_BACKENDS)})")
        if self.grad_datatype not in GRAD_DATATYPES:
            raise InputError(f"grad_datatype {self.grad_datatype!r} does not exist (choose from "
                             f"{', '.join(GRAD_DATATYPES)})")
        share = self.moe_dispatcher_sm_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, Real) or not 0 < share < 1):
            raise InputError(f"moe_dispatcher_sm_share {share!r} is not a share of the GPU's SMs in (0, 1)")
        factor = self.capacity_factor
        if isinstance(factor, bool) or not isinstance(factor, Real) or factor != factor:
            raise InputError(f"capacity_factor {factor!r} is not a number")
        problem = limits.CAPACITY_FACTOR.problem(factor)
        if problem is not None:
            raise InputError(f"capacity_factor {factor:g} is {problem}")
        if self.precision is not None and not isinstance(self.precision, Precision):
            try:
                object.__setattr__(self, "precision", Precision(self.precision))
            except ValueError:
                raise InputError(f"precision {self.precision!r} does not exist (choose from "
                                 f"{', '.join(p.value for p in Precision)})") from None
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise InputError(f"optimizer_state {self.optimizer_state!r} does not exist (choose from "
                             f"{', '.join(OPTIMIZER_STATES)})")
        blocks = self.bf16_first_last_blocks
        if isinstance(blocks, bool) or not isinstance(blocks, int) or not 0 <= blocks <= limits.NUM_BLOCKS.high:
            raise InputError(f"bf16_first_last_blocks {blocks!r} is not a whole number of blocks >= 0")
        quantized = self.precision is not None and FORMATS[self.precision].quantized
        if (blocks or self.low_precision_param_gather) and not quantized:
            what = "bf16_first_last_blocks" if blocks else "low_precision_param_gather"
            raise InputError(f"{what} needs an FP8 or FP4 precision recipe, not "
                             f"{self.precision.value if self.precision else 'none'}")

    @staticmethod
    def with_attention(attention: str, grad_datatype: str = "float32", capacity_factor: float = 1.0,
                       cuda_graphs: str = "none", pp_comm_overlap: bool = False, **precision) -> "Kernels":
        """From the names users give (`--attention`, `--grad-datatype`, `--capacity-factor`,
        `--cuda-graphs`, `--pp-comm-overlap` and the precision options `precision`, `optimizer_state`, `low_precision_param_gather`,
        `bf16_first_last_blocks`; a batch file's keys of the same names)."""
        if attention not in ATTENTION_KERNELS:
            raise InputError(f"attention {attention!r} does not exist (choose from {', '.join(ATTENTION_KERNELS)})")
        return Kernels(fused_attention=attention == "fused", grad_datatype=grad_datatype,
                       capacity_factor=capacity_factor, cuda_graphs=cuda_graphs, pp_comm_overlap=pp_comm_overlap,
                       **precision)

    @property
    def param_gather_low_precision(self) -> bool:
        """Whether weights are kept and all-gathered in the recipe's format (the recipe's
        Megatron-Bridge default unless stated)."""
        if self.precision is None or not FORMATS[self.precision].quantized:
            return False
        stated = self.low_precision_param_gather
        return FORMATS[self.precision].param_gather if stated is None else stated

    @property
    def precision_settings(self) -> dict:
        """The four precision settings by name (a Mapping's fields, with_attention's keywords)."""
        return {"precision": None if self.precision is None else self.precision.value,
                "optimizer_state": self.optimizer_state,
                "low_precision_param_gather": self.low_precision_param_gather,
                "bf16_first_last_blocks": self.bf16_first_last_blocks}

    @property
    def mapping_settings(self) -> dict:
        """Every setting a Mapping file states for these kernels, by its field name (the inverse
        of Mapping.kernels): a mapping the search prints evaluates to the time it printed."""
        return {"fused_activation": self.fused_activation, "fused_attention": self.fused_attention,
                "grad_datatype": self.grad_datatype, "capacity_factor": self.capacity_factor,
                **self.precision_settings, "cuda_graphs": self.cuda_graphs,
                "fused_cross_entropy": self.fused_cross_entropy, "pipeline_comm_overlap": self.pp_comm_overlap,
                "moe_dispatcher": self.moe_dispatcher, "moe_flex_backend": self.moe_flex_backend,
                "moe_comm_overlap": self.moe_comm_overlap, "moe_dispatcher_sm_share": self.moe_dispatcher_sm_share}

    @property
    def precision_record(self) -> dict:
        """The precision settings that differ from the defaults, as JSON records state them
        (nothing for a problem without them: records read as before)."""
        return {name: value for name, value in self.precision_settings.items() if value != PRECISION_DEFAULTS[name]}

    @property
    def attention(self) -> str:
        return "fused" if self.fused_attention else "unfused"

    @property
    def label(self) -> str:
        """How a command's header names these settings: "fused attention", or "unfused
        attention, 16-bit gradients" (the gradient datatype only when not the default)."""
        grads = "" if self.grad_datatype == "float32" else ", 16-bit gradients"
        capacity = "" if self.capacity_factor == 1.0 else f", capacity factor {self.capacity_factor:g}"
        graphs = "" if self.cuda_graphs == "none" else f", CUDA graphs {self.cuda_graphs}"
        loss = "" if self.fused_cross_entropy else ", eager cross-entropy"
        sends = ", pipeline sends overlapped" if self.pp_comm_overlap else ""
        return f"{self.precision_label}{self.attention} attention{grads}{capacity}{graphs}{loss}{sends}"

    @property
    def precision_label(self) -> str:
        """"fp8-tensorwise recipe (FP8 weight all-gather), " and the like; empty without a recipe."""
        if self.precision is None and self.optimizer_state == "fp32":
            return ""
        parts = [] if self.precision is None else [f"{self.precision.value} recipe"]
        details = []
        if self.precision is not None and FORMATS[self.precision].quantized:
            if self.low_precision_param_gather is not None or FORMATS[self.precision].param_gather:
                details.append("low-precision weight all-gather" if self.param_gather_low_precision
                               else "bf16 weight all-gather")
            if self.bf16_first_last_blocks:
                details.append(f"first and last {self.bf16_first_last_blocks} blocks in bf16")
        if self.optimizer_state != "fp32":
            details.append(f"{self.optimizer_state} Adam moments")
        text = ", ".join(parts + details) if not parts else parts[0] + (f" ({', '.join(details)})" if details else "")
        return text + ", "
