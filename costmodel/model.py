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

import numpy as np
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


def _boolean(value: object) -> object:
    """A boolean as written in a file: JSON's true/false (YAML's yes/no/on/off read as those).
    A string is not one, "false" included (lax pydantic would read "false" as False, Python's
    bool("false") as True: the readings disagree, so neither is taken), nor is a number."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        raise ValueError("a string, not a valid boolean (write true or false without quotes)")
    if isinstance(value, (int, float, np.number)):
        raise ValueError("a number, not a valid boolean (write true or false)")
    return value  # anything else (a list, a mapping) fails as "a valid boolean" below


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
"""An int field of an input file (a size, a count, an index)."""

RealNumber = Annotated[float, BeforeValidator(_real_number)]
"""A float field of an input file; finite (every input model sets allow_inf_nan=False)."""

Boolean = Annotated[bool, BeforeValidator(_boolean)]
"""A bool field of an input file: true or false, never a string or a number."""


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
    """A decoder-only transformer: `num_blocks` blocks of attention + MLP; in a mixture-of-experts
    model every `moe_every`-th block replaces its MLP by `num_experts` routed experts (and
    optional shared experts).

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
    tied_embeddings: Boolean = Field(True, description="The output layer shares the token embedding's weights.")
    bias: Boolean = Field(True, description="Linear layers and norms carry biases (Llama-class models have none).")
    qkv_bias: Boolean | None = Field(None, description="Biases on the Q, K, V projections only (Qwen2); "
                                                    "default: as `bias`.")
    # ---- mixture of experts (all 0 / off for a dense model) ----
    num_experts: Annotated[WholeNumber, within(limits.NUM_EXPERTS)] = Field(
        0, ge=0, description="Routed experts in each mixture-of-experts (MoE) block, E; 0 = a dense model.")
    experts_per_token: Annotated[WholeNumber, within(limits.EXPERTS_PER_TOKEN)] = Field(
        0, ge=0, description="Experts each token is routed to (top-k), k: 1 <= k <= E; 0 for a dense model.")
    expert_feedforward: Annotated[WholeNumber, within(limits.EXPERT_FEEDFORWARD)] = Field(
        0, ge=0, description="Intermediate width of one routed expert's MLP, f_e (Hugging Face's "
                             "moe_intermediate_size; Mixtral's intermediate_size); 0 for a dense model.")
    shared_experts: Annotated[WholeNumber, within(limits.SHARED_EXPERTS)] = Field(
        0, ge=0, description="Always-active experts in each MoE block, each an MLP of shared_expert_feedforward on "
                             "every token (DeepSeek's n_shared_experts; Qwen2-MoE has one).")
    shared_expert_feedforward: Annotated[WholeNumber, within(limits.EXPERT_FEEDFORWARD)] = Field(
        0, ge=0, description="Intermediate width of one shared expert, f_s (Hugging Face's "
                             "shared_expert_intermediate_size).")
    shared_expert_gate: Boolean = Field(False, description="A sigmoid gate, an h × 1 matrix, scales the shared experts' "
                                                        "output (Qwen2-MoE).")
    moe_every: Annotated[WholeNumber, within(limits.MOE_EVERY)] = Field(
        1, gt=0, description="Block i (counted from 1) has experts when i is a multiple of moe_every (Hugging Face's "
                             "decoder_sparse_step); the others have the dense MLP of `feedforward`. 1 = every block.")

    @model_validator(mode="after")
    def _heads_group(self) -> "Model":
        if self.kv_heads is not None and self.attn_heads % self.kv_heads:
            raise ValueError(f"kv_heads({self.kv_heads}) does not divide attn_heads({self.attn_heads}): "
                             f"each key/value head serves a whole group of query heads")
        return self

    @model_validator(mode="after")
    def _experts(self) -> "Model":
        if self.num_experts == 0:
            given = [f"{name}({value})" for name, value in (
                ("experts_per_token", self.experts_per_token), ("expert_feedforward", self.expert_feedforward),
                ("shared_experts", self.shared_experts), ("shared_expert_feedforward", self.shared_expert_feedforward),
                ("shared_expert_gate", self.shared_expert_gate)) if value]
            given += [f"moe_every({self.moe_every})"] if self.moe_every != 1 else []
            if given:
                raise ValueError(f"{', '.join(given)} given with num_experts(0), a dense model: give num_experts too")
            return self
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token({self.experts_per_token}) must be 1 to "
                             f"num_experts({self.num_experts}): each token goes to k of the E experts")
        if self.expert_feedforward == 0:
            raise ValueError(f"expert_feedforward(0) with num_experts({self.num_experts}): give each expert's "
                             f"intermediate width")
        if (self.shared_experts == 0) != (self.shared_expert_feedforward == 0):
            raise ValueError(f"shared_experts({self.shared_experts}) with shared_expert_feedforward"
                             f"({self.shared_expert_feedforward}): give both or neither")
        if self.shared_expert_gate and self.shared_experts == 0:
            raise ValueError("shared_expert_gate(True) with shared_experts(0): there is no shared expert to gate")
        if self.moe_every > self.num_blocks:
            raise ValueError(f"moe_every({self.moe_every}) > num_blocks({self.num_blocks}): no block would have "
                             f"experts")
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
    def attention_weight_params(self) -> int:
        """Matrix parameters of one block's attention: Q (h·a·d), K and V (2·h·g·d), output
        projection (a·d·h)."""
        return 2 * self.hidden * self.attn_width + 2 * self.hidden * self.kv_width

    @property
    def block_weight_params(self) -> int:
        """Matrix parameters of one dense block: attention and the MLP (2 or 3 · h·f)."""
        return self.attention_weight_params + self.mlp_matrices * self.hidden * self.feedforward

    @property
    def norm_params(self) -> int:
        """Parameters of one norm over h: scale and shift (layer norm), scale only (RMSNorm)."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def _mlp_bias_params(self, width: int) -> int:
        """With `bias`, the biases of one MLP of intermediate `width`: width (gated 2·width) + h."""
        return (self.mlp_matrices - 1) * width + self.hidden if self.bias else 0

    @property
    def attention_vector_params(self) -> int:
        """Biases and norms of one block outside its MLP: QKV bias a·d + 2·g·d, projection bias h,
        two norms."""
        qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        biases = (self.attn_width + 2 * self.kv_width if qkv_bias else 0) + (self.hidden if self.bias else 0)
        return biases + 2 * self.norm_params

    @property
    def block_vector_params(self) -> int:
        """Biases and norm parameters of one dense block: QKV bias a·d + 2·g·d, projection bias h,
        MLP biases (f or 2·f) + h, two norms."""
        return self.attention_vector_params + self._mlp_bias_params(self.feedforward)

    @property
    def block_params(self) -> int:
        """Parameters of one dense block (a mixture-of-experts block: `moe_block_params`)."""
        return self.block_weight_params + self.block_vector_params

    # ---- mixture of experts: which blocks, and the parameters of one MoE block ----
    @property
    def moe_blocks(self) -> int:
        """Blocks with experts: ⌊L / moe_every⌋ (blocks moe_every, 2·moe_every, ... counted from 1)."""
        return self.num_blocks // self.moe_every if self.num_experts else 0

    @property
    def dense_blocks(self) -> int:
        return self.num_blocks - self.moe_blocks

    @property
    def expert_weight_params(self) -> int:
        """Matrix parameters of one routed expert: 2 or 3 · h·f_e."""
        return self.mlp_matrices * self.hidden * self.expert_feedforward

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: its matrices and, with `bias`, its biases."""
        return self.expert_weight_params + self._mlp_bias_params(self.expert_feedforward)

    @property
    def routed_expert_params(self) -> int:
        """Parameters of the E routed experts of one MoE block (what expert parallelism splits)."""
        return self.num_experts * self.expert_params

    @property
    def shared_expert_weight_params(self) -> int:
        """Matrix parameters of one MoE block's shared experts: shared_experts · (2 or 3) · h·f_s."""
        return self.shared_experts * self.mlp_matrices * self.hidden * self.shared_expert_feedforward

    @property
    def shared_expert_params(self) -> int:
        """Parameters of one MoE block's shared experts (split like a dense MLP)."""
        return self.shared_expert_weight_params + self.shared_experts * self._mlp_bias_params(
            self.shared_expert_feedforward)

    @property
    def router_params(self) -> int:
        """The router of one MoE block, an h × E matrix, and the h × 1 shared-expert gate if any
        (replicated on every GPU of a tensor-parallel group, as Megatron-LM keeps it)."""
        return self.hidden * (self.num_experts + (1 if self.shared_expert_gate else 0))

    @property
    def moe_block_params(self) -> int:
        """Parameters of one MoE block: attention, its biases and norms, router, shared and
        routed experts."""
        return (self.attention_weight_params + self.attention_vector_params + self.router_params
                + self.shared_expert_params + self.routed_expert_params)

    @property
    def moe_block_active_params(self) -> int:
        """Parameters one token uses in an MoE block: as `moe_block_params` with k of the E experts."""
        return (self.moe_block_params - self.routed_expert_params
                + self.experts_per_token * self.expert_params)

    @property
    def moe_block_active_weight_params(self) -> int:
        """Matrix parameters one token multiplies by in an MoE block: attention, router, shared
        experts, k routed experts."""
        return (self.attention_weight_params + self.router_params + self.shared_expert_weight_params
                + self.experts_per_token * self.expert_weight_params)

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
        blocks = self.dense_blocks * self.block_params + self.moe_blocks * self.moe_block_params
        return blocks + self.embedding_params + self.output_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: every one of a dense model; in MoE blocks the router, the
        shared experts and k of the E routed experts (the "active" count model cards quote,
        embeddings and output layer included)."""
        blocks = self.dense_blocks * self.block_params + self.moe_blocks * self.moe_block_active_params
        return blocks + self.embedding_params + self.output_params

    # ---- model FLOPs (the MFU numerator), stated once ----
    def model_flops(self) -> "ModelFlops":
        """Training FLOP per token without recomputation, as Megatron-LM and NeMo count them, on
        the matrix parameters a token uses (a mixture-of-experts block: router, shared experts
        and k routed experts)."""
        s, L = self.seq_size, self.num_blocks
        matrix_params = (self.dense_blocks * self.block_weight_params
                         + self.moe_blocks * self.moe_block_active_weight_params + self.hidden * self.vocab_size)
        # scores Q·Kᵀ and context ·V: 2·s·a·d FLOP per token each, forward, per block, of which a
        # causal mask leaves half (CAUSAL_ATTENTION_SHARE)
        attention_fwd = 2 * 2 * s * self.attn_width * L
        return ModelFlops(matrix_params=matrix_params, matrix_per_token=6.0 * matrix_params,
                          attention_per_token=3.0 * attention_fwd * CAUSAL_ATTENTION_SHARE, seq_size=s,
                          sparse=self.moe_blocks > 0)

    def model_flops_per_sample(self) -> float:
        """Training FLOP per sequence with no recomputation (the MFU numerator): see ModelFlops."""
        return self.model_flops().per_sequence


CAUSAL_ATTENTION_SHARE = 0.5
"""The share of the s×s attention products a causal mask leaves (s(s+1)/2 of s² pairs), as published
tables count it: Megatron-Bridge's flop_utils.py ("a·d·s/2 · 2"); Megatron-LM 2021 and Calculon count all."""


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOP per token, the convention of Megatron-LM (Narayanan et al. 2021, eq. 3) and
    NeMo's benchmark tables: 3 passes (forward, activation gradient, weight gradient) × 2 FLOP
    per multiply-add over every matrix a token uses — the blocks' weights (in a
    mixture-of-experts block the router, the shared experts and k of the E routed experts: MFU
    is stated on active parameters) and the output layer (6 × those parameters per token) —
    plus the attention scores Q·Kᵀ and context ·V (2·s·a·d each per token, forward), halved for the
    causal mask (CAUSAL_ATTENTION_SHARE) as published tables count them (Megatron-Bridge's
    flop_utils.py; the full s×s product would inflate MFU at long sequences: 72.6 % instead of
    ~47 % for Llama 3.1 70B at 131K tokens). Element-wise work (norms, softmax, activations, the
    loss) is not counted."""

    matrix_params: int          # parameters in matrix multiplies a token uses (blocks + output layer)
    matrix_per_token: float     # 6 × matrix_params
    attention_per_token: float  # 3 × 2 × 2·s·a·d × L × 1/2 (halved by the causal mask)
    seq_size: int
    sparse: bool = False        # a mixture-of-experts model: matrix_params are its active ones

    @property
    def per_token(self) -> float:
        return self.matrix_per_token + self.attention_per_token

    @property
    def per_sequence(self) -> float:
        return self.per_token * self.seq_size

    @property
    def full_attention_per_token(self) -> float:
        """The attention terms without the causal halving: the full s×s product (Calculon's count)."""
        return self.attention_per_token / CAUSAL_ATTENTION_SHARE


def check_positive_int(value: object, field: str) -> int:
    """For values given on the command line: a whole positive number or an InputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{field}: {value!r} is not a positive whole number")
    return value
