"""The activations one block keeps for backward on one GPU for one microbatch, and the
transient workspace its backward needs (Korthikanti et al. 2022, §4): the sum of its layers'
records' stored bytes (costmodel.terms.layers.LayerCost; what each layer keeps, as
Megatron-Core saves it, is stated where the layer is costed), with sequence parallelism's
gathered GEMM inputs and the mapping's recompute setting applied to the records, and the
context-parallel exchange's buffers. costmodel.terms.block times the same layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.terms.block import BlockForward, block_forward_times
from costmodel.terms.context import Context
from costmodel.terms.cp_buffers import cp_buffer_bytes
from costmodel.terms.layers import BlockLayers


@dataclass(frozen=True)
class StoredActivations:
    """Bytes one block keeps for backward, one microbatch, one GPU."""

    stored: object
    """kept from forward to backward under the mapping's recompute setting"""
    full: object
    """what storing everything would keep"""
    workspace: object
    """transient bytes recomputation needs while one block's backward runs"""


def stored_activations(c: Context, m, xp, kind: str) -> StoredActivations:
    """What one block of `kind` (costmodel.terms.block.BLOCK_KINDS) keeps for backward: its
    layers' records (block_forward_times) under the mapping's settings (block_stored)."""
    return block_stored(c, m, xp, block_forward_times(c, m, xp, kind))


def block_stored_activation_bytes(c: Context, m, xp, moe: bool = False) -> StoredActivations:
    """A transformer block's stored activations (stored_activations of kind "dense", or "moe"
    with `moe`); with no parallelism and 16-bit, unfused, 34·s·b·h + 5·a·s²·b (Korthikanti et
    al. 2022, §4)."""
    return stored_activations(c, m, xp, "moe" if moe else "dense")


def block_stored(c: Context, m, xp, block: BlockForward) -> StoredActivations:
    """Bytes one block keeps from forward to backward, and its backward's workspace, from its
    layers' records (`block`: their sum, with the records in `block.layers`).

    Everything the records keep, their gathered GEMM inputs whole unless backward redoes
    sequence parallelism's all-gather (seq_par_ag_redo: the tp shard then). Full recomputation
    keeps only the block's input (its first layer's stored_input_bytes), and its backward needs
    the whole block's bytes again. attn_only drops what the records say it drops
    (selective_dropped_bytes: the unfused attention core; a fused kernel keeps its softmax
    statistics and its backward recomputes the scores itself), alive again while the block's
    backward runs. recompute_modules drops each named module's bytes (ModuleRerun) instead; the
    largest module's are alive while its backward recomputes it.

    The workspace also holds the records' transient bytes (an MoE layer's all-to-all send and
    receive buffers) and, in a block with an attention layer, the context-parallel buffers
    (cp_comm: the ring's K/V chunks, all_gather's gathered K/V, a2a's re-sharded Q/K/V/O)."""
    gathered_split = xp.where(m.seq_par & m.seq_par_ag_redo, m.tp, 1.0)
    full = block.stored_bytes + block.stored_gathered_bytes / gathered_split
    dropped = block.selective_dropped_bytes
    stored = xp.where(m.recompute_attn_only, full - dropped, full)
    recomputing = xp.where(m.recompute_attn_only, dropped, 0.0)
    transient = block.transient_bytes
    if m.recompute_modules is not None:
        stored, largest = _modules_stored(m, xp, BlockLayers(block.layers), full, gathered_split)
        recomputing, transient = 0.0, transient + largest
    if any(layer.name == "attention" for layer in block.layers):
        transient = cp_buffer_bytes(c, m, xp) + transient
    return StoredActivations(
        stored=xp.where(m.recompute_full, block.stored_input_bytes, stored),
        full=full,
        workspace=transient + xp.where(m.recompute_full, full, recomputing),
    )


def _modules_stored(m, xp, layers: BlockLayers, full, gathered_split) -> tuple:
    """(stored bytes, the largest module's dropped bytes) of a block under recompute_modules
    (Megatron-LM transformer_config.py `recompute_modules`, transformer_layer.py / mlp.py /
    experts.py / multi_latent_attention.py): `full` less what each named module's records drop."""
    gone = []
    for module in m.recompute_modules:
        dropped, gathered = layers.module_dropped(module)
        gone.append(dropped + gathered / gathered_split)
    largest = 0.0
    for bytes_ in gone:
        largest = xp.maximum(largest, bytes_)
    return full - sum(gone), largest
