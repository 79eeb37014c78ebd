"""How a problem's layers run: kernel choices that are constants of the problem, not
searched dimensions of the mapping."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Literal

import costmodel.limits as limits
from costmodel.errors import InputError

ATTENTION_KERNELS = ("fused", "unfused")
"""How the attention core runs: one FlashAttention kernel, or four kernels through HBM."""

CudaGraphs = Literal["none", "per-layer", "full-iteration"]
CUDA_GRAPHS: tuple[str, ...] = ("none", "per-layer", "full-iteration")
"""How CUDA graphs were captured: none; each block's forward and backward (Transformer Engine's
`make_graphed_callables`, Megatron-Core's per-layer graphs); the whole forward and backward
(Megatron's `cuda_graph_scope` full_iteration). A graph replays its kernels without a launch
gap between them (the whole-step `kernel_gap_us`, costmodel.step_terms)."""

GradDatatype = Literal["float32", "16bit"]
GRAD_DATATYPES: tuple[str, ...] = ("float32", "16bit")
"""How gradients are kept: fp32 main gradients (Megatron-LM's `--accumulate-allreduce-grads-in-fp32`,
its default with bf16) or in the 16-bit compute type (DeepSpeed's fp16/bf16 ZeRO, and the ZeRO
paper's 2Ψ bytes of gradients)."""


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

    cuda_graphs: CudaGraphs = "none"
    """CUDA graphs (CUDA_GRAPHS): which kernels run without a launch gap. A setting of the
    problem, as the framework runs it; it matters only on systems with whole-step terms."""
    fused_cross_entropy: bool = True
    """The loss as Megatron-LM computes it: a vocab-parallel cross-entropy that keeps the fp32
    softmax and forms the gradient in place (6 bytes per logit); False: eager PyTorch's
    log-softmax and NLL on fp32 logits (12 bytes per logit at the loss's backward)."""

    def __post_init__(self) -> None:
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise InputError(f"cuda_graphs {self.cuda_graphs!r} does not exist (choose from {', '.join(CUDA_GRAPHS)})")
        if self.grad_datatype not in GRAD_DATATYPES:
            raise InputError(f"grad_datatype {self.grad_datatype!r} does not exist (choose from "
                             f"{', '.join(GRAD_DATATYPES)})")
        factor = self.capacity_factor
        if isinstance(factor, bool) or not isinstance(factor, Real) or factor != factor:
            raise InputError(f"capacity_factor {factor!r} is not a number")
        problem = limits.CAPACITY_FACTOR.problem(factor)
        if problem is not None:
            raise InputError(f"capacity_factor {factor:g} is {problem}")

    @staticmethod
    def with_attention(attention: str, grad_datatype: str = "float32", capacity_factor: float = 1.0,
                       cuda_graphs: str = "none") -> "Kernels":
        """From the names users give (`--attention`, `--grad-datatype`, `--capacity-factor` and
        `--cuda-graphs`, a batch file's `attention:`, `grad_datatype:` and `capacity_factor:`)."""
        if attention not in ATTENTION_KERNELS:
            raise InputError(f"attention {attention!r} does not exist (choose from {', '.join(ATTENTION_KERNELS)})")
        return Kernels(fused_attention=attention == "fused", grad_datatype=grad_datatype,
                       capacity_factor=capacity_factor, cuda_graphs=cuda_graphs)

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
        return f"{self.attention} attention{grads}{capacity}{graphs}{loss}"
