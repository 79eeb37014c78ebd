"""The typed schemas of the Hugging Face config.json fields costmodel.inputs.hf reads, one per
model_type (`costmodel.inputs.hf.READERS` pairs each with its reader): the field names and defaults
of Transformers' configuration classes, every field a whole number within a bound of
costmodel.inputs.limits, a JSON boolean, or null (absent).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.errors import InputError
from costmodel.inputs.limits import Bound
from costmodel.inputs.model import Boolean, RealNumber, WholeNumber, within

# ---- the field types: a whole number within a bound of costmodel.inputs.limits, or null (absent)
Hidden = Annotated[WholeNumber, within(limits.HIDDEN)] | None
Feedforward = Annotated[WholeNumber, within(limits.FEEDFORWARD)] | None
Heads = Annotated[WholeNumber, within(limits.ATTN_HEADS)] | None
HeadSize = Annotated[WholeNumber, within(limits.ATTN_SIZE)] | None
Blocks = Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None
Vocab = Annotated[WholeNumber, within(limits.VOCAB_SIZE)] | None
Tokens = Annotated[WholeNumber, within(limits.SEQ_SIZE)] | None
Experts = Annotated[WholeNumber, within(limits.NUM_EXPERTS)] | None
ExpertsPerToken = Annotated[WholeNumber, within(limits.EXPERTS_PER_TOKEN)] | None
ExpertFeedforward = Annotated[WholeNumber, within(limits.EXPERT_FEEDFORWARD)] | None
Probability = Annotated[RealNumber, within(limits.FRACTION)] | None
_WINDOW = Bound(0, limits.INT64_MAX, "tokens one position attends to; compared with seq_size only")
_RANK = Bound(0, limits.ATTN_SIZE.high, "a latent rank or RoPE width; 0 = none")
_LAYER = Bound(0, limits.NUM_BLOCKS.high, "a layer index, counted from 0")


def _at_least_one(value: int) -> int:
    if value < 1:
        raise ValueError("is not a whole number >= 1")
    return value


def _list_of_indices(value: object) -> object:
    if not isinstance(value, list):
        raise ValueError("is not a list of layer indices")
    return value


LayerIndices = Annotated[list[Annotated[WholeNumber, within(_LAYER)]], BeforeValidator(_list_of_indices)]
RopeFlags = Annotated[list[Annotated[WholeNumber, within(Bound(0, 1, "1: the layer applies RoPE, 0: it does not"))]],
                      BeforeValidator(_list_of_indices)]
"""Llama 4's no_rope_layers: one flag per layer."""


def config_field(config: "HFConfig", source: str, field: str, default: Any = ...) -> Any:
    """A config.json field's value, its default when the file leaves it out, or a one-line error
    naming the file and the field when it is required."""
    value = getattr(config, field)
    if value is not None:
        return value
    if default is ...:
        raise InputError(f"{source}: missing field '{field}' (a {config.model_type} config.json states it)")
    return default


class HFConfig(BaseModel):
    """The fields every supported model_type may read (and those named in warnings)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False, defer_build=True)
    # (defer_build: a run reads one model_type, so only its schema is built, when first used)

    model_type: str
    tie_word_embeddings: Boolean | None = Field(None, description="Output layer shares the embedding's weights.")
    sliding_window: Annotated[WholeNumber, within(_WINDOW)] | None = Field(
        None, description="Sliding-window attention span (named in a warning when it binds).")
    use_sliding_window: Boolean | None = Field(None, description="Qwen's switch for sliding_window.")
    num_experts: Experts = Field(None, description="Routed experts (qwen2_moe, qwen3_moe; named elsewhere).")
    num_local_experts: Experts = Field(None, description="Routed experts (mixtral; named elsewhere).")
    n_routed_experts: Experts = Field(None, description="Routed experts (DeepSeek; named in a warning).")
    # Dropout probabilities, under each family's name (Transformers' defaults: 0.1 for GPT-2's
    # *_pdrop, 0.0 for every other family's).
    attention_dropout: Probability = None
    hidden_dropout: Probability = None
    resid_pdrop: Probability = None
    attn_pdrop: Probability = None


class _Attention(HFConfig):
    """llama, mistral, qwen2 and the attention of mixtral, qwen2_moe, qwen3_moe, nemotron."""

    hidden_size: Hidden = None
    num_attention_heads: Heads = None
    num_key_value_heads: Heads = None
    head_dim: HeadSize = None
    intermediate_size: Feedforward = None
    num_hidden_layers: Blocks = None
    vocab_size: Vocab = None
    hidden_act: str | None = None


class LlamaConfig(_Attention):
    attention_bias: Boolean | None = None
    mlp_bias: Boolean | None = None


class NemotronConfig(LlamaConfig):
    pass


class MistralConfig(_Attention):
    attention_bias: Boolean | None = None


class Qwen2Config(_Attention):
    qkv_bias: Boolean | None = None


class MixtralConfig(MistralConfig):
    num_experts_per_tok: ExpertsPerToken = None


class Qwen3Config(MistralConfig):
    """Qwen3 dense: Mistral's fields, an explicit head_dim (not hidden / heads: Qwen3-32B has 64
    heads of 128 in a hidden of 5120) and an RMSNorm on each query and key head (q_norm,
    k_norm; always there, no field)."""

    use_sliding_window: Boolean | None = None


class DeepseekV3Config(_Attention):
    """deepseek_v3: multi-head latent attention, first_k_dense_replace dense blocks then MoE
    blocks of n_routed_experts routed and n_shared_experts shared experts, and
    num_nextn_predict_layers multi-token prediction modules (the hub's config.json field)."""

    attention_bias: Boolean | None = None
    q_lora_rank: Annotated[WholeNumber, within(_RANK)] | None = None
    kv_lora_rank: HeadSize = None
    qk_nope_head_dim: HeadSize = None
    qk_rope_head_dim: Annotated[WholeNumber, within(_RANK)] | None = None
    v_head_dim: HeadSize = None
    moe_intermediate_size: ExpertFeedforward = None
    n_shared_experts: Annotated[WholeNumber, within(limits.SHARED_EXPERTS)] | None = None
    num_experts_per_tok: ExpertsPerToken = None
    first_k_dense_replace: Annotated[WholeNumber, within(limits.NUM_BLOCKS_OR_NONE)] | None = None
    moe_layer_freq: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.MOE_EVERY)] | None = None
    num_nextn_predict_layers: Annotated[WholeNumber, within(limits.NUM_BLOCKS_OR_NONE)] | None = None
    n_group: Annotated[WholeNumber, within(limits.NUM_EXPERTS)] | None = None
    topk_group: Annotated[WholeNumber, within(limits.NUM_EXPERTS)] | None = None
    scoring_func: str | None = None


class RopeScaling(BaseModel):
    """rope_scaling: only its kind is read (`rope_type`, older files `type`)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)
    rope_type: str | None = None
    type: str | None = None

    @model_validator(mode="after")
    def _named(self) -> "RopeScaling":
        if self.kind is None:
            raise ValueError("rope_scaling names no rope_type (or type)")
        return self

    @property
    def kind(self) -> str | None:
        return self.rope_type or self.type


class GptOssConfig(_Attention):
    """gpt_oss: grouped-query attention with biases and sinks, layer_types alternating
    sliding_attention (sliding_window) and full_attention, every block an MoE of
    num_local_experts experts with biases and a router with a bias, no shared expert;
    rope_scaling (its kind: YaRN)."""

    attention_bias: Boolean | None = None
    num_local_experts: Experts = None
    num_experts_per_tok: ExpertsPerToken = None
    experts_per_token: ExpertsPerToken = None
    layer_types: list[str] | None = None
    rope_scaling: RopeScaling | None = None


class _QwenExperts(BaseModel):
    decoder_sparse_step: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.MOE_EVERY)] | None = None
    mlp_only_layers: LayerIndices | None = None
    num_experts_per_tok: ExpertsPerToken = None
    moe_intermediate_size: ExpertFeedforward = None


class Qwen2MoeConfig(Qwen2Config, _QwenExperts):
    shared_expert_intermediate_size: ExpertFeedforward = None


class Qwen3MoeConfig(MistralConfig, _QwenExperts):
    pass


_QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""model_types with an RMSNorm on each query and key head (Transformers' Qwen3Attention q_norm, k_norm)."""


class GPT2Config(HFConfig):
    n_embd: Hidden = None
    n_inner: Feedforward = None
    n_head: Heads = None
    n_layer: Blocks = None
    vocab_size: Vocab = None
    activation_function: str | None = None
    n_positions: Tokens = None
    add_cross_attention: Boolean | None = None


class GPTNeoXConfig(HFConfig):
    hidden_size: Hidden = None
    num_attention_heads: Heads = None
    intermediate_size: Feedforward = None
    num_hidden_layers: Blocks = None
    vocab_size: Vocab = None
    hidden_act: str | None = None
    attention_bias: Boolean | None = None
    use_parallel_residual: Boolean | None = None


class NemotronHConfig(_Attention):
    """nemotron_h (Nemotron-H, Nemotron 3): hybrid_override_pattern places Mamba-2 (M), attention
    (*), MLP (-) and MoE (E) layers; the Mamba-2 mixer's mamba_* fields; the MoE layers'
    n_routed_experts of moe_intermediate_size and a shared expert of
    moe_shared_expert_intermediate_size (NVIDIA's configuration_nemotron_h.py)."""

    hybrid_override_pattern: str | None = None
    attention_head_dim: HeadSize = None
    attention_bias: Boolean | None = None
    mlp_bias: Boolean | None = None
    mlp_hidden_act: str | None = None
    mamba_num_heads: Heads = None
    mamba_head_dim: HeadSize = None
    ssm_state_size: HeadSize = None
    n_groups: Heads = None
    conv_kernel: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.ATTN_SIZE)] | None = None
    chunk_size: Tokens = None
    use_conv_bias: Boolean | None = None
    mamba_proj_bias: Boolean | None = None
    n_routed_experts: Experts = None
    n_shared_experts: Annotated[WholeNumber, within(limits.SHARED_EXPERTS)] | None = None
    num_experts_per_tok: ExpertsPerToken = None
    moe_intermediate_size: ExpertFeedforward = None
    moe_shared_expert_intermediate_size: ExpertFeedforward = None
    moe_latent_size: HeadSize = None
    num_nextn_predict_layers: Annotated[WholeNumber, within(limits.NUM_BLOCKS_OR_NONE)] | None = None


class Gemma3TextConfig(_Attention):
    """gemma3_text (Gemma 3's text model; a gemma3 file's text_config): GeGLU, RMSNorm, an
    RMSNorm on each query and key head, tied embeddings, layer_types (or sliding_window_pattern:
    every n-th layer global) with sliding_window for the others."""

    hidden_activation: str | None = None
    attention_bias: Boolean | None = None
    sliding_window_pattern: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.NUM_BLOCKS)] | None = None
    layer_types: list[str] | None = None


class Llama4TextConfig(_Attention):
    """llama4_text (Llama 4's text model; a llama4 file's text_config): every
    interleave_moe_layer_step-th layer an MoE of num_local_experts experts of intermediate_size
    with one shared expert of the same width, the others a dense MLP of intermediate_size_mlp;
    chunked attention (attention_chunk_size) on the layers with RoPE, full attention without
    RoPE on the no_rope_layers (1 = RoPE)."""

    attention_bias: Boolean | None = None
    intermediate_size_mlp: Feedforward = None
    num_local_experts: Experts = None
    num_experts_per_tok: ExpertsPerToken = None
    interleave_moe_layer_step: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.MOE_EVERY)] | None = None
    moe_layers: LayerIndices | None = None
    attention_chunk_size: Tokens = None
    no_rope_layers: RopeFlags | None = None
    use_qk_norm: Boolean | None = None
