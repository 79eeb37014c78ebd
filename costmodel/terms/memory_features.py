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


__all__ = ["FEATURE_MODULES", "offload_share", "recompute_share", "stage_offload_share",
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
    return min(1.0, m.recompute_blocks / (c.model.blocks / (m.pp * m.interleaving)))


def offload_share(c, m):
    """The share of a stage's blocks whose activations are offloaded, on the mean stage of
    L/pp blocks (time; None: every block when activations_offload is on)."""
    if m.offload_blocks is None:
        return None
    return min(1.0, m.offload_blocks / (c.model.blocks / m.pp))


def stage_offload_share(m, xp, blocks):
    """The share of a stage of `blocks` blocks whose activations are offloaded: min(N,
    blocks)/blocks (1 without activation_offload_blocks: every block)."""
    if m.offload_blocks is None:
        return 1.0
    return xp.minimum(m.offload_blocks, blocks) / blocks


