"""The block floors of a space, computed a skeleton at a time as a search's ranking reaches
them (LazyFloors): the same floors as solver.search.cpsat.block_floors.block_lower_bounds,
in the same order, for the skeletons a search reads, and all of them when asked.

A skeleton's floors check every block's HBM and offload footprints over every sharding stage,
shard group and flag combination ([S, V, M, K]); its time alone, with no footprint checked
(SkeletonTimes.least_time), is a fraction of that work and bounds every one of its floors from
below. The ranking is a heap of blocks by (floor, block) and of skeletons not yet computed by
that bound: a skeleton is computed when its bound reaches the head, before any block of an
equal floor, so the blocks come out in the order sorting every floor would give. A certified
search stops at the first floor above its answer's time; the skeletons whose bound lies above
it are never computed (DeepSeek-V3 on 2,048 H100s: 340 of 11,975).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator

from costmodel.terms.context import Context
from solver.space.declaration import Space

from solver.search.cpsat.block_floors import ALL, FloorChoices, GroupRows, skeleton_floors, skeleton_times

SKELETON, BLOCK = 0, 1
"""What a heap entry holds, in the order of equal values: a skeleton before a block, so that a
skeleton whose bound ties a block's floor is computed before that block comes out."""


class LazyFloors:
    """block_lower_bounds(tables, c, space, skeletons, ...) at the context's HBM and offload
    capacities as a ranking (`ranked`: (floor, block) of the finite floors, ascending, ties by
    block) computed as far as it is read, and as the whole dict (`all`). `check` is called
    before each skeleton's bound (a deadline's: raises when it has passed)."""

    def __init__(self, tables, c: Context, space: Space, skeletons, local_batch: dict, num_networks: int,
                 check: Callable[[], None] | None = None):
        self.tables, self.c, self.skeletons, self.local_batch = tables, c, skeletons, local_batch
        self.has_offload, self.hbm_capacity_bytes = c.memory.offload_capacity_bytes > 0, c.memory.hbm_capacity_bytes
        has_offload = self.has_offload
        self.choices = FloorChoices.of(space, has_offload, num_networks)
        self.rows = GroupRows(tables, self.choices.combos)
        self._computed: dict[int, dict] = {}               # skeleton index -> its blocks' floors
        heap = []
        for index, sk in enumerate(skeletons):
            if check is not None:
                check()
            timed = skeleton_times(tables, c, self.choices, self.rows, sk, local_batch[sk.split], has_offload)
            bound = math.inf if timed is None else timed.least_time()
            if not bound < math.inf:                       # nothing fits (or a NaN: computed first)
                if math.isnan(bound):
                    heap.append((-math.inf, SKELETON, index))
                continue
            heap.append((bound, SKELETON, index))
        heapq.heapify(heap)
        self._heap, self._ranked = heap, []
        self.ranked = _Ranking(self)

    def all(self) -> dict:
        """Every block's floor (inf where nothing fits), skeleton by skeleton in the space's
        order: block_lower_bounds' dict."""
        out = {}
        for index in range(len(self.skeletons)):
            out.update(self._floors_of(index))
        return out

    def _floors_of(self, index: int) -> dict:
        if index not in self._computed:
            sk = self.skeletons[index]
            floors = skeleton_floors(self.tables, self.c, self.choices, self.rows, sk, self.local_batch[sk.split],
                                     self.has_offload, self.hbm_capacity_bytes)
            self._computed[index] = dict(zip(floors.keys, floors.least(ALL, ALL, self.choices.zero_bubble).tolist()))
        return self._computed[index]

    def _grow(self) -> bool:
        """One more block on the ranking (computing the skeletons the heap reaches first);
        False when none is left."""
        while self._heap:
            value, what, item = heapq.heappop(self._heap)
            if what == BLOCK:
                self._ranked.append((value, item))
                return True
            for key, floor in self._floors_of(item).items():
                if math.isfinite(floor):
                    heapq.heappush(self._heap, (floor, BLOCK, key))
        return False


class _Ranking:
    """(floor, block) of every finite floor, ascending (ties by block), as far as it is read;
    each iteration starts from the least."""

    def __init__(self, floors: LazyFloors):
        self._floors = floors

    def __iter__(self) -> Iterator[tuple[float, tuple]]:
        ranked, position = self._floors._ranked, 0
        while position < len(ranked) or self._floors._grow():
            yield ranked[position]
            position += 1
