"""Every mapping of a space as `MappingArrays`, built with numpy in bounded chunks.

Order (deterministic, and the tie-break order of the brute-force search): skeletons by tp
ascending, then cp, ep and pp ascending; inside a skeleton, interleaving ascending, then microbatch
ascending, then the flag combinations in lexicographic order of their codes in
`Space.flags` order (recompute, tp_comm, tp_overlap, zero, seq_par_ag_redo,
dp_overlap, weight_offload, activations_offload, optimizer_offload, tp_net, pp_net,
dp_net). Since dp and batch follow from (tp, cp, ep, etp, pp), this is the lexicographic order of
the tuple (tp, cp, ep, etp, pp, interleaving, microbatch, recompute, tp_comm, ..., dp_net).

The position of a mapping in that order is its **ordinal**. A chunk is a contiguous range
of ordinals inside one skeleton: row r of skeleton s has interleaving index
r // (microbatches·flags), microbatch index (r // flags) % microbatches and flag row
r % flags, so a chunk is built with integer division and table look-ups, not a Python loop
per mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from costmodel.space.dimensions import DIMENSIONS
from costmodel.encoding import MappingArrays
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from solver.space.count import count_flag_combinations
from solver.space.declaration import Skeleton, Space, coarse_facts, facts, skeletons
from solver.space.flags import FlagTable, flag_table

DEFAULT_CHUNK_ROWS = 1 << 20
"""Rows per chunk: about 1M mappings, ~60 MB of columns before evaluation."""

@dataclass(frozen=True)
class ChunkSpec:
    """Rows [start, stop) of skeleton number `skeleton_index`; `ordinal` is the global
    ordinal of its first row."""

    skeleton_index: int
    start: int
    stop: int
    ordinal: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


class FlagTables:
    """The flag tables of a plan's skeletons, each built when first read (flag_table caches
    them by skeleton facts): a search reads the tables of the few blocks it scores, and
    building every one up front (hybrid sharding's codes make them many and long) cost more
    than the search."""

    def __init__(self, space: Space, system: System, skels: tuple[Skeleton, ...]):
        self._space, self._system, self._skeletons = space, system, skels

    def __getitem__(self, index: int) -> FlagTable:
        return flag_table(self._space, self._skeletons[index], self._system)

    def __len__(self) -> int:
        return len(self._skeletons)

    def __iter__(self) -> Iterator[FlagTable]:
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True)
class Plan:
    """Everything needed to build any chunk: the skeletons, their flag tables (rows of flag
    codes in `space.flags` order) and the chunks."""

    space: Space
    skeletons: tuple[Skeleton, ...]
    flag_tables: FlagTables
    chunks: tuple[ChunkSpec, ...]

    @property
    def total(self) -> int:
        return sum(c.rows for c in self.chunks)

    def build(self, chunk: ChunkSpec) -> MappingArrays:
        return build_rows(self.space, self.skeletons[chunk.skeleton_index], self.flag_tables[chunk.skeleton_index],
                          chunk.start, chunk.stop)

    def block(self, skeleton_index: int, interleaving: int, microbatch: int,
              flag_rows: np.ndarray | None = None) -> tuple[MappingArrays, np.ndarray]:
        """Every mapping of one (tp, pp, interleaving, microbatch) block — the flag combinations
        of skeleton `skeleton_index` at that interleaving and microbatch — and their ordinals;
        `flag_rows`: only those rows of the block (indices into its flag table)."""
        sk, table = self.skeletons[skeleton_index], self.flag_tables[skeleton_index]
        start = (sk.interleavings.index(interleaving) * len(sk.microbatches)
                 + sk.microbatches.index(microbatch)) * len(table)
        first = next(c.ordinal - c.start for c in self.chunks if c.skeleton_index == skeleton_index)
        row = start + (np.arange(len(table), dtype=np.int64) if flag_rows is None else np.asarray(flag_rows, np.int64))
        return rows_at(self.space, sk, table, row), first + row


def skeleton_rows(skeleton: Skeleton, flag_rows: int) -> int:
    """Mappings on one skeleton: interleavings × microbatches × flag combinations."""
    return len(skeleton.interleavings) * len(skeleton.microbatches) * flag_rows


def plan(model: Model, system: System, num_gpus: int, max_batch: int, space: Space,
         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Plan:
    """Split the space into chunks of at most `chunk_rows` mappings, in enumeration order."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows {chunk_rows} must be > 0")
    kept, sizes = [], []
    for sk in skeletons(model, num_gpus, max_batch, space):
        # the flag table's length in closed form (solver.space.count; the table itself is
        # built when a chunk or block of the skeleton is)
        flag_rows = count_flag_combinations(space, coarse_facts(facts(sk, system)), len(system.networks))
        if not flag_rows:
            continue            # pinned flags no mapping of this split can take: none of it is left
        kept.append(sk)
        sizes.append(flag_rows)
    skels = tuple(kept)
    chunks = []
    ordinal = 0
    for index, (sk, flag_rows) in enumerate(zip(skels, sizes)):
        rows = skeleton_rows(sk, flag_rows)
        for start in range(0, rows, chunk_rows):
            stop = min(start + chunk_rows, rows)
            chunks.append(ChunkSpec(index, start, stop, ordinal + start))
        ordinal += rows
    return Plan(space, skels, FlagTables(space, system, skels), tuple(chunks))


def build_rows(space: Space, skeleton: Skeleton, table: FlagTable, start: int, stop: int) -> MappingArrays:
    """Rows [start, stop) of one skeleton (see the module docstring for the layout)."""
    return rows_at(space, skeleton, table, np.arange(start, stop, dtype=np.int64))


def rows_at(space: Space, skeleton: Skeleton, table: FlagTable, row: np.ndarray) -> MappingArrays:
    """The skeleton's rows at indices `row` (in its own enumeration order)."""
    n = len(row)
    n_flags, n_mb = len(table), len(skeleton.microbatches)
    flag_row = row % n_flags
    mb_index = (row // n_flags) % n_mb
    il_index = row // (n_flags * n_mb)
    per_split = {"interleaving": np.asarray(skeleton.interleavings, dtype=np.int64)[il_index],
                 "microbatch": np.asarray(skeleton.microbatches, dtype=np.int64)[mb_index]}
    columns = {dim.name: codes for dim, codes in zip(space.flags, table.columns(flag_row))}
    for dim in DIMENSIONS:
        if dim.kind == "split":
            columns[dim.name] = np.full(n, getattr(skeleton, dim.name), dtype=np.int64)
    return MappingArrays.of(**columns, **per_split)


def iter_chunks(model: Model, system: System, num_gpus: int, max_batch: int, space: Space,
                chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[ChunkSpec, MappingArrays]]:
    """Each chunk with its spec, in enumeration order."""
    p = plan(model, system, num_gpus, max_batch, space, chunk_rows)
    for chunk in p.chunks:
        yield chunk, p.build(chunk)


def enumerate_all(model: Model, system: System, num_gpus: int, max_batch: int, space: Space) -> MappingArrays:
    """The whole space as one MappingArrays — for small spaces (tests, plotting)."""
    p = plan(model, system, num_gpus, max_batch, space)
    if not p.chunks:
        return MappingArrays.from_mappings([])
    return MappingArrays.concatenate([p.build(c) for c in p.chunks])
