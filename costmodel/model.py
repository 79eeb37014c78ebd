"""The application: the shape of a transformer language model.

Field names follow Calculon's model files (`hidden`, `feedforward`, `seq_size`,
`attn_heads`, `attn_size`, `num_blocks`) so its users can bring theirs unchanged; the fields
of today's dense models (`kv_heads`, `mlp`, `norm`, `position`, `tied_embeddings`, `bias`)
default to the GPT family. A Hugging Face config.json reads into this class too
(costmodel.hf).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

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


MlpKind = Literal["gelu", "swiglu", "geglu", "squared_relu"]
"""The MLP's activation: GeLU (two matrices, GPT-2/3); SwiGLU and GeGLU (gated: three
matrices of hidden × feedforward and an element-wise gate, Shazeer 2020, "GLU Variants
Improve Transformer"; Llama, Qwen, Mistral); squared ReLU (two matrices, Nemotron-4)."""
GATED_MLPS = ("swiglu", "geglu")


class Model(BaseModel):
    """A decoder-only transformer: `num_blocks` identical blocks of attention + MLP.

    The defaults describe the GPT-2/GPT-3 family (multi-head attention, GeLU, layer norm,
    learned positions, tied embeddings, biases), so files written before the newer fields
    existed read unchanged."""

    model_config = INPUT_CONFIG

    name: str = Field("model", description="A label for tables and plots.")
    hidden: Annotated[WholeNumber, within(limits.HIDDEN)] = Field(gt=0, description="Model (embedding) width, h.")
    feedforward: Annotated[WholeNumber, within(limits.FEEDFORWARD)] = Field(
        gt=0, description="Width of the MLP's inner layer, f (4·h for GPT; Hugging Face's intermediate_size).")
    seq_size: Annotated[WholeNumber, within(limits.SEQ_SIZE)] = Field(
        gt=0, description="Training sequence length in tokens, s.")
    attn_heads: Annotated[WholeNumber, within(limits.ATTN_HEADS)] = Field(
        gt=0, description="Number of attention (query) heads, a.")
    attn_size: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        gt=0, description="Width of one attention head, d (a·d is usually h).")
    num_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] = Field(
        gt=0, description="Number of transformer blocks, L.")
    vocab_size: Annotated[WholeNumber, within(limits.VOCAB_SIZE)] = Field(
        51200, gt=0, description="Vocabulary size, V (Megatron's GPT-2 default).")
    kv_heads: Annotated[WholeNumber, within(limits.ATTN_HEADS)] | None = Field(
        None, gt=0, description="Key/value heads, g (grouped-query attention; 1 = multi-query). "
                                "Default: attn_heads (multi-head). Must divide attn_heads.")
    mlp: MlpKind = Field("gelu", description="gelu | swiglu | geglu | squared_relu.")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="layernorm | rmsnorm.")
    position: Literal["learned", "rope"] = Field(
        "learned", description="learned (a seq_size × hidden table) | rope (rotary, no parameters).")
    tied_embeddings: bool = Field(True, description="The output layer shares the token embedding's weights.")
    bias: bool = Field(True, description="Linear layers and norms carry biases (Llama-class models have none).")
    qkv_bias: bool | None = Field(None, description="Biases on the Q, K, V projections only (Qwen2); "
                                                    "default: as `bias`.")

    @model_validator(mode="after")
    def _heads_group(self) -> "Model":
        if self.kv_heads is not None and self.attn_heads % self.kv_heads:
            raise ValueError(f"kv_heads({self.kv_heads}) does not divide attn_heads({self.attn_heads}): "
                             f"each key/value head serves a whole group of query heads")
        return self

    # ---- derived shape ----
    @property
    def kv_groups(self) -> int:
        """g: key/value heads (attn_heads unless the model states kv_heads)."""
        return self.attn_heads if self.kv_heads is None else self.kv_heads

    @property
    def gated(self) -> bool:
        return self.mlp in GATED_MLPS

    @property
    def attn_width(self) -> int:
        """a·d: total width of the query heads (Q and the output projection have this many columns)."""
        return self.attn_heads * self.attn_size

    @property
    def kv_width(self) -> int:
        """g·d: width of K (and of V)."""
        return self.kv_groups * self.attn_size

    @property
    def mlp_matrices(self) -> int:
        """h × f matrices of the MLP: 3 when gated (gate, up, down), else 2 (up, down)."""
        return 3 if self.gated else 2

    # ---- parameter counts (the weights of one block, and of the whole model) ----
    @property
    def block_weight_params(self) -> int:
        """Matrix parameters of one block: Q (h·a·d), K and V (2·h·g·d), output projection
        (a·d·h), MLP (2 or 3 · h·f)."""
        return (2 * self.hidden * self.attn_width + 2 * self.hidden * self.kv_width
                + self.mlp_matrices * self.hidden * self.feedforward)

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over h: scale and shift (layer norm), scale only (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    @property
    def block_vector_params(self) -> int:
        """Biases and norm parameters of one block: QKV bias a·d + 2·g·d, projection bias h,
        MLP biases (f or 2·f) + h, two norms."""
        qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        biases = (self.attn_width + 2 * self.kv_width if qkv_bias else 0)
        if self.bias:
            biases += self.hidden + (self.mlp_matrices - 1) * self.feedforward + self.hidden
        return biases + 2 * self.norm_params

    @property
    def block_params(self) -> int:
        return self.block_weight_params + self.block_vector_params

    @property
    def embedding_params(self) -> int:
        """The first stage's input layers: token embedding V·h, plus learned positions s·h."""
        return self.vocab_size * self.hidden + (self.seq_size * self.hidden if self.position == "learned" else 0)

    @property
    def output_params(self) -> int:
        """The last stage's final norm and output layer: V·h of its own unless tied (Megatron
        then keeps a copy of the embedding on the last stage, not counted as a parameter)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab_size * self.hidden)

    @property
    def total_params(self) -> int:
        return self.num_blocks * self.block_params + self.embedding_params + self.output_params

    # ---- model FLOPs (the MFU numerator), stated once ----
    def model_flops(self) -> "ModelFlops":
        """Training FLOP per token without recomputation, as Megatron-LM and NeMo count them."""
        s, L = self.seq_size, self.num_blocks
        matrix_params = L * self.block_weight_params + self.hidden * self.vocab_size
        # scores Q·Kᵀ and context ·V: 2·s·a·d FLOP per token each, forward, per block
        attention_fwd = 2 * 2 * s * self.attn_width * L
        return ModelFlops(matrix_params=matrix_params, matrix_per_token=6.0 * matrix_params,
                          attention_per_token=3.0 * attention_fwd, seq_size=s)

    def model_flops_per_sample(self) -> float:
        """Training FLOP per sequence with no recomputation (the MFU numerator): see ModelFlops."""
        return self.model_flops().per_sequence


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOP per token, the convention of Megatron-LM (Narayanan et al. 2021, eq. 3) and
    NeMo's benchmark tables: 3 passes (forward, activation gradient, weight gradient) × 2 FLOP
    per multiply-add over every matrix — the blocks' weights and the output layer (6 × those
    parameters per token) — plus the attention scores Q·Kᵀ and context ·V (2·s·a·d each per
    token, forward). Causal masking does NOT halve the attention terms here: the published
    MFU figures count the full s×s product, so these numbers compare with theirs (a causal
    kernel skips about half of that work: the attention terms × 1/2 is the useful FLOP).
    Element-wise work (norms, softmax, activations, the loss) is not counted."""

    matrix_params: int          # parameters in matrix multiplies (blocks + output layer)
    matrix_per_token: float     # 6 × matrix_params
    attention_per_token: float  # 3 × 2 × 2·s·a·d × L (full, not halved by the causal mask)
    seq_size: int

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


def check_positive_int(value: object, field: str) -> int:
    """For values given on the command line: a whole positive number or an InputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{field}: {value!r} is not a positive whole number")
    return value
