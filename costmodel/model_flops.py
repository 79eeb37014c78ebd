"""Model FLOP per token, the MFU numerator (costmodel.model.Model.model_flops builds it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOP per token, the convention of Megatron-LM (Narayanan et al. 2021, eq. 3) and
    NeMo's benchmark tables: 3 passes (forward, activation gradient, weight gradient) × 2 FLOP
    per multiply-add over every matrix a token uses — the blocks' weights (in a
    mixture-of-experts block the router, the shared experts and k of the E routed experts: MFU
    is stated on active parameters) and the output layer (6 × those parameters per token) —
    plus the attention scores Q·Kᵀ and context ·V (2·s·a·d each per token, forward; 2·s·a·d_qk
    and 2·s·a·d_v under latent attention). Multi-token prediction modules add their blocks,
    their 2h → h projections and their logits. Neither causal masking nor a sliding window
    reduces the attention terms here: the published
    MFU figures count the full s×s product, so these numbers compare with theirs (a causal
    kernel skips about half of that work: the attention terms × 1/2 is the useful FLOP).
    Element-wise work (norms, softmax, activations, the loss) is not counted."""

    matrix_params: int          # parameters in matrix multiplies a token uses (blocks + output layer)
    matrix_per_token: float     # 6 × matrix_params
    attention_per_token: float  # 3 × 2 × 2·s·a·d × L (full, not halved by the causal mask)
    seq_size: int
    sparse: bool = False        # a mixture-of-experts model: matrix_params are its active ones

    @property
    def per_token(self) -> float:
        return self.matrix_per_token + self.attention_per_token

    @property
    def per_sequence(self) -> float:
        return self.per_token * self.seq_size

    @property
    def causal_attention_per_token(self) -> float:
        """The attention terms a causal kernel actually computes: half of the full product."""
        return self.attention_per_token / 2
