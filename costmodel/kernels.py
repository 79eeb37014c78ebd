"""How a problem's layers run: kernel choices that are constants of the problem, not
searched dimensions of the mapping."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.errors import InputError

ATTENTION_KERNELS = ("fused", "unfused")
"""How the attention core runs: one FlashAttention kernel, or four kernels through HBM."""


@dataclass(frozen=True)
class Kernels:
    """The kernels every mapping of one problem shares."""

    fused_activation: bool = True
    """GeLU fused into the epilogue of the preceding matrix multiply."""
    fused_attention: bool = True
    """FlashAttention (Dao et al. 2022): the attention core is one kernel and the s×s scores
    never reach HBM; False: four kernels through HBM, as Megatron-LM in 2022 (the Selene
    measurements) and Calculon model it."""

    @staticmethod
    def with_attention(attention: str) -> "Kernels":
        """From the name users give (`--attention`, a batch file's `attention:`)."""
        if attention not in ATTENTION_KERNELS:
            raise InputError(f"attention {attention!r} does not exist (choose from {', '.join(ATTENTION_KERNELS)})")
        return Kernels(fused_attention=attention == "fused")

    @property
    def attention(self) -> str:
        return "fused" if self.fused_attention else "unfused"
