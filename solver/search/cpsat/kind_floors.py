"""The search's floors for a model whose blocks are of several kinds (dense and MoE blocks,
a layer pattern's Mamba-2, attention, MLP and MoE layers): each pipeline stage's time and
memory are the sums of its own blocks (costmodel.terms.stage_kinds), so a stage's blocks times
the model's mean block bounds nothing stage by stage. What stays a lower bound:

* time: each stage takes at least Σ_kind count(stage, kind) · the kind's block floor (the
  block tables keep one time table per kind, `KIND_BLOCK`), the last with the output layer H,
  and the slowest stage at least the most of these — `stage_kind_micro` (the block floors);
  the CP-SAT surrogate, whose time is blocks × one block table, takes the mean stage,
  (L · mean block + H)/pp (the stages' blocks are the model's, each once, and H is on one of
  them; solver.search.cpsat.surrogate's output layer at 1/pp);
* memory: the first stage's stored activations per block at least its kinds' floors weighted
  by its counts, its recompute workspace at least the largest floor of the kinds it holds
  (one table per kind, `KIND_MEMORY`) — `first_stage_memory`;
* one block of any stage — in a ZB-H1 bubble, its stored activations, its recompute
  workspace — at least the least of the kinds' (`least_kind_rows`: the CP-SAT surrogate's).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from costmodel.space.layout import layout_interleavings, layout_problem, stage_blocks
from costmodel.ops import ArrayOps, ScalarOps
from costmodel.terms.block_terms import kind_block_terms, kinds_mean
from costmodel.terms.stage_kinds import stage_kind_counts


KIND_BLOCK = "block_kind_"
"""The block tables of each kind's block time: "block_kind_0", "block_kind_1", ... in the
order of Context.model.block_kinds (solver.search.cpsat.block_tables)."""
KIND_MEMORY = ("stored_kind_", "workspace_kind_")
"""... and of each kind's stored activations and recompute workspace."""


MEAN_FIELDS = ("block_fwd_s", "block_bwd_s", "recompute_s", "offload_fwd_s", "offload_bwd_s", "compute_fwd_s",
               "compute_bwd_s", "act_message_bytes")
"""What the block tables read of the mean block of several kinds (block_time, its compute and its
pipeline message; solver.search.cpsat.block_tables._block_rows): the least kind's rows take its
other places (least_kind_rows)."""


def kind_block_rows(c, ns) -> tuple:
    """(the model's mean block, the block grid's rows of several kinds) of a chunk of the block
    grid `ns` (solver.search.cpsat.block_tables._block_rows): with one kind, its block and no more
    rows; with several, the mean's MEAN_FIELDS (each the mean of the kinds' own: kinds_mean), each
    kind's rows (kind_rows) and the least kind's that replace the mean's (least_kind_rows)."""
    kinds = kind_block_terms(c, ns, ArrayOps, mean=False)
    if len(kinds.terms) == 1:
        return kinds.terms[0], {}
    mean = SimpleNamespace(**{name: kinds_mean(c, [getattr(blk, name) for blk in kinds.terms]) for name in MEAN_FIELDS})
    times = [block_time(blk) for blk in kinds.terms]          # (each kind's, summed once)
    return mean, {**least_kind_rows(kinds, times), **kind_rows(kinds, times)}


def reduced_kind_rows(rows: dict, memory, time) -> dict:
    """The block grid's rows reduced per key (solver.search.cpsat.block_tables): the stored
    activations and workspace, the mean block's and each kind's, by `memory`; each kind's
    time by `time` (as the mean block's)."""
    return {**{name: memory(values) for name, values in rows.items()
               if name in ("stored", "workspace") or name.startswith(KIND_MEMORY)},
            **{name: time(values) for name, values in rows.items() if name.startswith(KIND_BLOCK)}}


def kind_rows(kinds, times: list | None = None) -> dict:
    """Each kind's block rows of the block grid (solver.search.cpsat.block_tables): its time
    (block_time, or `times` where given), stored activations and workspace (KIND_BLOCK, KIND_MEMORY)."""
    out = {}
    times = times or [block_time(blk) for blk in kinds.terms]
    for k, blk in enumerate(kinds.terms):
        out[f"{KIND_BLOCK}{k}"] = times[k]
        out[f"{KIND_MEMORY[0]}{k}"] = blk.activations.stored
        out[f"{KIND_MEMORY[1]}{k}"] = blk.activations.workspace
    return out


def kind_tables(block: dict, c=None) -> tuple:
    """(time, stored, workspace): each kind's tables of the block tables `block`, in kind order
    (none without `c`, a model of several kinds' context)."""
    kinds = range(len(c.model.block_kinds)) if c else ()
    return tuple([block[f"{prefix}{k}"] for k in kinds] for prefix in (KIND_BLOCK, *KIND_MEMORY))


def key_columns(tables: list, keys: list) -> np.ndarray:
    """[len(keys), len(tables)]: the values of each of `tables` (Keyed by group and microbatch,
    solver.search.cpsat.named) at `keys`, read in bulk (solver.search.cpsat.block_floors.GroupRows):
    the keys' positions found once for the tables sharing them."""
    rows: dict[int, np.ndarray] = {}
    for table in tables:
        if id(table.positions) not in rows:
            rows[id(table.positions)] = table.rows(keys)
    return np.stack([table.array[rows[id(table.positions)]] for table in tables], axis=1) \
        if tables else np.empty((len(keys), 0))


def group_kind_columns(tables, combos: list, classes: list, keys: list, time: bool = True, memory: bool = True) -> tuple:
    """Each kind's block time (with `time`), stored activations and workspace (with `memory`)
    ([len(keys), kinds, K] each) of the groups and microbatches `keys` over the flag
    combinations (block_floors.GroupRows)."""
    times = [[key_columns([table[cb] for cb in combos], keys) for table in tables.kind_blocks]] if time else []
    footprints = [[key_columns([table[(cb[2], cls)] for cb, cls in zip(combos, classes)], keys) for table in kind]
                  for kind in (tables.kind_stored, tables.kind_workspace)] if memory else []
    return tuple(np.stack(kinds, axis=1) if kinds else np.empty((len(keys), 0)) for kinds in (*times, *footprints))


def stage_counts(c, pp: int, interleavings) -> np.ndarray:
    """[V, pp, kinds]: the blocks of each kind each stage holds, for each interleaving of
    `interleavings` (V) (costmodel.terms.stage_kinds.stage_kind_counts)."""
    kinds = tuple(kind for kind, _ in c.model.block_kinds)
    return np.array([stage_kind_counts(c.model.block_order, kinds, pp, int(il)) for il in interleavings])


def first_stage_memory(counts: np.ndarray, kind_stored, kind_workspace) -> tuple:
    """([V, M, K], [V, M, K]): the first stage's stored activations per block (its kinds'
    floors `kind_stored` [M, kinds, K] weighted by its counts: the stage's mean block, as
    costmodel.terms.stage_costs costs it) and its workspace (the largest of `kind_workspace`
    over the kinds it holds), for each interleaving (V) of `counts` (stage_counts)."""
    first = counts[:, 0]                                                                  # [V, kinds]
    shares = first / first.sum(axis=1, keepdims=True)
    stored = np.einsum("vk,mkc->vmc", shares, kind_stored)
    workspace = np.where(first[:, None, :, None] > 0, kind_workspace[None], 0.0).max(axis=2)
    return stored, workspace


def stage_kind_micro(counts: np.ndarray, kind_block, head) -> np.ndarray:
    """[V, M, K]: one microbatch on the slowest stage, bounded below stage by stage from each
    kind's block floor: max over the stages of Σ_kind count(stage, kind) · kind_block[M, kind, K]
    (+ the output layer `head` [M] on the last), for each interleaving (V) of `counts`
    (stage_counts)."""
    stages = np.einsum("vpk,mkc->vpmc", counts, kind_block)
    stages[:, -1] = stages[:, -1] + head[None, :, None]
    return stages.max(axis=1)


def block_time(blk) -> object:
    """One block's time in a microbatch: forward, backward, recompute and exposed offload."""
    return blk.block_fwd_s + blk.block_bwd_s + blk.recompute_s + blk.offload_fwd_s + blk.offload_bwd_s


def least_kind_rows(kinds, times: list | None = None) -> dict:
    """The block tables' rows (solver.search.cpsat.block_tables) one block of any stage
    bounds, the least over the kinds (costmodel.terms.block_terms.KindBlocks): its time in a
    ZB-H1 bubble, its stored activations and its recompute workspace. `times`: each kind's
    block_time where already summed."""
    times = times or [block_time(blk) for blk in kinds.terms]
    zero_bubble = [time - 2 * blk.weight_grad_gemm_s for time, blk in zip(times, kinds.terms)]
    return {name: functools.reduce(np.minimum, values)
            for name, values in (("block_zb", zero_bubble), ("stored", [k.activations.stored for k in kinds.terms]),
                                 ("workspace", [k.activations.workspace for k in kinds.terms]))}


def distinct_layouts(c, pp: int) -> list[int]:
    """One interleaving per distinct layout of pp stages — the (first, middle, last) blocks,
    and with blocks of several kinds each stage's kinds (the chunks move them between stages)
    —, the least giving it: [1] but with a short last chunk or several kinds (and for a pp no
    interleaving lays out)."""
    blocks, first_of = int(c.model.blocks), {}
    kinds = tuple(kind for kind, _ in c.model.block_kinds)
    for il in layout_interleavings(blocks, pp) or (1,):
        layout = stage_blocks(ScalarOps, blocks, pp, interleaving=il)
        if len(kinds) > 1 and layout_problem(blocks, pp, il) is None:
            layout = (layout, stage_kind_counts(c.model.block_order, kinds, pp, il).tobytes())
        first_of.setdefault(layout, il)
    return list(first_of.values())
