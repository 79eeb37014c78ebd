"""Hugging Face configs whose layers differ by a pattern: nemotron_h (hybrid_override_pattern),
gemma3_text (layer_types or sliding_window_pattern), llama4_text (interleave_moe_layer_step,
attention_chunk_size, no_rope_layers). Each reader returns the Model fields (costmodel.inputs.hf
registers them in READERS)."""

from __future__ import annotations

from costmodel.errors import InputError, shown
from costmodel.inputs.hf_schemas import Gemma3TextConfig, config_field, Llama4TextConfig, NemotronHConfig
from costmodel.inputs.model import PATTERN_SYMBOLS


def _nemotron_h_experts(config: NemotronHConfig, source: str, pattern: str) -> dict:
    """The MoE fields of a nemotron_h config whose pattern has E layers: n_routed_experts of
    moe_intermediate_size (squared ReLU, two matrices), top num_experts_per_tok, and
    n_shared_experts shared experts of moe_shared_expert_intermediate_size in all (Megatron-
    Bridge's Nemotron3NanoProvider: 3712 = 1856 × 2 for its one shared expert). The router's
    e_score_correction_bias is a buffer updated by a rule, not a trained parameter: not counted."""
    if "E" not in pattern:
        return {}
    if config.moe_latent_size:
        raise InputError(f"{source}: moe_latent_size {config.moe_latent_size} (latent MoE: experts run on a "
                         f"projected width) is not modelled")
    shared_width = config_field(config, source, "moe_shared_expert_intermediate_size", 0)
    shared = {"shared_experts": 1, "shared_expert_feedforward": shared_width} if shared_width else {}
    return {"num_experts": config_field(config, source, "n_routed_experts"),
            "experts_per_token": config_field(config, source, "num_experts_per_tok"),
            "expert_feedforward": config_field(config, source, "moe_intermediate_size"), **shared}


def nemotron_h(config: NemotronHConfig, source: str) -> dict:
    """nemotron_h: one layer per symbol of hybrid_override_pattern, each a pre-RMSNorm residual
    layer of one mixer (NemotronHBlock); attention without position encoding, grouped-query,
    head_dim (or attention_head_dim); the MLP squared ReLU (mlp_hidden_act relu2); the Mamba-2
    mixers mamba_num_heads × mamba_head_dim wide (costmodel.inputs.mamba)."""
    pattern = config_field(config, source, "hybrid_override_pattern")
    layers = config_field(config, source, "num_hidden_layers", len(pattern))
    unknown = sorted(set(pattern) - set(PATTERN_SYMBOLS))
    if unknown or len(pattern) != layers:
        raise InputError(f"{source}: hybrid_override_pattern {shown(pattern)} must give one of M, *, -, E for each "
                         f"of the {layers} layers (num_hidden_layers; got {len(pattern)}"
                         f"{', unknown ' + shown(unknown) if unknown else ''})")
    if config_field(config, source, "num_nextn_predict_layers", 0):
        raise InputError(f"{source}: num_nextn_predict_layers {config.num_nextn_predict_layers} (multi-token "
                         f"prediction layers of a pattern) is not modelled")
    act = config_field(config, source, "mlp_hidden_act", "relu2")
    if act != "relu2":
        raise InputError(f"{source}: field 'mlp_hidden_act' {shown(act)} is not modelled for nemotron_h "
                         f"(supported: relu2)")
    hidden, heads = config_field(config, source, "hidden_size"), config_field(config, source, "num_attention_heads")
    bias = config_field(config, source, "mlp_bias", False)
    if config_field(config, source, "attention_bias", False) != bias:
        raise InputError(f"{source}: attention_bias {config.attention_bias} with mlp_bias {bias} is not modelled")
    mamba = {"heads": config_field(config, source, "mamba_num_heads"), "head_dim": config_field(config, source, "mamba_head_dim"),
             "state_size": config_field(config, source, "ssm_state_size"), "groups": config_field(config, source, "n_groups"),
             "conv_kernel": config_field(config, source, "conv_kernel", 4), "chunk_size": config_field(config, source, "chunk_size", 128),
             "conv_bias": config_field(config, source, "use_conv_bias", True),
             "proj_bias": config_field(config, source, "mamba_proj_bias", False)}
    head_dim = config.head_dim or config.attention_head_dim or hidden // heads
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size"),
        "attn_heads": heads, "kv_heads": config_field(config, source, "num_key_value_heads", heads), "attn_size": head_dim,
        "num_blocks": layers, "vocab_size": config_field(config, source, "vocab_size"), "mlp": "squared_relu",
        "norm": "rmsnorm", "position": "none", "tied_embeddings": config_field(config, source, "tie_word_embeddings", False),
        "bias": bias, "layer_pattern": pattern, "mamba": mamba, **_nemotron_h_experts(config, source, pattern),
    }


def _gemma3_layer_types(config: Gemma3TextConfig, source: str, layers: int) -> list[str]:
    pattern = config_field(config, source, "sliding_window_pattern", 6)
    kinds = config_field(config, source, "layer_types", ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                                   for i in range(layers)])
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if len(kinds) != layers or unknown:
        raise InputError(f"{source}: field 'layer_types' must list sliding_attention or full_attention for each of "
                         f"the {layers} layers (got {len(kinds)} entries{', unknown ' + shown(unknown) if unknown else ''})")
    return kinds


def gemma3_text(config: Gemma3TextConfig, source: str) -> dict:
    """gemma3_text (Transformers' Gemma3TextConfig defaults): GeGLU (gelu_pytorch_tanh),
    RMSNorm, RoPE, an RMSNorm on each query and key head, tied embeddings; layer i (from 0)
    attends over sliding_window tokens unless layer_types (default: every
    sliding_window_pattern-th layer) makes it global. Gemma's two further norms per layer
    (post_attention_layernorm, post_feedforward_layernorm: output_norms) count as parameters."""
    hidden, heads = config_field(config, source, "hidden_size"), config_field(config, source, "num_attention_heads")
    layers = config_field(config, source, "num_hidden_layers")
    act = config_field(config, source, "hidden_activation", "gelu_pytorch_tanh")
    if not act.startswith("gelu"):
        raise InputError(f"{source}: field 'hidden_activation' {shown(act)} is not modelled (supported: gelu)")
    sliding = _gemma3_layer_types(config, source, layers).count("sliding_attention")
    bias = config_field(config, source, "attention_bias", False)
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size"), "attn_heads": heads,
        "kv_heads": config_field(config, source, "num_key_value_heads", heads),
        "attn_size": config_field(config, source, "head_dim", 256), "num_blocks": layers,
        "vocab_size": config_field(config, source, "vocab_size", 262208), "mlp": "geglu", "norm": "rmsnorm",
        "position": "rope", "tied_embeddings": config_field(config, source, "tie_word_embeddings", True),
        "bias": False, "qkv_bias": bias, "qk_norm": True, "output_norms": True,
        **({"sliding_window": config_field(config, source, "sliding_window", 4096), "sliding_window_blocks": sliding}
           if sliding else {}),
    }


def llama4_text(config: Llama4TextConfig, source: str) -> dict:
    """llama4_text (Transformers' Llama4TextConfig): layer i (from 0) is an MoE layer when
    (i + 1) % interleave_moe_layer_step == 0: num_local_experts routed experts of
    intermediate_size, top num_experts_per_tok, and one shared expert of the same width; the
    others a dense SwiGLU MLP of intermediate_size_mlp. Its query/key norm is an L2 norm
    without parameters. Chunked attention (attention_chunk_size) on the RoPE layers equals
    full causal attention when the sequence fits one chunk; longer sequences are refused
    (costmodel.inputs.hf checks the chunk against seq_size)."""
    hidden, heads = config_field(config, source, "hidden_size"), config_field(config, source, "num_attention_heads")
    layers = config_field(config, source, "num_hidden_layers")
    step = config_field(config, source, "interleave_moe_layer_step", 1)
    if config.moe_layers is not None and sorted(config.moe_layers) != [i for i in range(layers) if (i + 1) % step == 0]:
        raise InputError(f"{source}: moe_layers {shown(config.moe_layers)} other than every "
                         f"interleave_moe_layer_step-th layer is not modelled")
    width = config_field(config, source, "intermediate_size")
    return {
        "hidden": hidden, "feedforward": config_field(config, source, "intermediate_size_mlp"), "attn_heads": heads,
        "kv_heads": config_field(config, source, "num_key_value_heads", heads),
        "attn_size": config_field(config, source, "head_dim", hidden // heads), "num_blocks": layers,
        "vocab_size": config_field(config, source, "vocab_size"), "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
        "tied_embeddings": config_field(config, source, "tie_word_embeddings", False),
        "bias": config_field(config, source, "attention_bias", False),
        "num_experts": config_field(config, source, "num_local_experts"),
        "experts_per_token": config_field(config, source, "num_experts_per_tok"), "expert_feedforward": width,
        "shared_experts": 1, "shared_expert_feedforward": width, "moe_every": step,
    }
