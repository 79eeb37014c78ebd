"""The application: the shape of a transformer language model.

Field names follow Calculon's model files (`hidden`, `feedforward`, `seq_size`,
`attn_heads`, `attn_size`, `num_blocks`) so its users can bring theirs unchanged.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

import costmodel.limits as limits
from costmodel.errors import InputError
from costmodel.limits import Bound


# ---- field types shared by the three inputs (model, system, mapping) ----
# pydantic's lax mode would read `true` (and YAML 1.1's yes/on) as 1 and the string "12" as
# 12; a size in an input file must be written as a number.


def _whole_number(value: object) -> object:
    """A whole number as written in a file: an int (numpy integers too), or a float with no
    fractional part (12.0, as JSON writers sometimes emit, reads as 12). Booleans, strings
    and fractions are rejected with a message saying why."""
    if isinstance(value, bool):
        raise ValueError("a boolean, not a whole number (YAML reads yes/no/on/off as booleans too)")
    if isinstance(value, str):
        if _yaml_exponent_text(value):
            signed = re.sub(r"([eE])(\d)", r"\1+\2", value)
            raise ValueError(f"text, not a number: YAML 1.1 reads an exponent without a sign as text (write {signed})")
        raise ValueError("a string, not a whole number (write the number without quotes)")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        if value != int(value):
            raise ValueError("not a whole number")
        return int(value)
    return value  # anything else (a list, a mapping) fails as "a valid integer" below


def _yaml_exponent_text(text: str) -> bool:
    """True for text like 1e3 or 2.5E9: a number to Python, a string to YAML 1.1."""
    try:
        float(text)
    except ValueError:
        return False
    return "e" in text.lower() and "inf" not in text.lower()


def _real_number(value: object) -> object:
    """A real number: not a boolean (lax pydantic would read `true` as 1.0). Strings holding a
    number are accepted: YAML 1.1 reads an exponent without a sign (`3.17e9`) as a string,
    and the number written is the one meant. NaN and infinity are refused by allow_inf_nan."""
    if isinstance(value, bool):
        raise ValueError("a boolean, not a number (YAML reads yes/no/on/off as booleans too)")
    return value


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
"""An int field of an input file (a size, a count, an index)."""

RealNumber = Annotated[float, BeforeValidator(_real_number)]
"""A float field of an input file; finite (every input model sets allow_inf_nan=False)."""

def within(bound: Bound) -> AfterValidator:
    """A validator refusing values outside `bound`, naming the bound and its reason."""

    def check(value):
        problem = bound.problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


INPUT_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
"""Every input is frozen, forbids unknown fields (typos) and refuses NaN and infinity."""


class Model(BaseModel):
    """A decoder-only transformer: `num_blocks` identical blocks of attention + MLP."""

    model_config = INPUT_CONFIG

    name: str = Field("model", description="A label for tables and plots.")
    hidden: Annotated[WholeNumber, within(limits.HIDDEN)] = Field(
        gt=0, description="Model (embedding) width, h.")
    feedforward: Annotated[WholeNumber, within(limits.FEEDFORWARD)] = Field(
        gt=0, description="Width of the MLP's inner layer, usually 4·h.")
    seq_size: Annotated[WholeNumber, within(limits.SEQ_SIZE)] = Field(
        gt=0, description="Sequence length in tokens, s.")
    attn_heads: Annotated[WholeNumber, within(limits.ATTN_HEADS)] = Field(
        gt=0, description="Number of attention heads, a.")
    attn_size: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        gt=0, description="Width of one attention head, d (a·d is usually h).")
    num_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] = Field(
        gt=0, description="Number of transformer blocks, L.")
    vocab_size: Annotated[WholeNumber, within(limits.VOCAB_SIZE)] = Field(
        51200, gt=0, description="Vocabulary size, V (Megatron's GPT-2 default).")

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
