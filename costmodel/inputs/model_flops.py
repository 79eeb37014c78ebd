"""Model FLOP per token, the MFU numerator (costmodel.inputs.model.Model.model_flops builds it)."""

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
    their 2h → h projections and their logits. The attention terms are halved for the causal
    mask (costmodel.inputs.model.CAUSAL_ATTENTION_SHARE) as published tables count them
    (Megatron-Bridge's flop_utils.py; the full s×s product would inflate MFU at long sequences:
    72.6 % instead of ~45 % for Llama 3.1 70B at 131K tokens); a sliding window does not reduce
    them. Element-wise work (norms, softmax, activations, the loss) is not counted."""

    matrix_params: int          # parameters in matrix multiplies a token uses (blocks + output layer)
    matrix_per_token: float     # 6 × matrix_params
    attention_per_token: float  # 3 × 2 × 2·s·a·d × L × 1/2 (halved by the causal mask)
    seq_size: int
    sparse: bool = False        # a mixture-of-experts model: matrix_params are its active ones
    scan_per_token: float = 0.0
    """a layer pattern's Mamba-2 layers: 3 × their SSD chunked scans' products (costmodel.inputs.mamba)"""

    @property
    def per_token(self) -> float:
        return self.matrix_per_token + self.attention_per_token + self.scan_per_token

    @property
    def per_sequence(self) -> float:
        return self.per_token * self.seq_size

    @property
    def full_attention_per_token(self) -> float:
        """The attention terms without the causal halving: the full s×s product (Calculon's count)."""
        return self.attention_per_token * 2
