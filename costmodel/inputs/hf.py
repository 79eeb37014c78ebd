"""A Hugging Face `config.json` as a model file.

Recognised by its `model_type`; each supported type's fields are read into a Model (the
field names and defaults are those of the model's configuration class in Hugging Face
Transformers: LlamaConfig, MistralConfig, Qwen2Config, GPT2Config, GPTNeoXConfig,
NemotronConfig, Qwen3Config, and the mixture-of-experts MixtralConfig, Qwen2MoeConfig,
Qwen3MoeConfig, DeepseekV3Config, GptOssConfig). The training sequence length is not in such a file
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
are read as nothing: they cost a few element-wise operations on k or E values per token. The
load-balancing loss's kernels, a float32 router and the expert bias's count (Model's `router_*`
fields) are how a framework trains the model, not the file's: deepseek_v3 reads them as
Megatron-Bridge's DeepSeek-V3 bridge sets them; the other types leave them off (gpt-oss as its
bridge does; give them in a model file for a run that trains with them).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from costmodel.errors import InputError, shown
from costmodel.inputs.hf_hybrid import gemma3_text, llama4_text, nemotron_h
from costmodel.inputs.hf_schemas import (config_field, _QK_NORM_TYPES, Gemma3TextConfig, Llama4TextConfig, NemotronHConfig, DeepseekV3Config, GPT2Config, GPTNeoXConfig, GptOssConfig, HFConfig,
                                  LlamaConfig, MistralConfig, MixtralConfig, NemotronConfig, Qwen2Config, Qwen2MoeConfig,
                                  Qwen3Config, Qwen3MoeConfig, _Attention)


class UnmodelledFieldWarning(UserWarning):
    """A field of a model file that would change the answer but is not modelled."""


# hidden_act values, as Transformers' ACT2FN names them, read as one element-wise activation.
_GELU = {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate"}
_SILU = {"silu", "swish"}
_SQUARED_RELU = {"relu2"}


def _activation(config: HFConfig, source: str, field: str, default: str, gated: bool) -> str:
    act = config_field(config, source, field, default)
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
    heads = config_field(config, source, "num_attention_heads")
    hidden = config_field(config, source, "hidden_size")
    if isinstance(config, Qwen2Config):
        qkv_bias = config_field(config, source, "qkv_bias", True)    # Qwen2MoeConfig's field; Qwen2 always
    else:
        qkv_bias = config_field(config, source, "attention_bias", False)
    mlp_bias = config_field(config, source, "mlp_bias", False) if config.model_type == "llama" else False
    if config.model_type == "llama" and qkv_bias != mlp_bias:
        raise InputError(f"{source}: attention_bias {qkv_bias} with mlp_bias {mlp_bias} is not modelled "
                         f"(the model's biases are all on or all off, or on Q, K, V only)")
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": config_field(config, source, "num_key_value_heads", heads),
        "attn_size": config_field(config, source, "head_dim", hidden // heads),
        "num_blocks": config_field(config, source, "num_hidden_layers"), "vocab_size": config_field(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "silu", gated=True), "norm": "rmsnorm", "position": "rope",
        "tied_embeddings": config_field(config, source, "tie_word_embeddings", False),
        "bias": mlp_bias, "qkv_bias": qkv_bias, **({"qk_norm": True} if config.model_type in _QK_NORM_TYPES else {}),
    }


def _mixtral(config: MixtralConfig, source: str) -> dict:
    """mixtral: Mistral's attention; every block's MLP is num_local_experts experts of
    intermediate_size, num_experts_per_tok of them per token (no shared expert)."""
    fields = _llama_like(config, source)
    return {**fields, "num_experts": config_field(config, source, "num_local_experts"),
            "experts_per_token": config_field(config, source, "num_experts_per_tok"),
            "expert_feedforward": fields["feedforward"]}


def _qwen_moe(config: Qwen2MoeConfig | Qwen3MoeConfig, source: str) -> dict:
    """qwen2_moe, qwen3_moe: block i (from 0) is sparse when (i + 1) % decoder_sparse_step == 0 and i
    is not in mlp_only_layers (Transformers' Qwen2MoeDecoderLayer); a sparse block has
    num_experts experts of moe_intermediate_size, and in qwen2_moe one shared expert of
    shared_expert_intermediate_size with a sigmoid gate; the other blocks a dense MLP of
    intermediate_size."""
    fields = _llama_like(config, source)
    experts = config_field(config, source, "num_experts")
    step = config_field(config, source, "decoder_sparse_step", 1)
    dense_only = config_field(config, source, "mlp_only_layers", [])
    layers = fields["num_blocks"]
    past = sorted(i for i in set(dense_only) if i >= layers)
    if past:
        raise InputError(f"{source}: mlp_only_layers {shown(past)} past the last layer ({layers - 1}; "
                         f"num_hidden_layers {layers}, counted from 0)")
    if experts and step > layers:
        raise InputError(f"{source}: decoder_sparse_step {step} > num_hidden_layers {layers}: no layer would have "
                         f"the num_experts {experts} experts")
    sparse = [i for i in range(layers) if (i + 1) % step == 0] if experts else []
    if not sparse:
        return fields                      # no sparse block: a dense model
    overridden = sorted(set(sparse) & set(dense_only))
    if overridden:
        raise InputError(f"{source}: mlp_only_layers {shown(dense_only)} makes layers {shown(overridden)} dense "
                         f"among those decoder_sparse_step {step} makes sparse: not modelled (expert blocks are "
                         f"every decoder_sparse_step-th block)")
    moe = {"num_experts": experts, "experts_per_token": config_field(config, source, "num_experts_per_tok"),
           "expert_feedforward": config_field(config, source, "moe_intermediate_size"), "moe_every": step}
    shared = config_field(config, source, "shared_expert_intermediate_size") if isinstance(config, Qwen2MoeConfig) else 0
    if shared:
        moe.update(shared_experts=1, shared_expert_feedforward=shared, shared_expert_gate=True)
    return {**fields, **moe}


def _gpt2(config: GPT2Config, source: str) -> dict:
    hidden = config_field(config, source, "n_embd", 768)
    heads = config_field(config, source, "n_head", 12)
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "n_inner", 4 * hidden),
        "attn_heads": heads, "attn_size": hidden // heads,
        "num_blocks": config_field(config, source, "n_layer", 12), "vocab_size": config_field(config, source, "vocab_size", 50257),
        "mlp": _activation(config, source, "activation_function", "gelu_new", gated=False),
        "norm": "layernorm", "position": "learned",
        "tied_embeddings": config_field(config, source, "tie_word_embeddings", True), "bias": True,
    }


def _gpt_neox(config: GPTNeoXConfig, source: str) -> dict:
    hidden = config_field(config, source, "hidden_size")
    heads = config_field(config, source, "num_attention_heads")
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size"),
        "attn_heads": heads, "attn_size": hidden // heads,
        "num_blocks": config_field(config, source, "num_hidden_layers"), "vocab_size": config_field(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "gelu", gated=False), "norm": "layernorm",
        "position": "rope", "tied_embeddings": config_field(config, source, "tie_word_embeddings", False),
        "bias": config_field(config, source, "attention_bias", True),
    }


def _nemotron(config: NemotronConfig, source: str) -> dict:
    hidden = config_field(config, source, "hidden_size")
    heads = config_field(config, source, "num_attention_heads")
    qkv_bias = config_field(config, source, "attention_bias", False)
    mlp_bias = config_field(config, source, "mlp_bias", False)
    if qkv_bias != mlp_bias:
        raise InputError(f"{source}: attention_bias {qkv_bias} with mlp_bias {mlp_bias} is not modelled")
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": config_field(config, source, "num_key_value_heads", heads),
        "attn_size": config_field(config, source, "head_dim", hidden // heads),
        "num_blocks": config_field(config, source, "num_hidden_layers"), "vocab_size": config_field(config, source, "vocab_size"),
        "mlp": _activation(config, source, "hidden_act", "relu2", gated=False),
        # LayerNorm1P: a layer norm (scale and shift) whose scale is stored minus one
        "norm": "layernorm", "position": "rope",
        "tied_embeddings": config_field(config, source, "tie_word_embeddings", False), "bias": mlp_bias,
    }


def _deepseek_v3(config: DeepseekV3Config, source: str) -> dict:
    """deepseek_v3 (Transformers' DeepseekV3Config defaults): latent attention; block i (from 0)
    is an MoE block when i >= first_k_dense_replace and i % moe_layer_freq == 0; the MoE has
    n_routed_experts of moe_intermediate_size, top num_experts_per_tok, and n_shared_experts of
    the same width (Megatron-Bridge's shared size moe_intermediate_size · n_shared_experts).
    Read and not modelled, as they change which experts a token meets, not the work:
    scoring_func (sigmoid: a few element-wise operations per score, as softmax), n_group and
    topk_group (group-limited routing), routed_scaling_factor, norm_topk_prob. The router's
    e_score_correction_bias is a buffer updated by a rule, not a trained parameter: not counted.
    The router is trained as Megatron-Bridge's DeepSeek-V3 bridge sets it for every deepseek_v3
    config (src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py, v0.4.0 l.63-69, v0.6.0
    l.68-75): seq_aux_loss (coefficient 1e-4), float32 router, the expert bias (`router_*` fields)."""
    heads = config_field(config, source, "num_attention_heads", 128)
    if config_field(config, source, "attention_bias", False):
        raise InputError(f"{source}: attention_bias true with latent attention is not modelled")
    step = config_field(config, source, "moe_layer_freq", 1)
    if step != 1:
        raise InputError(f"{source}: moe_layer_freq {step} is not modelled (every block after "
                         f"first_k_dense_replace has experts)")
    # q_lora_rank null (DeepSeek-V2-Lite) projects queries from h directly; absent, the default
    q_rank = 0 if "q_lora_rank" in config.model_fields_set and config.q_lora_rank is None else 1536
    mla = {"q_lora_rank": config_field(config, source, "q_lora_rank", q_rank), "kv_lora_rank": config_field(config, source, "kv_lora_rank", 512),
           "qk_nope_head_dim": config_field(config, source, "qk_nope_head_dim", 128),
           "qk_rope_head_dim": config_field(config, source, "qk_rope_head_dim", 64),
           "v_head_dim": config_field(config, source, "v_head_dim", 128)}
    blocks, dense = config_field(config, source, "num_hidden_layers", 61), config_field(config, source, "first_k_dense_replace", 3)
    if dense >= blocks:
        raise InputError(f"{source}: first_k_dense_replace {dense} with num_hidden_layers {blocks}: no block would "
                         f"have experts (the first {dense} are dense)")
    shared = config_field(config, source, "n_shared_experts", 1)
    width = config_field(config, source, "moe_intermediate_size", 2048)
    experts = config_field(config, source, "n_routed_experts", 256)
    return {
        "hidden": config_field(config, source, "hidden_size", 7168), "feedforward": config_field(config, source, "intermediate_size", 18432),
        "attn_heads": heads, "attn_size": mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"], "latent_attention": mla,
        "num_blocks": blocks, "vocab_size": config_field(config, source, "vocab_size", 129280),
        "mlp": _activation(config, source, "hidden_act", "silu", gated=True), "norm": "rmsnorm", "position": "rope",
        "tied_embeddings": config_field(config, source, "tie_word_embeddings", False), "bias": False,
        "num_experts": experts, "experts_per_token": config_field(config, source, "num_experts_per_tok", 8),
        "expert_feedforward": width, "first_dense_blocks": dense,
        **({"shared_experts": shared, "shared_expert_feedforward": width} if shared else {}),
        "mtp_blocks": config_field(config, source, "num_nextn_predict_layers", 0),
        "router_load_balancing": "seq_aux_loss", "router_fp32": True, "router_expert_bias": True,
    }


def _gpt_oss(config: GptOssConfig, source: str) -> dict:
    """gpt_oss (Transformers' GptOssConfig): every block an MoE of num_local_experts experts of
    intermediate_size (top experts_per_token), biases on Q, K, V, the output projection, the
    experts and the router, one learned sink logit per head, and the blocks whose layer_types
    entry is sliding_attention attend over sliding_window tokens (default: the even-numbered
    blocks, Transformers' default layer_types). Its SwiGLU variant (x·σ(1.702·x)·(y + 1),
    clamped at swiglu_limit) costs the FLOP of a SwiGLU: read as one, clamped
    (`clamped_activation`: every gpt-oss config clamps, Transformers' default limit is 7.0);
    rope_scaling of rope_type yarn is `yarn_rope`."""
    fields = _llama_like(config, source)
    blocks = fields["num_blocks"]
    kinds = config_field(config, source, "layer_types", ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                 for i in range(blocks)])
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if len(kinds) != blocks or unknown:
        raise InputError(f"{source}: field 'layer_types' must list sliding_attention or full_attention for each of "
                         f"the {blocks} layers (got {len(kinds)} entries{', unknown ' + shown(unknown) if unknown else ''})")
    window_blocks = kinds.count("sliding_attention")
    bias = config_field(config, source, "attention_bias", True)
    per_token = config_field(config, source, "num_experts_per_tok", None)
    scaling = config_field(config, source, "rope_scaling", None)
    return {**fields, "bias": bias, "qkv_bias": bias, "attention_sinks": True, "router_bias": True,
            "yarn_rope": scaling is not None and scaling.kind == "yarn",
            "clamped_activation": True,
            "num_experts": config_field(config, source, "num_local_experts", 128),
            "experts_per_token": per_token if per_token is not None else config_field(config, source, "experts_per_token", 4),
            "expert_feedforward": fields["feedforward"],
            **({"sliding_window": config_field(config, source, "sliding_window", 128), "sliding_window_blocks": window_blocks}
               if window_blocks else {})}


READERS: dict[str, tuple[type[HFConfig], Callable[[Any, str], dict]]] = {
    "llama": (LlamaConfig, _llama_like), "mistral": (MistralConfig, _llama_like), "qwen2": (Qwen2Config, _llama_like),
    "gpt2": (GPT2Config, _gpt2), "gpt_neox": (GPTNeoXConfig, _gpt_neox), "nemotron": (NemotronConfig, _nemotron),
    "mixtral": (MixtralConfig, _mixtral), "qwen2_moe": (Qwen2MoeConfig, _qwen_moe),
    "qwen3_moe": (Qwen3MoeConfig, _qwen_moe), "qwen3": (Qwen3Config, _llama_like),
    "deepseek_v3": (DeepseekV3Config, _deepseek_v3), "gpt_oss": (GptOssConfig, _gpt_oss),
    "nemotron_h": (NemotronHConfig, nemotron_h), "gemma3_text": (Gemma3TextConfig, gemma3_text),
    "llama4_text": (Llama4TextConfig, llama4_text),
}
"""The supported model_types: the schema of the fields each reads, and how it reads them."""
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "nemotron_h", "llama4_text")
"""The model_types whose experts are read into the model (others name theirs in a warning)."""


_WINDOWED_TYPES = ("mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text")
"""The model_types whose Transformers class reads sliding_window (the others ignore the field)."""


def _window_read_or_refused(config: HFConfig, source: str, seq_size: int) -> None:
    """A sliding_window shorter than the sequence on a model_type whose Transformers class
    ignores the field (a Gemma 3 written as llama): refused, never dropped unsaid."""
    window = config.sliding_window
    if config.model_type not in _WINDOWED_TYPES and window is not None and window < seq_size:
        raise InputError(f"{source}: sliding_window {window} with model_type {config.model_type}, whose "
                         f"Transformers class has no sliding-window attention: remove it, or write a model file "
                         f"with sliding_window (and sliding_window_blocks)")


def _unmodelled(config: HFConfig, seq_size: int) -> list[str]:
    """Fields of `config` that would change the answer but are not modelled, as messages."""
    kind = config.model_type
    notes = []
    window = config.sliding_window
    uses_window = (kind in ("mistral", "mixtral")
                   or kind in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and config.use_sliding_window)
    if uses_window and window is not None and window < seq_size:
        notes.append(f"sliding_window {window} < seq_size {seq_size}: sliding-window attention is not modelled "
                     f"(the attention core is costed over the whole sequence)")
    if isinstance(config, GPTNeoXConfig) and config.use_parallel_residual is not False:
        notes.append("use_parallel_residual true: attention and MLP in parallel is not modelled "
                     "(costed as two sequential sub-layers)")
    if isinstance(config, Llama4TextConfig) and config.no_rope_layers and 0 in config.no_rope_layers:
        notes.append(f"no_rope_layers: the {config.no_rope_layers.count(0)} layers without RoPE are costed with "
                     f"its element-wise pass")
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
        limit = config_field(config, source, "n_positions", 1024)
        if seq_size > limit:
            raise InputError(f"{source}: seq_size {seq_size} exceeds the learned position table "
                             f"(n_positions {limit})")
        if seq_size != limit:
            warnings.warn(f"{source}: n_positions {limit}: the learned position table is counted as "
                          f"seq_size ({seq_size}) rows", UnmodelledFieldWarning, stacklevel=2)
    _window_read_or_refused(config, source, seq_size)
    if isinstance(config, Llama4TextConfig) and seq_size > (config.attention_chunk_size or 8192):
        raise InputError(f"{source}: seq_size {seq_size} > attention_chunk_size {config.attention_chunk_size or 8192}: "
                         f"chunked attention over several chunks is not modelled")
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
