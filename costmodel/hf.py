"""A Hugging Face `config.json` as a model file.

Recognised by its `model_type`; each supported type's fields are read into a Model (the
field names and defaults are those of the model's configuration class in Hugging Face
Transformers: LlamaConfig, MistralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig,
NemotronConfig, and the mixture-of-experts MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig). The training sequence length is not in such a file
(`max_position_embeddings` is the context the model supports), so it is given beside it.

A field that would change the answer but is not modelled is reported as an
UnmodelledFieldWarning naming it (the command line prints one line on stderr), never
dropped in silence. Routing details that change the numerics but not the work
(`norm_topk_prob`, `router_aux_loss_coef`, `router_jitter_noise`, `output_router_logits`)
are read as nothing: they cost a few element-wise operations on k or E values per token.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from costmodel.errors import InputError


class UnmodelledFieldWarning(UserWarning):
    """A field of a model file that would change the answer is not modelled."""


# hidden_act values, as Transformers' ACT2FN names them, read as one element-wise activation.
_GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate"}
_SILU = {"silu", "swish"}
_SQUARED_RELU = {"relu2"}


def _get(config: dict, source: str, field: str, default: Any = ...) -> Any:
    if field in config and config[field] is not None:
        return config[field]
    if default is ...:
        raise InputError(f"{source}: missing field '{field}' (a {config['model_type']} config.json states it)")
    return default


def _activation(config: dict, source: str, field: str, default: str, gated: bool) -> str:
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
    raise InputError(f"{source}: field '{field}' {act!r} is not modelled for model_type "
                     f"{config['model_type']!r} (supported: {kind})")


def _llama_like(config: dict, source: str) -> dict:
    """llama, mistral, qwen2 (and the attention of mixtral, qwen2_moe, qwen3_moe): RMSNorm, RoPE,
    a gated MLP, grouped-query attention."""
    kind = config["model_type"]
    heads = _get(config, source, "num_attention_heads")
    hidden = _get(config, source, "hidden_size")
    if kind in ("qwen2", "qwen2_moe"):
        qkv_bias = bool(_get(config, source, "qkv_bias", True))    # Qwen2MoeConfig's field; Qwen2 always
    else:
        qkv_bias = bool(_get(config, source, "attention_bias", False))
    mlp_bias = bool(_get(config, source, "mlp_bias", False)) if kind == "llama" else False
    if kind == "llama" and qkv_bias != mlp_bias:
        raise InputError(f"{source}: attention_bias {qkv_bias} with mlp_bias {mlp_bias} is not modelled "
                         f"(the model's biases are all on or all off, or on Q, K, V only)")
    return {
        "hidden": hidden, "feedforward": _get(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": _get(config, source, "num_key_value_heads", heads),
        "attn_size": _get(config, source, "head_dim", hidden // heads),
        "num_blocks": _get(config, source, "num_hidden_layers"), "vocab_size": _get(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "silu", gated=True), "norm": "rmsnorm", "position": "rope",
        "tied_embeddings": bool(_get(config, source, "tie_word_embeddings", False)),
        "bias": mlp_bias, "qkv_bias": qkv_bias,
    }


def _mixtral(config: dict, source: str) -> dict:
    """mixtral: Mistral's attention; every block's MLP is num_local_experts experts of
    intermediate_size, num_experts_per_tok of them per token (no shared expert)."""
    fields = _llama_like(config, source)
    return {**fields, "num_experts": _get(config, source, "num_local_experts"),
            "experts_per_token": _get(config, source, "num_experts_per_tok"),
            "expert_feedforward": fields["feedforward"]}


def _whole(config: dict, source: str, field: str, default: Any = ...) -> int:
    value = _get(config, source, field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{source}: field '{field}' {value!r} is not a whole number >= 0")
    return value


def _qwen_moe(config: dict, source: str) -> dict:
    """qwen2_moe, qwen3_moe: block i (from 0) is sparse when (i + 1) % decoder_sparse_step == 0 and i
    is not in mlp_only_layers (Transformers' Qwen2MoeDecoderLayer); a sparse block has
    num_experts experts of moe_intermediate_size, and in qwen2_moe one shared expert of
    shared_expert_intermediate_size with a sigmoid gate; the other blocks a dense MLP of
    intermediate_size."""
    kind = config["model_type"]
    fields = _llama_like(config, source)
    experts = _whole(config, source, "num_experts", ...)
    step = _whole(config, source, "decoder_sparse_step", 1)
    if step == 0:
        raise InputError(f"{source}: field 'decoder_sparse_step' 0 is not a whole number >= 1")
    dense_only = _get(config, source, "mlp_only_layers", [])
    if not isinstance(dense_only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in dense_only):
        raise InputError(f"{source}: field 'mlp_only_layers' {dense_only!r} is not a list of layer indices")
    sparse = [i for i in range(fields["num_blocks"]) if (i + 1) % step == 0] if experts else []
    if not sparse:
        return fields                      # no sparse block: a dense model
    overridden = sorted(set(sparse) & set(dense_only))
    if overridden:
        raise InputError(f"{source}: mlp_only_layers {dense_only} makes layers {overridden} dense among those "
                         f"decoder_sparse_step {step} makes sparse: not modelled (expert blocks are every "
                         f"decoder_sparse_step-th block)")
    moe = {"num_experts": experts, "experts_per_token": _get(config, source, "num_experts_per_tok"),
           "expert_feedforward": _get(config, source, "moe_intermediate_size"), "moe_every": step}
    shared = _whole(config, source, "shared_expert_intermediate_size", ...) if kind == "qwen2_moe" else 0
    if shared:
        moe.update(shared_experts=1, shared_expert_feedforward=shared, shared_expert_gate=True)
    return {**fields, **moe}


def _gpt2(config: dict, source: str) -> dict:
    hidden = _get(config, source, "n_embd", 768)
    return {
        "hidden": hidden, "feedforward": _get(config, source, "n_inner", 4 * hidden),
        "attn_heads": _get(config, source, "n_head", 12), "attn_size": hidden // _get(config, source, "n_head", 12),
        "num_blocks": _get(config, source, "n_layer", 12), "vocab_size": _get(config, source, "vocab_size", 50257),
        "mlp": _activation(config, source, "activation_function", "gelu_new", gated=False),
        "norm": "layernorm", "position": "learned",
        "tied_embeddings": bool(_get(config, source, "tie_word_embeddings", True)), "bias": True,
    }


def _gpt_neox(config: dict, source: str) -> dict:
    hidden = _get(config, source, "hidden_size")
    heads = _get(config, source, "num_attention_heads")
    return {
        "hidden": hidden, "feedforward": _get(config, source, "intermediate_size"),
        "attn_heads": heads, "attn_size": hidden // heads,
        "num_blocks": _get(config, source, "num_hidden_layers"), "vocab_size": _get(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "gelu", gated=False), "norm": "layernorm",
        "position": "rope", "tied_embeddings": bool(_get(config, source, "tie_word_embeddings", False)),
        "bias": bool(_get(config, source, "attention_bias", True)),
    }


def _nemotron(config: dict, source: str) -> dict:
    hidden = _get(config, source, "hidden_size")
    heads = _get(config, source, "num_attention_heads")
    qkv_bias = bool(_get(config, source, "attention_bias", False))
    mlp_bias = bool(_get(config, source, "mlp_bias", False))
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
        "tied_embeddings": bool(_get(config, source, "tie_word_embeddings", False)), "bias": mlp_bias,
    }


READERS: dict[str, Callable[[dict, str], dict]] = {
    "llama": _llama_like, "mistral": _llama_like, "qwen2": _llama_like,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "nemotron": _nemotron,
    "mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
}
"""The supported model_types and how each is read."""
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
"""The model_types whose experts are read into the model (others name theirs in a warning)."""


def _unmodelled(config: dict, seq_size: int) -> list[str]:
    """Fields of `config` that would change the answer but are not modelled, as messages."""
    kind = config["model_type"]
    notes = []
    window = config.get("sliding_window")
    uses_window = (kind in ("mistral", "mixtral")
                   or kind in ("qwen2", "qwen2_moe", "qwen3_moe") and config.get("use_sliding_window", False))
    if uses_window and window is not None and window < seq_size:
        notes.append(f"sliding_window {window} < seq_size {seq_size}: sliding-window attention is not modelled "
                     f"(the attention core is costed over the whole sequence)")
    if kind == "gpt_neox" and config.get("use_parallel_residual", True):
        notes.append("use_parallel_residual true: attention and MLP in parallel is not modelled "
                     "(costed as two sequential sub-layers)")
    if kind == "gpt2" and config.get("add_cross_attention", False):
        notes.append("add_cross_attention true: cross-attention layers are not modelled")
    for field in ("num_experts", "num_local_experts", "n_routed_experts"):
        if config.get(field) and kind not in MOE_TYPES:
            notes.append(f"{field} {config[field]}: mixture-of-experts layers are not modelled")
    return notes


def is_hf_config(data: Any) -> bool:
    """A parsed model file that is a Hugging Face config.json (it names its model_type)."""
    return isinstance(data, dict) and "model_type" in data


def model_fields_from_hf(config: dict, source: str, *, seq_size: int | None, name: str) -> dict:
    """The Model fields of the parsed config.json `config`; `seq_size` is the training sequence."""
    kind = config.get("model_type")
    if kind not in READERS:
        raise InputError(f"{source}: model_type {kind!r} is not supported (supported: {', '.join(sorted(READERS))})")
    if seq_size is None:
        raise InputError(f"{source}: a Hugging Face config.json does not state the training sequence length "
                         f"(max_position_embeddings is the context limit); give --seq-size (batch files: seq_size)")
    fields = READERS[kind](config, source)
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
    return {"name": name, "seq_size": seq_size, **fields}
