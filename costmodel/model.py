"""The application: the shape of a transformer language model.

Field names follow Calculon's model files (`hidden`, `feedforward`, `seq_size`,
`attn_heads`, `attn_size`, `num_blocks`) so its users can bring theirs unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InputError


class Model(BaseModel):
    """A decoder-only transformer: `num_blocks` identical blocks of attention + MLP."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("model", description="A label for tables and plots.")
    hidden: int = Field(gt=0, description="Model (embedding) width, h.")
    feedforward: int = Field(gt=0, description="Width of the MLP's inner layer, usually 4·h.")
    seq_size: int = Field(gt=0, description="Sequence length in tokens, s.")
    attn_heads: int = Field(gt=0, description="Number of attention heads, a.")
    attn_size: int = Field(gt=0, description="Width of one attention head, d (a·d is usually h).")
    num_blocks: int = Field(gt=0, description="Number of transformer blocks, L.")
    vocab_size: int = Field(51200, gt=0, description="Vocabulary size, V (Megatron's GPT-2 default).")

    # ---- parameter counts (the weights of one block, and of the whole model) ----
    @property
    def attn_width(self) -> int:
        """a·d: total width of the attention heads (Q, K, V each have this many columns)."""
        return self.attn_heads * self.attn_size

    @property
    def block_weight_params(self) -> int:
        """Matrix parameters of one block: QKV (3·h·a·d), output projection (a·d·h), MLP (2·h·f)."""
        return 4 * self.hidden * self.attn_width + 2 * self.hidden * self.feedforward

    @property
    def block_vector_params(self) -> int:
        """Biases and layer-norm parameters of one block: QKV bias 3·a·d, projection bias h,
        MLP biases f + h, two layer norms 2·2·h."""
        return 3 * self.attn_width + self.hidden + self.feedforward + self.hidden + 4 * self.hidden

    @property
    def block_params(self) -> int:
        return self.block_weight_params + self.block_vector_params

    @property
    def embedding_params(self) -> int:
        """Token embedding V·h (tied with the output layer) plus learned positions s·h."""
        return self.vocab_size * self.hidden + self.seq_size * self.hidden

    @property
    def total_params(self) -> int:
        return self.num_blocks * self.block_params + self.embedding_params

    def model_flops_per_sample(self) -> float:
        """Training FLOP per sequence with no recomputation (the MFU numerator): 3 passes
        (forward, activation gradient, weight gradient) × 2 FLOP per multiply-add over every
        matrix: the block weights per token, the attention scores and context (2·s·a·d per
        token each), and the output logits (h·V per token)."""
        s = self.seq_size
        per_token_fwd = 2 * self.block_weight_params + 2 * 2 * s * self.attn_width
        per_token_fwd = per_token_fwd * self.num_blocks + 2 * self.hidden * self.vocab_size
        return 3.0 * per_token_fwd * s


def check_positive_int(value: object, field: str) -> int:
    """For values given on the command line: a whole positive number or an InputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{field}: {value!r} is not a positive whole number")
    return value
