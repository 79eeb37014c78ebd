"""The memory features a mapping file may state beyond the searched dimensions, as
Megatron-LM runs set them (docs/cost-model.md, "Memory features"):

- activation_offload_blocks N: N of a stage's blocks offload their stored activations
  (cpu_offloading_num_layers), the others keep them in HBM;
- recompute_blocks N: the first N blocks of each pipeline chunk recompute in full, the others
  store their activations (recompute_method block, recompute_num_layers);
- recompute_modules: the modules of selective recomputation (recompute_modules);
- megatron_fsdp: Megatron-FSDP, ZeRO stage 3 with its gradient double buffer.

A mapping's formula view carries them as `offload_blocks`, `recompute_blocks`,
`recompute_modules` and `megatron_fsdp` (costmodel.evaluate.formula_view): None (False) in the
searched spaces' array views, so the search costs what it always did; one mapping's view
states what its file says. The block's terms are mixed by share as costmodel.terms.block_terms
mixes dense and MoE blocks: a stage of L blocks in v chunks of K = L/v, N of each chunk
recomputed, runs N·K⁻¹ of its blocks recomputed and the rest storing everything.
"""

from __future__ import annotations

from types import SimpleNamespace

from costmodel.ops import ScalarOps
from costmodel.terms.pipeline import stage_blocks

__all__ = ["FEATURE_MODULES", "feature_problem", "offload_share", "recompute_share", "stage_offload_share",
           "with_switches"]

FEATURE_MODULES = ("core_attn", "layernorm", "mlp", "moe_act", "mla_up_proj")
"""The recompute_modules costed (Megatron-LM transformer_config.py names them)."""


def with_switches(m, **switches) -> SimpleNamespace:
    """One mapping's view with some of its switches and choices set otherwise (the variants
    a share mixes: every block recomputed, none offloaded, ...)."""
    return SimpleNamespace(**{**vars(m), **switches})


def recompute_share(c, m):
    """The share of a stage's blocks recomputed in full: N/K for N of each chunk's K =
    L/(pp·v) blocks recomputed (None: every block when activation_recompute is full)."""
    if m.recompute_blocks is None:
        return None
    return min(1.0, m.recompute_blocks / (c.blocks / (m.pp * m.interleaving)))


def offload_share(c, m):
    """The share of a stage's blocks whose activations are offloaded, on the mean stage of
    L/pp blocks (time; None: every block when activations_offload is on)."""
    if m.offload_blocks is None:
        return None
    return min(1.0, m.offload_blocks / (c.blocks / m.pp))


def stage_offload_share(m, xp, blocks):
    """The share of a stage of `blocks` blocks whose activations are offloaded: min(N,
    blocks)/blocks (1 without activation_offload_blocks: every block)."""
    if m.offload_blocks is None:
        return 1.0
    return xp.minimum(m.offload_blocks, blocks) / blocks


def feature_problem(num_blocks: int, num_experts: int, mapping, latent: bool = False) -> str | None:
    """Why a mapping's memory features cannot apply to a model of `num_blocks` blocks laid
    out by the mapping (one line naming the field and both numbers); None when they can."""
    first, middle, last = stage_blocks(ScalarOps, num_blocks, mapping.pp, mapping.pipeline_first_stage_blocks,
                                       mapping.pipeline_last_stage_blocks, mapping.pipeline_interleaving)
    fewest = int(min(first, middle, last))
    n = mapping.activation_offload_blocks
    if n is not None and n > fewest:
        return (f"activation_offload_blocks({n}) > the {fewest} blocks of a pipeline stage (num_blocks {num_blocks}, "
                f"pipeline_par {mapping.pp})")
    chunk = fewest // mapping.pipeline_interleaving
    n = mapping.recompute_blocks
    if n is not None and n > chunk:
        return (f"recompute_blocks({n}) > the {chunk} blocks of a pipeline chunk (num_blocks {num_blocks}, "
                f"pipeline_par {mapping.pp}, pipeline_interleaving {mapping.pipeline_interleaving})")
    if mapping.recompute_modules is not None and "moe_act" in mapping.recompute_modules and not num_experts:
        return "recompute_modules: moe_act needs a mixture-of-experts model (num_experts > 0)"
    if mapping.recompute_modules is not None and "mla_up_proj" in mapping.recompute_modules and not latent:
        return "recompute_modules: mla_up_proj needs a model with latent attention (latent_attention)"
    return None

