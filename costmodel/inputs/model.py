"""The application: the shape of a transformer language model.

Field names follow Calculon's model files (`hidden`, `feedforward`, `seq_size`,
`attn_heads`, `attn_size`, `num_blocks`) so its users can bring theirs unchanged; the fields
of today's dense models (`kv_heads`, `mlp`, `norm`, `position`, `tied_embeddings`, `bias`)
default to the GPT family. A Hugging Face config.json reads into this class too
(costmodel.inputs.hf).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.inputs.limits import Bound
from costmodel.inputs.latent_attention import LatentAttention
from costmodel.inputs.mamba import MambaShape
from costmodel.inputs.model_flops import ModelFlops  # noqa: F401 (read from here)
from costmodel.inputs.model_counts import (CAUSAL_ATTENTION_SHARE, GATED_MLPS, PATTERN_KINDS,  # noqa: F401 (read from here)
                                    PATTERN_SYMBOLS, ModelCounts)

# The field types shared by the three inputs (model, system, mapping) live in costmodel.inputs.fields;
# they are re-exported here, where the other modules have always imported them.
from costmodel.inputs.fields import (INPUT_CONFIG, Boolean, RealNumber, WholeNumber, _boolean, _real_number,  # noqa: F401
                              _whole_number, _yaml_exponent_text, within)


_BLOCKS_OR_NONE = Bound(0, limits.NUM_BLOCKS.high, "a count of blocks; 0 = none")
_WINDOW_OR_NONE = Bound(0, limits.SEQ_SIZE.high, "tokens a query attends to; 0 = no window")


MlpKind = Literal["gelu", "swiglu", "geglu", "squared_relu"]
"""The MLP's activation: GeLU (two matrices, GPT-2/3); SwiGLU and GeGLU (gated: three
matrices of hidden × feedforward and an element-wise gate, Shazeer 2020, "GLU Variants
Improve Transformer"; Llama, Qwen, Mistral); squared ReLU (two matrices, Nemotron-4)."""


class Model(ModelCounts, BaseModel):
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
    position: Literal["learned", "rope", "none"] = Field(
        "learned", description="learned (a seq_size × hidden table) | rope (rotary, no parameters) | none "
                               "(no position encoding: Nemotron-H's attention layers).")
    tied_embeddings: Boolean = Field(True, description="The output layer shares the token embedding's weights.")
    bias: Boolean = Field(True, description="Linear layers and norms carry biases (Llama-class models have none).")
    dropout: Boolean = Field(
        True, description="Trained with dropout (GPT-3, Megatron-LM's defaults): each block keeps its two dropout "
                          "masks (and an unfused attention core its score mask) for backward and runs the dropout "
                          "passes. False: a model trained without (Llama, Mistral, Qwen: a probability of 0 makes "
                          "PyTorch's dropout return its input, no mask).")
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
    first_dense_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] = Field(
        0, ge=0, description="The first k blocks keep the dense MLP whatever moe_every says (Hugging Face's "
                             "first_k_dense_replace; DeepSeek-V3: 3).")
    # ---- attention variants (all off for the GPT and Llama families) ----
    latent_attention: LatentAttention | None = Field(
        None, description="Multi-head latent attention (DeepSeek-V3): its ranks and head sizes; attn_size is then "
                          "the query/key head width qk_nope_head_dim + qk_rope_head_dim.")
    qk_norm: Boolean = Field(False, description="An RMSNorm over each query and key head (Qwen3): 2·d parameters.")
    output_norms: Boolean = Field(False, description="A norm on the attention's and the MLP's outputs before each "
                                                     "residual add, beside the two pre-norms (Gemma 2/3's "
                                                     "post_attention_layernorm, post_feedforward_layernorm): two more "
                                                     "norms' parameters per block; their element-wise passes are "
                                                     "not timed (as qk_norm's).")
    attention_sinks: Boolean = Field(False, description="A learned logit per head joins each softmax (gpt-oss): "
                                                        "a parameters per block, negligible FLOP.")
    sliding_window: Annotated[WholeNumber, within(_WINDOW_OR_NONE)] = Field(
        0, ge=0, description="w: tokens a query of a sliding-window block attends to (0 = none).")
    sliding_window_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] | None = Field(
        None, ge=0, description="Blocks that use the window (gpt-oss: every other one); default: all when "
                                "sliding_window is given.")
    router_bias: Boolean = Field(False, description="A bias per expert on the router's logits (gpt-oss; "
                                                    "DeepSeek-V3's e_score_correction_bias): E parameters.")
    router_load_balancing: Literal["none", "aux_loss", "seq_aux_loss", "global_aux_loss"] = Field(
        "none", description="The load-balancing loss the router adds in training (Megatron-Core's "
                            "moe_router_load_balancing_type with a non-zero moe_aux_loss_coeff; Megatron-Bridge "
                            "sets seq_aux_loss for DeepSeek-V3, none for gpt-oss): its kernels, not its value.")
    router_fp32: Boolean = Field(False, description="The router computes its logits, scores and top-k in float32 "
                                                    "(Megatron-Core's moe_router_dtype fp32, as Megatron-Bridge "
                                                    "sets for DeepSeek-V3): no parameters; more bytes and casts.")
    router_expert_bias: Boolean = Field(False, description="Auxiliary-loss-free balancing: a per-expert bias on the "
                                                           "scores, updated once a step from the tokens each expert "
                                                           "received (Megatron-Core's "
                                                           "moe_router_enable_expert_bias; DeepSeek-V3): a buffer, "
                                                           "not a trained parameter.")
    yarn_rope: Boolean = Field(False, description="RoPE with YaRN scaling (Hugging Face's rope_scaling rope_type "
                                                  "yarn: gpt-oss): no parameters; outside latent attention Megatron "
                                                  "runs it unfused, as PyTorch operations.")
    clamped_activation: Boolean = Field(False, description="The gated activation is clamped with a +1 on its linear "
                                                           "half (gpt-oss's swiglu_limit): Megatron runs clamps and a "
                                                           "cat before its fused kernel.")
    mtp_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] = Field(
        0, ge=0, description="Multi-token prediction modules (DeepSeek-V3's num_nextn_predict_layers), each a "
                             "block of the last block's kind with two norms and a 2h → h projection, sharing the "
                             "embedding and output layer (DeepSeek-V3 §2.2); run on the last pipeline stage.")

    # ---- layer patterns (hybrid models: Nemotron-H, Nemotron 3) ----
    layer_pattern: str | None = Field(
        None, description="One symbol per layer, Megatron-LM's hybrid_override_pattern: M a Mamba-2 layer, * an "
                          "attention layer, - a dense MLP layer, E a mixture-of-experts layer; each a pre-norm "
                          "residual layer of its own (num_blocks = the pattern's length). None: every block is "
                          "attention + MLP (or MoE), as above.")
    mamba: MambaShape | None = Field(None, description="The Mamba-2 mixers' shape (with M in layer_pattern).")

    @model_validator(mode="after")
    def _pattern(self) -> "Model":
        pattern = self.layer_pattern
        if pattern is None:
            if self.mamba is not None:
                raise ValueError("mamba given without layer_pattern: say which layers are Mamba-2 (M)")
            return self
        unknown = sorted(set(pattern) - set(PATTERN_SYMBOLS))
        if unknown:
            raise ValueError(f"layer_pattern {pattern!r}: unknown symbols {unknown} (M Mamba-2, * attention, "
                             f"- MLP, E MoE)")
        if len(pattern) != self.num_blocks:
            raise ValueError(f"layer_pattern has {len(pattern)} layers, num_blocks({self.num_blocks}): give the same")
        if ("M" in pattern) != (self.mamba is not None):
            raise ValueError("layer_pattern with M needs mamba (its shape), and mamba needs an M in layer_pattern")
        if ("E" in pattern) != bool(self.num_experts):
            raise ValueError(f"layer_pattern {'with' if 'E' in pattern else 'without'} E and num_experts"
                             f"({self.num_experts}): MoE layers (E) need the experts, and experts need E layers")
        if self.moe_every != 1 or self.first_dense_blocks or self.sliding_window_blocks or self.mtp_blocks:
            raise ValueError("layer_pattern places every layer: moe_every, first_dense_blocks, sliding_window_blocks "
                             "and mtp_blocks are not read with it")
        return self

    @model_validator(mode="after")
    def _heads_group(self) -> "Model":
        if self.kv_heads is not None and self.attn_heads % self.kv_heads:
            raise ValueError(f"kv_heads({self.kv_heads}) does not divide attn_heads({self.attn_heads}): "
                             f"each key/value head serves a whole group of query heads")
        return self

    @model_validator(mode="after")
    def _attention_variants(self) -> "Model":
        mla = self.latent_attention
        if mla is not None:
            if self.attn_size != mla.qk_head_dim:
                raise ValueError(f"attn_size({self.attn_size}) with latent_attention: must be qk_nope_head_dim + "
                                 f"qk_rope_head_dim ({mla.qk_nope_head_dim} + {mla.qk_rope_head_dim})")
            if self.kv_groups != self.attn_heads:
                raise ValueError(f"kv_heads({self.kv_heads}) with latent_attention: every head has its own keys "
                                 f"and values (kv_heads = attn_heads({self.attn_heads}))")
            if self.bias or self.qkv_bias:
                raise ValueError("bias with latent_attention is not modelled (DeepSeek's projections have none)")
        if self.sliding_window_blocks is not None and self.sliding_window_blocks > self.num_blocks:
            raise ValueError(f"sliding_window_blocks({self.sliding_window_blocks}) > num_blocks({self.num_blocks})")
        if self.yarn_rope and self.position != "rope":
            raise ValueError(f"yarn_rope(True) with position({self.position!r}): YaRN scales rotary embeddings "
                             f"(position rope)")
        if self.clamped_activation and self.mlp not in ("swiglu", "geglu"):
            raise ValueError(f"clamped_activation(True) with mlp({self.mlp!r}): only a gated activation is clamped")
        if self.sliding_window_blocks and not self.sliding_window:
            raise ValueError(f"sliding_window_blocks({self.sliding_window_blocks}) given with sliding_window(0)")
        return self

    @model_validator(mode="after")
    def _experts(self) -> "Model":
        if self.num_experts == 0:
            given = [f"{name}({value})" for name, value in (
                ("experts_per_token", self.experts_per_token), ("expert_feedforward", self.expert_feedforward),
                ("shared_experts", self.shared_experts), ("shared_expert_feedforward", self.shared_expert_feedforward),
                ("shared_expert_gate", self.shared_expert_gate)) if value]
            given += [f"moe_every({self.moe_every})"] if self.moe_every != 1 else []
            given += [f"first_dense_blocks({self.first_dense_blocks})"] if self.first_dense_blocks else []
            given += ["router_bias(True)"] if self.router_bias else []
            given += [f"router_load_balancing({self.router_load_balancing!r})"] if self.router_load_balancing != "none" else []
            given += [f"{name}(True)" for name in ("router_fp32", "router_expert_bias") if getattr(self, name)]
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
        if self.first_dense_blocks > self.num_blocks:
            raise ValueError(f"first_dense_blocks({self.first_dense_blocks}) > num_blocks({self.num_blocks}): the "
                             f"dense blocks come first, among the model's blocks")
        if self.moe_blocks <= 0:
            raise ValueError(f"first_dense_blocks({self.first_dense_blocks}) with moe_every({self.moe_every}) and "
                             f"num_blocks({self.num_blocks}): no block would have experts")
        return self

