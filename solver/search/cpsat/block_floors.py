"""The per-block lower bounds of the surrogate time (block_lower_bounds), computed with numpy
from the surrogate's tables (solver.search.cpsat.tables.Tables), and the same bounds for many
questions that each pin one flag (PinnedFloors, for solver.search.explain).

A skeleton's bounds are a least over a tensor [S, V, M, K]: the (sharding stage, optimizer
offload, shard group) choices S, the interleavings V, the microbatches M and the flag
combinations K the block tables are keyed by (SkeletonFloors). A pinned flag only narrows the
choices on S and K (and whether ZB-H1 may run), so the tensors of the unpinned space hold every
pinned question's values: PinnedFloors keeps them and takes each pin's least over the subset
it admits, the same numbers reduced over the same choices as computing the pinned space anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from collections.abc import Callable

import numpy as np

from costmodel.terms.context import Context
from costmodel.space.dimensions import NETWORK_GROUPS, BlockKey
from costmodel.terms.iteration import RESIDENT_BLOCKS, bubble_microbatches
from costmodel.terms.pipeline import stage_blocks_in_flight
from costmodel.space.layout import end_chunk_blocks, stage_blocks
from costmodel.ops import ArrayOps
from solver.space.declaration import Space
from solver.space.flags import flag_projection

from solver.search.cpsat.kind_floors import (first_stage_memory, group_kind_columns, key_columns, stage_counts,
                                               stage_kind_micro)
from solver.search.cpsat.block_tables import BLOCK_FLAGS, FIT_SLACK, SCHED_ZB_H1, TIME_FLOOR_SLACK, TP_COMM_RS_AG

ALL = slice(None)
"""Every choice on an axis of a skeleton's tensors (the unpinned question's)."""


class GroupRows:
    """The block tables' values of each (tp, cp, ep, etp) group and microbatch over the flag combinations
    `combos` (block_lower_bounds' K axis), read in bulk and kept in the Tables' row memos (shared by
    the GPU counts of one BlockTableCache): the times of every group at once, the memory terms
    of a skeleton's group when its footprints are first checked."""

    def __init__(self, tables, combos: list[tuple[int, ...]]):
        self.tables, self.combos = tables, combos
        self.classes = ["sp_redo" if (comm == TP_COMM_RS_AG and redo) else ("sp" if comm == TP_COMM_RS_AG else "no_sp")
                        for comm, redo, rc, w, a in combos]
        self.memo = tables.row_memo.setdefault(tuple(combos), {})
        self.memory_memo = tables.row_memo.setdefault(("memory", *combos), {})
        self._shapes: dict = {}
        self._fill([key for key in tables.tm_keys if key not in self.memo])

    def _fill(self, keys: list) -> None:                  # (each key's rows: views of one array per table)
        t, combos = self.tables, self.combos
        columns = (*(key_columns([table[cb] for cb in combos], keys) for table in (t.block, t.block_zb)),
                   key_columns([t.head], keys)[:, 0], group_kind_columns(t, combos, self.classes, keys, memory=False)[0])
        for i, key in enumerate(keys):
            self.memo[key] = (*(column[i] for column in columns[:3]), t.p2p.get(key), columns[3][i])

    def of(self, group: tuple, mb: int) -> tuple[np.ndarray, ...]:
        """(block time, ZB-H1 block time) over the combinations, (output layer time, pipeline
        send time) of this group and microbatch, and each kind's block time (kind_floors' rows)."""
        return self.memo[(*group, mb)]

    def memory(self, group: tuple, microbatches: tuple) -> list[tuple[np.ndarray, ...]]:
        """(stored activations, workspace) over the combinations and each kind's, of this group
        at each of `microbatches`."""
        keys = [(*group, mb) for mb in microbatches]
        missing = [key for key in keys if key not in self.memory_memo]
        if missing:
            t, combos = self.tables, self.combos
            memory = [[table[(cb[2], cl)] for cb, cl in zip(combos, self.classes)] for table in (t.stored, t.workspace)]
            columns = (*(key_columns(tables, missing) for tables in memory),
                       *group_kind_columns(t, combos, self.classes, missing, time=False))
            for i, key in enumerate(missing):
                self.memory_memo[key] = tuple(column[i] for column in columns)
        return [self.memory_memo[key] for key in keys]

    def shape(self, c: Context, sk, local_batch: int) -> PipelineShape:
        """The PipelineShape of this skeleton (kept for the skeletons of the same shape)."""
        key = (sk.pp, sk.interleavings, sk.microbatches, local_batch)
        if key not in self._shapes:
            self._shapes[key] = PipelineShape.of(c, self.tables.several_kinds, sk, local_batch)
        return self._shapes[key]


def offers_zero_bubble(space: Space, num_networks: int) -> bool:
    """Whether some mapping of the space (with pp > 1) may run ZB-H1."""
    known = {**{name: 2 for name, _ in NETWORK_GROUPS}, "dp_cp": 2, "offload": 1}
    return (SCHED_ZB_H1,) in flag_projection(space, ("sched",), known, num_networks)


@dataclass(frozen=True)
class FloorChoices:
    """What the floors read of a space: every valid assignment of the flags a block reads (the
    space's own rules, with tp, pp and dp > 1: the K axis), the sharding stages and shard groups
    it admits, and whether ZB-H1 may run."""

    combos: list[tuple[int, ...]]
    zero_codes: tuple[int, ...]
    shard_codes: tuple[int, ...]
    zero_bubble: bool

    @cached_property
    def activation_offload(self) -> np.ndarray:
        """[K]: whether each combination offloads activations."""
        return np.array([cb[4] for cb in self.combos], dtype=bool)

    @cached_property
    def weight_offload(self) -> np.ndarray:
        """[K]: whether each combination offloads weights (0 or 1)."""
        return np.array([cb[3] for cb in self.combos])

    @cached_property
    def weight_offload_index(self) -> np.ndarray:
        return self.weight_offload.astype(np.intp)

    @classmethod
    def of(cls, space: Space, has_offload: bool, num_networks: int) -> FloorChoices:
        known = {**{name: 2 for name, _ in NETWORK_GROUPS}, "dp_cp": 2, "offload": int(has_offload)}
        return cls(sorted(flag_projection(space, BLOCK_FLAGS, known, num_networks)),
                   tuple(code for (code,) in flag_projection(space, ("zero",), known, num_networks)),
                   tuple(space.codes("shard")), offers_zero_bubble(space, num_networks))


@dataclass(frozen=True)
class SkeletonFloors:
    """One skeleton's surrogate times before the least is taken: `time` [V, M, K] without the
    optimizer and DP terms, `zb` [M, K] ZB-H1's on the non-interleaved row `zb_row` (None
    where ZB-H1 is not offered there), `fits` [S, V, M, K] whether the HBM and offload
    footprints fit, `extra` [S, 1, M] the optimizer and DP terms; S lists `choices` (sharding
    stage, optimizer offload, StageTables). None of them where no choice is left."""

    keys: list[BlockKey]
    choices: list[tuple]
    time: np.ndarray | None
    zb: np.ndarray | None
    zb_row: int
    fits: np.ndarray | None
    extra: np.ndarray | None

    def least(self, on_s, on_k, zero_bubble: bool) -> np.ndarray:
        """Each block's floor (block_keys order) over the choices `on_s` of S and `on_k` of K
        (index arrays, or ALL), with ZB-H1 where `zero_bubble` and offered here; inf where
        nothing fits or no choice is left."""
        if self.time is None or (not isinstance(on_s, slice) and len(on_s) == 0):
            return np.full(len(self.keys), np.inf)
        fits = self.fits[on_s][..., on_k]
        times = np.where(fits, self.time[..., on_k][None], np.inf).min(axis=3)                 # [S, V, M]
        if zero_bubble and self.zb is not None:
            row = self.zb_row
            zb = np.where(fits[:, row], self.zb[:, on_k][None], np.inf).min(axis=2)            # [S, M]
            times[:, row] = np.minimum(times[:, row], zb)
        best = (times + self.extra[on_s]).min(axis=0)                                          # [V, M]
        return (best * TIME_FLOOR_SLACK).ravel()


def block_lower_bounds(tables, c: Context, space: Space, skeletons, local_batch: dict, has_offload: bool,
                       num_networks: int, hbm_capacity_bytes: float, check: Callable[[], None] | None = None) -> dict:
    """For each (tp, cp, ep, etp, pp, interleaving, microbatch) block, the smallest value the surrogate
    time takes over the memory-relevant flags whose HBM and offload footprints fit (inf when
    none does). Computed with numpy from the surrogate's own tables, with the pipeline
    bubble and the blocks in flight exactly as the model counts them for this interleaving
    and microbatch (which the CP-SAT objective only bounds), so it is a lower bound of every
    exact time in the block and every footprint it checks is the exact one. It ranks
    candidates for exact scoring, and its minimum per (tp, pp) split and per (tp,
    microbatch) becomes a cut that gives CP-SAT's LP the bound its one-hot relaxation
    cannot."""
    choices = FloorChoices.of(space, has_offload, num_networks)
    rows = GroupRows(tables, choices.combos)
    out = {}
    for sk in skeletons:
        if check is not None:
            check()                   # a deadline's: raises when it has passed
        floors = skeleton_floors(tables, c, choices, rows, sk, local_batch[sk.split], has_offload, hbm_capacity_bytes)
        out.update(zip(floors.keys, floors.least(ALL, ALL, choices.zero_bubble).tolist()))
    return out


class PinnedFloors:
    """block_lower_bounds of the space with one flag pinned, for many pins in turn: each
    skeleton's tensors are computed once for the space itself, and a pin's floors are their
    least over the flag combinations, sharding stages and shard groups the pinned space still
    admits. Pinning only narrows those, so these are the same numbers reduced over the same
    choices as block_lower_bounds of the pinned space, at the cost of a few minima per skeleton;
    a pin that would widen them (none does) is computed anew."""

    def __init__(self, tables, c: Context, space: Space, skeletons, local_batch: dict, has_offload: bool,
                 num_networks: int, hbm_capacity_bytes: float):
        self.tables, self.c, self.skeletons, self.local_batch = tables, c, skeletons, local_batch
        self.has_offload, self.num_networks, self.hbm_capacity_bytes = has_offload, num_networks, hbm_capacity_bytes
        self.choices = FloorChoices.of(space, has_offload, num_networks)
        self._floors: list[SkeletonFloors] | None = None
        self._keys: list[BlockKey] = []                     # every skeleton's blocks in turn
        self._key_columns = np.empty((len(BlockKey._fields), 0), dtype=np.int64)   # their fields, one row each

    def of(self, pinned_space: Space) -> dict:
        """block_lower_bounds(pinned_space): each block's floor with the pin's choices only."""
        floors = self._narrowed(pinned_space)
        if floors is None:
            return block_lower_bounds(self.tables, self.c, pinned_space, self.skeletons, self.local_batch,
                                      self.has_offload, self.num_networks, self.hbm_capacity_bytes)
        return dict(zip(self._keys, floors.tolist()))

    def ranked(self, pinned_space: Space) -> list[tuple[float, BlockKey]]:
        """ranking(self.of(pinned_space)), sorted with numpy: by floor, ties by block key."""
        floors = self._narrowed(pinned_space)
        if floors is None:
            return ranking(self.of(pinned_space))
        order = np.lexsort((*self._key_columns[::-1], floors))           # (the last key sorts first)
        order = order[np.isfinite(floors[order])]
        return list(zip(floors[order].tolist(), map(self._keys.__getitem__, order.tolist())))

    def _narrowed(self, pinned_space: Space) -> np.ndarray | None:
        """Every block's floor with the pin's choices only (the skeletons' blocks in turn), None
        where the pin admits a choice the space's tensors lack or no flag combination."""
        narrow, wide = FloorChoices.of(pinned_space, self.has_offload, self.num_networks), self.choices
        position = {combo: k for k, combo in enumerate(wide.combos)}
        if (not narrow.combos or not set(narrow.combos) <= position.keys()
                or not set(narrow.zero_codes) <= set(wide.zero_codes)
                or not set(narrow.shard_codes) <= set(wide.shard_codes) or narrow.zero_bubble > wide.zero_bubble):
            return None
        on_k = ALL if narrow.combos == wide.combos else np.array([position[combo] for combo in narrow.combos])
        parts = []
        for sk, floors in zip(self.skeletons, self._skeleton_floors(), strict=True):
            stages = narrow.zero_codes if sk.dp * sk.cp > 1 else (0,)
            on_s = np.array([i for i, (z, _, t) in enumerate(floors.choices)
                             if z in stages and t.code in narrow.shard_codes], dtype=np.intp)
            parts.append(floors.least(ALL if len(on_s) == len(floors.choices) else on_s, on_k, narrow.zero_bubble))
        return np.concatenate(parts) if parts else np.empty(0)

    def _skeleton_floors(self) -> list[SkeletonFloors]:
        if self._floors is None:
            rows = GroupRows(self.tables, self.choices.combos)
            self._floors = [skeleton_floors(self.tables, self.c, self.choices, rows, sk, self.local_batch[sk.split],
                                            self.has_offload, self.hbm_capacity_bytes) for sk in self.skeletons]
            self._keys = [key for floors in self._floors for key in floors.keys]
            self._key_columns = np.array(self._keys, dtype=np.int64).reshape(len(self._keys), len(BlockKey._fields)).T
        return self._floors


def ranking(floors: dict) -> list[tuple[float, BlockKey]]:
    """The blocks with a finite floor as (floor, block), least first (ties by block key): the
    order a question's warm start scores them in."""
    return sorted((floor, key) for key, floor in floors.items() if math.isfinite(floor))


@dataclass(frozen=True)
class PipelineShape:
    """What a skeleton's floors read of its pipeline alone — pp, its interleavings (V), its
    microbatches (M) and its local batch —, the same for every skeleton of that shape: the
    microbatch counts n [M], the interleavings [V, 1], the bubble [V, M] (costmodel.terms.pipeline),
    the fullest and the last stage's blocks ([V, 1, 1] or one value; `equal` when the stages
    are), the first stage's blocks in flight [V, M, 1], the non-interleaved row ZB-H1 may run on
    (None without one) with its last stage's blocks, and with blocks of several kinds each
    stage's counts [V, pp, kinds] (kind_floors.stage_counts)."""

    n: np.ndarray
    il: np.ndarray
    bubble: np.ndarray
    fullest: object
    last: object
    equal: bool
    inflight: np.ndarray
    zb_row: int | None
    zb_last: float
    counts: np.ndarray | None

    @classmethod
    def of(cls, c: Context, several_kinds: bool, sk, local_batch: int) -> PipelineShape:
        blocks, p = c.model.blocks, sk.pp
        n = local_batch / np.array(sk.microbatches, dtype=float)                 # [M]
        il = np.array(sk.interleavings, dtype=float)[:, None]                   # [V, 1]
        first, middle, last = stage_blocks(ArrayOps, blocks, p, interleaving=il)           # [V, 1] (or one value)
        equal = first is middle is last
        chunks = None if equal else end_chunk_blocks(ArrayOps, blocks, p, il)
        inflight = stage_blocks_in_flight(ArrayOps, first, middle, last, p, il, n[None, :], chunks)[0][:, :, None]
        row = sk.interleavings.index(1) if p > 1 and 1 in sk.interleavings else None
        return cls(n, il, bubble_microbatches(ArrayOps, p, il, n[None, :]),
                   np.asarray(np.maximum(first, middle))[..., None], np.asarray(last)[..., None], equal,
                   np.broadcast_to(inflight, (len(il), len(n), 1)), row,
                   0.0 if row is None else np.broadcast_to(last, il.shape)[row, 0],
                   stage_counts(c, p, sk.interleavings) if several_kinds else None)


@dataclass(frozen=True)
class SkeletonTimes:
    """One skeleton's times before its memory is checked: the choices `zo` (S: sharding stage,
    optimizer offload, StageTables), its PipelineShape, `time` [V, M, K] without the optimizer
    and DP terms, ZB-H1's `zb` [M, K] on the non-interleaved row (None where not offered) and
    `extra` [S, 1, M], the optimizer and DP terms."""

    zo: list
    shape: PipelineShape
    time: np.ndarray
    zb: np.ndarray | None
    extra: np.ndarray

    @property
    def zb_row(self) -> int:
        return self.shape.zb_row or 0

    def least_time(self) -> float:
        """A lower bound of every floor of the skeleton's blocks with no footprint checked: the
        least over the flag combinations and the choices of each term, taken apart
        (SkeletonFloors.least takes them together, over what fits; sums and products of
        smaller floats round to no more)."""
        times = self.time.min(axis=2)                                                     # [V, M]
        if self.zb is not None:
            times[self.zb_row] = np.minimum(times[self.zb_row], self.zb.min(axis=1))
        return float(((times + self.extra.min(axis=0)) * TIME_FLOOR_SLACK).min())


def skeleton_times(tables, c: Context, choices: FloorChoices, rows: GroupRows, sk, local_batch: int,
                   has_offload: bool) -> SkeletonTimes | None:
    """One skeleton's SkeletonTimes over the space's `choices` (None where no shard group the
    space admits holds it: nothing fits)."""
    key = sk.split
    # every (sharding stage z, optimizer offload o, shard group t) at once, on a leading axis S
    # (a stage of no sharding takes the whole group only)
    stages = choices.zero_codes if sk.dp * sk.cp > 1 else (0,)
    zo = [(z, o, t) for z in stages for o in ((0, 1) if has_offload else (0,))
          for t in (tables.by_shard if z > 0 else tables.by_shard[:1])
          if key in t.splits and t.code in choices.shard_codes]
    if not zo:
        return None
    shape = rows.shape(c, sk, local_batch)
    group = sk.group
    per_mb = [rows.of(group, mb) for mb in sk.microbatches]
    time, zb = _pipeline_times(tables, choices.zero_bubble, sk.pp, shape, per_mb)
    at = tables.split_index[key]
    extra = (_on_s([t.optimizer[z][at] + t.dp_once[z][at] for z, _, t in zo])[:, :, :, 0]
             + _on_s([t.dp_per_microbatch[z][at] for z, _, t in zo])[:, :, :, 0] * shape.n)    # [S, 1, M]
    return SkeletonTimes(zo, shape, time, zb, extra)


def skeleton_floors(tables, c: Context, choices: FloorChoices, rows: GroupRows, sk, local_batch: int,
                    has_offload: bool, hbm_capacity_bytes: float) -> SkeletonFloors:
    """One skeleton's tensors (SkeletonFloors) over the space's `choices`."""
    keys = block_keys(sk.split, sk.interleavings, sk.microbatches)
    timed = skeleton_times(tables, c, choices, rows, sk, local_batch, has_offload)
    if timed is None:                 # no shard group the space admits: nothing fits
        return SkeletonFloors(keys, [], None, None, 0, None, None)
    fits = _fits(tables, c, choices, rows, sk, timed, hbm_capacity_bytes)
    return SkeletonFloors(keys, timed.zo, timed.time, timed.zb, timed.zb_row, fits, timed.extra)


def _pipeline_times(tables, zero_bubble: bool, p: int, shape: PipelineShape, per_mb: list) -> tuple:
    """(time [V, M, K] without the optimizer and DP terms, ZB-H1's time [M, K] on the
    non-interleaved row or None): the pipeline bubble and the slowest stage as the model counts
    them (costmodel.terms.pipeline, per interleaving, with uneven stages)."""
    n, il = shape.n, shape.il
    block = np.array([r[0] for r in per_mb])                             # [M, K]
    head = np.array([r[2] for r in per_mb])                              # [M]
    sends = np.array([r[3] for r in per_mb]) if p > 1 else np.zeros(len(n))
    if tables.several_kinds:              # each stage its own blocks (kind_floors.stage_kind_micro)
        per_micro = stage_kind_micro(shape.counts, np.array([r[4] for r in per_mb]), head)
    else:
        per_micro = np.broadcast_to(np.maximum(shape.fullest * block, shape.last * block + head[:, None]),
                                    (len(il), *block.shape))                       # [V, M, K]
    time = (n[None, :] + shape.bubble)[:, :, None] * (per_micro + (2 * il * sends[None, :])[:, :, None])
    zb = None
    if zero_bubble and shape.zb_row is not None:
        # ZB-H1 on the non-interleaved row: n microbatches + (p-1) bubble ones without W
        block_zb = np.array([r[1] for r in per_mb])
        sends_1 = (2 * sends)[:, None]
        # (uneven, or of several kinds, a stage without the output layer may set the pace)
        zb_head = head[:, None] if shape.equal and not tables.several_kinds else 0.0
        zb = (n[:, None] * (per_micro[shape.zb_row] + sends_1)
              + (p - 1) * (shape.zb_last * block_zb + zb_head + sends_1))
    return time, zb


def _fits(tables, c: Context, choices: FloorChoices, rows: GroupRows, sk, timed: SkeletonTimes,
          hbm_capacity_bytes: float) -> np.ndarray:
    """[S, V, M, K]: whether a first-stage GPU's HBM and offload footprints fit, for each choice
    of the skeleton's `zo`: the same sums, in the same order, as one choice at a time."""
    zo, inflight = timed.zo, timed.shape.inflight
    per_mb = rows.memory(sk.group, sk.microbatches)          # (stored, workspace, each kind's)
    a_off, w_off, w_index = choices.activation_offload, choices.weight_offload, choices.weight_offload_index
    stored, workspace = (np.array([r[i] for r in per_mb])[None] for i in (0, 1))       # [1, M, K]
    if tables.several_kinds:              # the first stage's own kinds ([V, M, K])
        stored, workspace = first_stage_memory(timed.shape.counts, np.array([r[2] for r in per_mb]),
                                               np.array([r[3] for r in per_mb]))
    # a first-stage GPU's (the tables' memory terms are the first stage's too)
    all_activations = stored * inflight                                                        # [V, M, K]
    activations_hbm = np.where(a_off, np.minimum(RESIDENT_BLOCKS, inflight) * stored, all_activations)
    activations_offloaded = np.where(a_off, all_activations, 0.0)
    at = tables.split_index[sk.split]
    by_switch = np.array([[t.weights_hbm[(z, w)][at] for w in (0, 1)] for z, _, t in zo])   # [S, 2]
    weights = by_switch[:, w_index][:, None, None, :]                                          # [S, 1, 1, K]
    memory = (weights + activations_hbm[None] + workspace[None]
              + _on_s([t.optimizer_hbm[(z, o)][at] for z, o, t in zo])
              + _on_s([t.embedding[z][at] for z, _, t in zo]))                          # [S, V, M, K]
    offloaded = (w_off * _on_s([t.weights_and_grads[z][at] for z, _, t in zo])
                 + _on_s([o * t.optimizer_state[z][at] for z, o, t in zo]) + activations_offloaded[None])
    # (a hair of slack: these sums round differently from the evaluator's)
    return (memory <= hbm_capacity_bytes * FIT_SLACK) & (offloaded <= c.memory.offload_capacity_bytes * FIT_SLACK)


def block_keys(split: tuple, interleavings: tuple, microbatches: tuple) -> list[BlockKey]:
    """The blocks of a split, interleaving-major (a [V, M] table's order, raveled)."""
    new = tuple.__new__
    return [new(BlockKey, (*split, il, mb)) for il in interleavings for mb in microbatches]


def _on_s(values: list) -> np.ndarray:
    """One value per (sharding stage, optimizer offload) on the leading axis of [S, V, M, K]."""
    return np.array(values)[:, None, None, None]
