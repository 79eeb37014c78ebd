"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", §2.1, and DeepSeek-V3,
arXiv:2412.19437 §2.1.1): the shape of its projections, their weights and FLOP.

With h hidden, a heads, r_q = q_lora_rank, r_kv = kv_lora_rank, d_n = qk_nope_head_dim,
d_r = qk_rope_head_dim, d_v = v_head_dim and d_qk = d_n + d_r, one block's attention is
(Transformers' DeepseekV3Attention; Megatron-LM's MLASelfAttention):

    q_a   h → r_q           (linear_q_down_proj)   then RMSNorm over r_q (q_a_layernorm)
    q_b   r_q → a·d_qk      (linear_q_up_proj)     with r_q = 0: one h → a·d_qk projection
    kv_a  h → r_kv + d_r    (linear_kv_down_proj)  the compressed K/V and the shared RoPE key;
                                                   RMSNorm over r_kv (kv_a_layernorm)
    kv_b  r_kv → a·(d_n + d_v)  (linear_kv_up_proj) the per-head keys (no RoPE part) and values
    o     a·d_v → h         (linear_proj)

then RoPE on the d_r parts, and the attention core with queries and keys of d_qk and values
of d_v per head. No biases (DeepSeek's attention_bias is false). Under tensor parallelism
Megatron-LM keeps the two down projections whole on every rank (duplicated, run on the
sequence-parallel shard when sequence parallelism is on) and splits q_b, kv_b and o by
heads; costmodel.terms.block times them so.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

import costmodel.inputs.limits as limits
from costmodel.inputs.fields import INPUT_CONFIG, WholeNumber, within
from costmodel.inputs.limits import Bound

_RANK = Bound(0, limits.ATTN_SIZE.high, "a latent rank or RoPE width; 0 = none")


class LatentAttention(BaseModel):
    """The ranks and head sizes of multi-head latent attention (Hugging Face's DeepseekV3Config
    names)."""

    model_config = INPUT_CONFIG

    q_lora_rank: Annotated[WholeNumber, within(_RANK)] = Field(
        ge=0, description="r_q: rank of the compressed query (0: queries projected from h directly).")
    kv_lora_rank: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        gt=0, description="r_kv: rank of the compressed keys and values.")
    qk_nope_head_dim: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        gt=0, description="d_n: the part of a query/key head without rotary embedding.")
    qk_rope_head_dim: Annotated[WholeNumber, within(_RANK)] = Field(
        ge=0, description="d_r: the rotary part of a query head, and the one key part all heads share.")
    v_head_dim: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(
        gt=0, description="d_v: width of one value head (and of the attention output per head).")

    @property
    def qk_head_dim(self) -> int:
        """d_qk = d_n + d_r: the query and key width per head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def projections(self, hidden: int, heads: int) -> dict[str, tuple[int, int]]:
        """Each projection as (input width, output width), by Transformers' module name."""
        q = ({"q_a_proj": (hidden, self.q_lora_rank), "q_b_proj": (self.q_lora_rank, heads * self.qk_head_dim)}
             if self.q_lora_rank else {"q_proj": (hidden, heads * self.qk_head_dim)})
        return {**q,
                "kv_a_proj_with_mqa": (hidden, self.kv_lora_rank + self.qk_rope_head_dim),
                "kv_b_proj": (self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim)),
                "o_proj": (heads * self.v_head_dim, hidden)}

    def weight_params(self, hidden: int, heads: int) -> int:
        """Matrix parameters of one block's attention: the sum of the projections' in × out."""
        return sum(i * o for i, o in self.projections(hidden, heads).values())

    @property
    def norm_params(self) -> int:
        """The RMSNorms over the compressed query (r_q, when there is one) and K/V (r_kv)."""
        return self.q_lora_rank + self.kv_lora_rank

    @property
    def latent_width(self) -> int:
        """r_q + r_kv: the compressed query and K/V each token carries into the up projections."""
        return self.q_lora_rank + self.kv_lora_rank
