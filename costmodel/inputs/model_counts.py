"""What a model's shape implies: its derived widths, its parameters (total, active, per block,
per pattern layer, per multi-token-prediction module) and its FLOPs per token (the MFU
numerator). costmodel.inputs.model.Model inherits these from ModelCounts; they read only its fields.
"""

from __future__ import annotations

from costmodel.inputs.mamba import mamba_scan_flops_per_token
from costmodel.inputs.model_flops import ModelFlops

PATTERN_SYMBOLS = ("M", "*", "-", "E")
"""A layer pattern's symbols (Megatron-LM's hybrid_override_pattern): Mamba-2, attention, MLP, MoE."""
PATTERN_KINDS = {"M": "mamba", "*": "attention_layer", "-": "mlp_layer", "E": "moe_layer"}
"""The block kind (costmodel.terms.block.BLOCK_KINDS) of each symbol: a block of that one mixer."""
GATED_MLPS = ("swiglu", "geglu")

CAUSAL_ATTENTION_SHARE = 0.5
"""The share of the s×s attention products a causal mask leaves (s(s+1)/2 of s² pairs), as published
tables count it: Megatron-Bridge's flop_utils.py ("a·d·s/2 · 2"); Megatron-LM 2021 and Calculon count all."""


class ModelCounts:
    """The derived shape, parameter counts and FLOPs of a model (costmodel.inputs.model.Model)."""

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
    def v_head_size(self) -> int:
        """d_v: width of one value head (attn_size, except under latent attention)."""
        return self.attn_size if self.latent_attention is None else self.latent_attention.v_head_dim

    @property
    def out_width(self) -> int:
        """a·d_v: width of the attention output, the output projection's input."""
        return self.attn_heads * self.v_head_size

    @property
    def window_blocks(self) -> int:
        """Blocks whose attention is limited to the sliding window."""
        if not self.sliding_window:
            return 0
        return self.num_blocks if self.sliding_window_blocks is None else self.sliding_window_blocks

    @property
    def mlp_matrices(self) -> int:
        """h × f matrices of the MLP: 3 when gated (gate, up, down), else 2 (up, down)."""
        return 3 if self.gated else 2

    # ---- parameter counts (the weights of one block, and of the whole model) ----
    @property
    def attention_weight_params(self) -> int:
        """Matrix parameters of one block's attention: Q (h·a·d), K and V (2·h·g·d), output
        projection (a·d·h); under latent attention its five projections
        (costmodel.inputs.latent_attention)."""
        if self.latent_attention is not None:
            return self.latent_attention.weight_params(self.hidden, self.attn_heads)
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
        two norms (four with output_norms); and where the model has them, the query and key head
        norms (2·d scales), the attention sinks (a logits) and latent attention's norms (r_q + r_kv)."""
        qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        biases = (self.attn_width + 2 * self.kv_width if qkv_bias else 0) + (self.hidden if self.bias else 0)
        head_norms = (2 if self.norm == "layernorm" else 1) * 2 * self.attn_size if self.qk_norm else 0
        sinks = self.attn_heads if self.attention_sinks else 0
        latent = self.latent_attention.norm_params if self.latent_attention is not None else 0
        norms = (4 if self.output_norms else 2) * self.norm_params
        return biases + norms + head_norms + sinks + latent

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
        """Blocks with experts: blocks moe_every, 2·moe_every, ... (counted from 1) after the first
        `first_dense_blocks`, ⌊L / moe_every⌋ − ⌊k / moe_every⌋."""
        if not self.num_experts:
            return 0
        if self.layer_pattern is not None:
            return self.layer_pattern.count("E")
        return self.num_blocks // self.moe_every - self.first_dense_blocks // self.moe_every

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
        """The router of one MoE block, an h × E matrix (with router_bias, E biases), and the
        h × 1 shared-expert gate if any (replicated on every GPU of a tensor-parallel group, as
        Megatron-LM keeps it)."""
        return (self.hidden * (self.num_experts + (1 if self.shared_expert_gate else 0))
                + (self.num_experts if self.router_bias else 0))

    @property
    def moe_block_params(self) -> int:
        """Parameters of one MoE block: attention, its biases and norms, router, shared and
        routed experts (a layer pattern's MoE layer: its norm, router, shared and routed experts)."""
        if self.layer_pattern is not None:
            return self.pattern_layer_params("E")
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

    # ---- a layer pattern's layers: each a pre-norm residual layer of one kind ----
    def pattern_layer_params(self, symbol: str, active: bool = False) -> int:
        """Parameters of one layer of a pattern (its pre-norm included): a Mamba-2 mixer's
        (costmodel.inputs.mamba), attention's projections and biases, a dense MLP's, or an MoE
        layer's router, shared and routed experts (with `active`, k of the E routed experts)."""
        if symbol == "M":
            mixer = self.mamba.weight_params(self.hidden) + self.mamba.vector_params(self.hidden)
        elif symbol == "*":
            mixer = self.attention_weight_params + self.attention_vector_params - 2 * self.norm_params
        elif symbol == "-":
            mixer = self.mlp_matrices * self.hidden * self.feedforward + self._mlp_bias_params(self.feedforward)
        else:
            experts = self.experts_per_token if active else self.num_experts
            mixer = self.router_params + self.shared_expert_params + experts * self.expert_params
        return self.norm_params + mixer

    def pattern_layer_weight_params(self, symbol: str) -> int:
        """Matrix parameters one token multiplies by in one layer of a pattern."""
        if symbol == "M":
            return self.mamba.weight_params(self.hidden)
        if symbol == "*":
            return self.attention_weight_params
        if symbol == "-":
            return self.mlp_matrices * self.hidden * self.feedforward
        return (self.router_params + self.shared_expert_weight_params
                + self.experts_per_token * self.expert_weight_params)

    @property
    def pattern_counts(self) -> dict[str, int]:
        """Layers of each symbol of the pattern, in the order M, *, -, E (those it has)."""
        return {symbol: self.layer_pattern.count(symbol) for symbol in PATTERN_SYMBOLS
                if symbol in self.layer_pattern}

    def pattern_context_fields(self) -> dict:
        """The cost model's view of a pattern (costmodel.terms.context_parts.ModelShape): its layers
        by block kind and count, each kind's parameters, the Mamba shape; empty without a pattern."""
        if self.layer_pattern is None:
            return {}
        kinds, counts = PATTERN_KINDS, self.pattern_counts
        return {"kind_counts": tuple((kinds[symbol], float(count)) for symbol, count in counts.items()),
                "kind_params": tuple((kinds[symbol], float(self.pattern_layer_params(symbol)))
                                     for symbol in counts if symbol != "E"),
                "mamba": self.mamba}

    def _pattern_blocks(self, active: bool) -> int:
        return sum(count * self.pattern_layer_params(symbol, active) for symbol, count in self.pattern_counts.items())

    @property
    def total_params(self) -> int:
        if self.layer_pattern is not None:
            return self._pattern_blocks(False) + self.embedding_params + self.output_params
        blocks = self.dense_blocks * self.block_params + self.moe_blocks * self.moe_block_params
        return blocks + self.embedding_params + self.output_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: every one of a dense model; in MoE blocks the router, the
        shared experts and k of the E routed experts (the "active" count model cards quote,
        embeddings and output layer included)."""
        if self.layer_pattern is not None:
            return self._pattern_blocks(True) + self.embedding_params + self.output_params
        blocks = self.dense_blocks * self.block_params + self.moe_blocks * self.moe_block_active_params
        return blocks + self.embedding_params + self.output_params

    @property
    def active_params_without_embedding(self) -> int:
        """`active_params` less the input embedding, a row lookup no token multiplies by: the
        count of OpenAI's gpt-oss model card (its active 5.13 B counts the unembedding, not the
        embedding), where Mistral's and Qwen's cards count both."""
        return self.active_params - self.embedding_params

    # ---- multi-token prediction (reported apart from the model's count, as DeepSeek-V3's card does)
    @property
    def mtp_block_is_moe(self) -> bool:
        """An MTP module's block is of the last block's kind (DeepSeek-V3: an MoE block)."""
        return self.moe_blocks > 0 and self.num_blocks % self.moe_every == 0

    @property
    def mtp_module_params(self) -> int:
        """One MTP module's own parameters: two norms over h (the previous hidden state's and the
        next token's embedding), the 2h → h projection, one block and its final norm; the
        embedding and the output layer are the model's (shared, DeepSeek-V3 §2.2)."""
        block = self.moe_block_params if self.mtp_block_is_moe else self.block_params
        return 3 * self.norm_params + 2 * self.hidden * self.hidden + block

    @property
    def mtp_params(self) -> int:
        """The MTP modules' own parameters (none without them)."""
        return self.mtp_blocks * self.mtp_module_params

    @property
    def mtp_checkpoint_params(self) -> int:
        """The MTP modules as a checkpoint stores them: DeepSeek-V3's Hugging Face files give
        each module its own copy of the embedding and output layer (model.layers.61.embed_tokens,
        shared_head.head), the "14B of the Multi-Token Prediction (MTP) Module weights"."""
        copies = self.vocab_size * self.hidden * (1 if self.tied_embeddings else 2)
        return self.mtp_blocks * (self.mtp_module_params + copies)

    # ---- model FLOPs (the MFU numerator), stated once ----
    def model_flops(self) -> "ModelFlops":
        """Training FLOP per token without recomputation, as Megatron-LM and NeMo count them, on
        the matrix parameters a token uses (a mixture-of-experts block: router, shared experts
        and k routed experts)."""
        if self.layer_pattern is not None:
            return self._pattern_model_flops()
        s, L = self.seq_size, self.num_blocks + self.mtp_blocks
        mtp_block = self.moe_block_active_weight_params if self.mtp_block_is_moe else self.block_weight_params
        mtp = self.mtp_blocks * (2 * self.hidden * self.hidden + mtp_block + self.hidden * self.vocab_size)
        matrix_params = (self.dense_blocks * self.block_weight_params
                         + self.moe_blocks * self.moe_block_active_weight_params + self.hidden * self.vocab_size + mtp)
        # scores Q·Kᵀ (2·s·a·d_qk FLOP per token) and context ·V (2·s·a·d_v), forward, per block
        # (an MTP module's block too)
        attention_fwd = 2 * s * (self.attn_width + self.out_width) * L
        return ModelFlops(matrix_params=matrix_params, matrix_per_token=6.0 * matrix_params,
                          attention_per_token=3.0 * attention_fwd * CAUSAL_ATTENTION_SHARE, seq_size=s,
                          sparse=self.moe_blocks > 0)

    def _pattern_model_flops(self) -> "ModelFlops":
        """Model FLOP per token of a layer pattern: 6 × the matrix parameters a token uses in each
        layer and the output layer; the attention core of its attention layers (causal half);
        and 3 × its Mamba layers' SSD scans (costmodel.inputs.mamba: the chunked scan's products,
        which MFU counts as the attention core is counted)."""
        s, counts = self.seq_size, self.pattern_counts
        matrix_params = (sum(count * self.pattern_layer_weight_params(symbol) for symbol, count in counts.items())
                         + self.hidden * self.vocab_size)
        attention_fwd = 2 * s * (self.attn_width + self.out_width) * counts.get("*", 0) * CAUSAL_ATTENTION_SHARE
        scan_fwd = mamba_scan_flops_per_token(self.mamba, s) * counts["M"] if "M" in counts else 0.0
        return ModelFlops(matrix_params=matrix_params, matrix_per_token=6.0 * matrix_params,
                          attention_per_token=3.0 * attention_fwd, seq_size=s, sparse=self.moe_blocks > 0,
                          scan_per_token=3.0 * scan_fwd)

    def model_flops_per_sample(self) -> float:
        """Training FLOP per sequence with no recomputation (the MFU numerator): see ModelFlops."""
        return self.model_flops().per_sequence
