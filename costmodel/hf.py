"""A Hugging Face `config.json` as a model file.

Recognised by its `model_type`; each supported type's fields are read into a Model (the
field names and defaults are those of the model's configuration class in Hugging Face
Transformers: LlamaConfig, MistralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig,
NemotronConfig, and the mixture-of-experts MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig). The training sequence length is not in such a file
(`max_position_embeddings` is the context the model supports), so it is given beside it.

Every field read is declared in a typed schema of its model_type (`SCHEMAS`), so a value of
the wrong type is a one-line error naming the field — a size written "4096", a boolean
written "false" (a string is not a JSON boolean, whatever it says), 0 attention heads — and
never a TypeError deep inside. Fields no reader uses are ignored: a config.json carries
dozens. A field given as null is as if absent (its Transformers default), as Transformers
reads it.

A field that would change the answer but is not modelled is reported as an
UnmodelledFieldWarning naming it (the command line prints one line on stderr), never
dropped in silence. Routing details that change the numerics but not the work
(`norm_topk_prob`, `router_aux_loss_coef`, `router_jitter_noise`, `output_router_logits`)
are read as nothing: they cost a few element-wise operations on k or E values per token.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

import costmodel.limits as limits
from costmodel.errors import InputError, shown
from costmodel.limits import Bound
from costmodel.model import Boolean, RealNumber, WholeNumber, within


class UnmodelledFieldWarning(UserWarning):
    """A field of a model file that would change the answer but is not modelled."""


# hidden_act values, as Transformers' ACT2FN names them, read as one element-wise activation.
_GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate"}
_SILU = {"silu", "swish"}
_SQUARED_RELU = {"relu2"}

# ---- the field types: a whole number within a bound of costmodel.limits, or null (absent)
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


class HFConfig(BaseModel):
    """The fields every supported model_type may read (and those named in warnings)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

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


class _QwenExperts(BaseModel):
    decoder_sparse_step: Annotated[WholeNumber, AfterValidator(_at_least_one), within(limits.MOE_EVERY)] | None = None
    mlp_only_layers: LayerIndices | None = None
    num_experts_per_tok: ExpertsPerToken = None
    moe_intermediate_size: ExpertFeedforward = None


class Qwen2MoeConfig(Qwen2Config, _QwenExperts):
    shared_expert_intermediate_size: ExpertFeedforward = None


class Qwen3MoeConfig(MistralConfig, _QwenExperts):
    pass


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


def _get(config: HFConfig, source: str, field: str, default: Any = ...) -> Any:
    value = getattr(config, field)
    if value is not None:
        return value
    if default is ...:
        raise InputError(f"{source}: missing field '{field}' (a {config.model_type} config.json states it)")
    return default


def _activation(config: HFConfig, source: str, field: str, default: str, gated: bool) -> str:
    act = _get(config, source, field, default)
    if gated and act in _SILU:
        return "swiglu"
    if gated and act in _GELU:
        return "geglu"
    if not gated and act in _GELU:
        return "gelu"
    if not gated and act in _SQUARED_RELU:
        return "squared_relu"
    kind = "gated (silu, gelu)" if gated else "gelu or relu2"
    raise InputError(f"{source}: field '{field}' {shown(act)} is not modelled for model_type "
                     f"{config.model_type!r} (supported: {kind})")


def _llama_like(config: _Attention, source: str) -> dict:
    """llama, mistral, qwen2 (and the attention of mixtral, qwen2_moe, qwen3_moe): RMSNorm, RoPE,
    a gated MLP, grouped-query attention."""
    heads = _get(config, source, "num_attention_heads")
    hidden = _get(config, source, "hidden_size")
    if isinstance(config, Qwen2Config):
        qkv_bias = _get(config, source, "qkv_bias", True)    # Qwen2MoeConfig's field; Qwen2 always
    else:
        qkv_bias = _get(config, source, "attention_bias", False)
    mlp_bias = _get(config, source, "mlp_bias", False) if config.model_type == "llama" else False
    if config.model_type == "llama" and qkv_bias != mlp_bias:
        raise InputError(f"{source}: attention_bias {qkv_bias} with mlp_bias {mlp_bias} is not modelled "
                         f"(the model's biases are all on or all off, or on Q, K, V only)")
    return {
        "hidden": hidden, "feedforward": _get(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": _get(config, source, "num_key_value_heads", heads),
        "attn_size": _get(config, source, "head_dim", hidden // heads),
        "num_blocks": _get(config, source, "num_hidden_layers"), "vocab_size": _get(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "silu", gated=True), "norm": "rmsnorm", "position": "rope",
        "tied_embeddings": _get(config, source, "tie_word_embeddings", False),
        "bias": mlp_bias, "qkv_bias": qkv_bias,
    }


def _mixtral(config: MixtralConfig, source: str) -> dict:
    """mixtral: Mistral's attention; every block's MLP is num_local_experts experts of
    intermediate_size, num_experts_per_tok of them per token (no shared expert)."""
    fields = _llama_like(config, source)
    return {**fields, "num_experts": _get(config, source, "num_local_experts"),
            "experts_per_token": _get(config, source, "num_experts_per_tok"),
            "expert_feedforward": fields["feedforward"]}


def _qwen_moe(config: Qwen2MoeConfig | Qwen3MoeConfig, source: str) -> dict:
    """qwen2_moe, qwen3_moe: block i (from 0) is sparse when (i + 1) % decoder_sparse_step == 0 and i
    is not in mlp_only_layers (Transformers' Qwen2MoeDecoderLayer); a sparse block has
    num_experts experts of moe_intermediate_size, and in qwen2_moe one shared expert of
    shared_expert_intermediate_size with a sigmoid gate; the other blocks a dense MLP of
    intermediate_size."""
    fields = _llama_like(config, source)
    experts = _get(config, source, "num_experts")
    step = _get(config, source, "decoder_sparse_step", 1)
    dense_only = _get(config, source, "mlp_only_layers", [])
    sparse = [i for i in range(fields["num_blocks"]) if (i + 1) % step == 0] if experts else []
    if not sparse:
        return fields                      # no sparse block: a dense model
    overridden = sorted(set(sparse) & set(dense_only))
    if overridden:
        raise InputError(f"{source}: mlp_only_layers {shown(dense_only)} makes layers {shown(overridden)} dense "
                         f"among those decoder_sparse_step {step} makes sparse: not modelled (expert blocks are "
                         f"every decoder_sparse_step-th block)")
    moe = {"num_experts": experts, "experts_per_token": _get(config, source, "num_experts_per_tok"),
           "expert_feedforward": _get(config, source, "moe_intermediate_size"), "moe_every": step}
    shared = _get(config, source, "shared_expert_intermediate_size") if isinstance(config, Qwen2MoeConfig) else 0
    if shared:
        moe.update(shared_experts=1, shared_expert_feedforward=shared, shared_expert_gate=True)
    return {**fields, **moe}


def _gpt2(config: GPT2Config, source: str) -> dict:
    hidden = _get(config, source, "n_embd", 768)
    heads = _get(config, source, "n_head", 12)
    return {
        "hidden": hidden, "feedforward": _get(config, source, "n_inner", 4 * hidden),
        "attn_heads": heads, "attn_size": hidden // heads,
        "num_blocks": _get(config, source, "n_layer", 12), "vocab_size": _get(config, source, "vocab_size", 50257),
        "mlp": _activation(config, source, "activation_function", "gelu_new", gated=False),
        "norm": "layernorm", "position": "learned",
        "tied_embeddings": _get(config, source, "tie_word_embeddings", True), "bias": True,
    }


def _gpt_neox(config: GPTNeoXConfig, source: str) -> dict:
    hidden = _get(config, source, "hidden_size")
    heads = _get(config, source, "num_attention_heads")
    return {
        "hidden": hidden, "feedforward": _get(config, source, "intermediate_size"),
        "attn_heads": heads, "attn_size": hidden // heads,
        "num_blocks": _get(config, source, "num_hidden_layers"), "vocab_size": _get(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "gelu", gated=False), "norm": "layernorm",
        "position": "rope", "tied_embeddings": _get(config, source, "tie_word_embeddings", False),
        "bias": _get(config, source, "attention_bias", True),
    }


def _nemotron(config: NemotronConfig, source: str) -> dict:
    hidden = _get(config, source, "hidden_size")
    heads = _get(config, source, "num_attention_heads")
    qkv_bias = _get(config, source, "attention_bias", False)
    mlp_bias = _get(config, source, "mlp_bias", False)
    if qkv_bias != mlp_bias:
        raise InputError(f"{source}: attention_bias {qkv_bias} with mlp_bias {mlp_bias} is not modelled")
    return {
        "hidden": hidden, "feedforward": _get(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": _get(config, source, "num_key_value_heads", heads),
        "attn_size": _get(config, source, "head_dim", hidden // heads),
        "num_blocks": _get(config, source, "num_hidden_layers"), "vocab_size": _get(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "relu2", gated=False),
        # LayerNorm1P: a layer norm (scale and shift) whose scale is stored minus one
        "norm": "layernorm", "position": "rope",
        "tied_embeddings": _get(config, source, "tie_word_embeddings", False), "bias": mlp_bias,
    }


READERS: dict[str, tuple[type[HFConfig], Callable[[Any, str], dict]]] = {
    "llama": (LlamaConfig, _llama_like), "mistral": (MistralConfig, _llama_like), "qwen2": (Qwen2Config, _llama_like),
    "gpt2": (GPT2Config, _gpt2), "gpt_neox": (GPTNeoXConfig, _gpt_neox), "nemotron": (NemotronConfig, _nemotron),
    "mixtral": (MixtralConfig, _mixtral), "qwen2_moe": (Qwen2MoeConfig, _qwen_moe),
    "qwen3_moe": (Qwen3MoeConfig, _qwen_moe),
}
"""The supported model_types: the schema of the fields each reads, and how it reads them."""
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
"""The model_types whose experts are read into the model (others name theirs in a warning)."""


def _unmodelled(config: HFConfig, seq_size: int) -> list[str]:
    """Fields of `config` that would change the answer but are not modelled, as messages."""
    kind = config.model_type
    notes = []
    window = config.sliding_window
    uses_window = (kind in ("mistral", "mixtral")
                   or kind in ("qwen2", "qwen2_moe", "qwen3_moe") and config.use_sliding_window)
    if uses_window and window is not None and window < seq_size:
        notes.append(f"sliding_window {window} < seq_size {seq_size}: sliding-window attention is not modelled "
                     f"(the attention core is costed over the whole sequence)")
    if isinstance(config, GPTNeoXConfig) and config.use_parallel_residual is not False:
        notes.append("use_parallel_residual true: attention and MLP in parallel is not modelled "
                     "(costed as two sequential sub-layers)")
    if isinstance(config, GPT2Config) and config.add_cross_attention:
        notes.append("add_cross_attention true: cross-attention layers are not modelled")
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(config, field) and kind not in MOE_TYPES:
            notes.append(f"{field} {getattr(config, field)}: mixture-of-experts layers are not modelled")
    return notes


def is_hf_config(data: Any) -> bool:
    """A parsed model file that is a Hugging Face config.json (it names its model_type)."""
    return isinstance(data, dict) and "model_type" in data


def config_schema(data: dict, source: str) -> type[HFConfig]:
    """The schema of the parsed config.json `data`, by its model_type."""
    kind = data.get("model_type")
    if not isinstance(kind, str) or kind not in READERS:
        raise InputError(f"{source}: model_type {shown(kind)} is not supported "
                         f"(supported: {', '.join(sorted(READERS))})")
    return READERS[kind][0]


def model_fields_from_hf(config: HFConfig, source: str, *, seq_size: int | None, name: str) -> dict:
    """The Model fields of the config.json read into its schema (`config_schema`);
    `seq_size` is the training sequence."""
    if seq_size is None:
        raise InputError(f"{source}: a Hugging Face config.json does not state the training sequence length "
                         f"(max_position_embeddings is the context limit); give --seq-size (batch files: seq_size)")
    fields = READERS[config.model_type][1](config, source)
    if fields["position"] == "learned":
        limit = _get(config, source, "n_positions", 1024)
        if seq_size > limit:
            raise InputError(f"{source}: seq_size {seq_size} exceeds the learned position table "
                             f"(n_positions {limit})")
        if seq_size != limit:
            warnings.warn(f"{source}: n_positions {limit}: the learned position table is counted as "
                          f"seq_size ({seq_size}) rows", UnmodelledFieldWarning, stacklevel=2)
    for note in _unmodelled(config, seq_size):
        warnings.warn(f"{source}: {note}", UnmodelledFieldWarning, stacklevel=2)
    return {"name": name, "seq_size": seq_size, "dropout": _trains_with_dropout(config), **fields}


_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop")


def _trains_with_dropout(config: HFConfig) -> bool:
    """Whether any dropout probability the config states (or its family's Transformers default:
    GPT-2 0.1, the others 0.0) is above 0: a model trained without keeps no dropout mask."""
    default = 0.1 if config.model_type == "gpt2" else 0.0
    stated = [getattr(config, name) for name in _DROPOUT_FIELDS]
    if all(p is None for p in stated):
        return default > 0
    return any(p is not None and p > 0 for p in stated)
