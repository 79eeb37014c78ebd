"""The space's flags on a skeleton: every valid combination of their codes (`flag_combinations`),
their projections onto a few flags (`flag_projection`), and the flag table of a skeleton
(`FlagTable`, `flag_table`), held as the product it is.

A flag is free or pinned by conditions on the skeleton facts and on earlier flags
(costmodel.space.dimensions). The trailing flags of `full` (the optimizer offload, the
schedule, the networks) read skeleton facts alone, so every valid row of the leading flags
takes every valid row of the trailing ones: a table of a million rows is a few thousand
rows times a few hundred, and what is decided per class of rows (the engine's capacity and
structure checks) is decided on the two factors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from costmodel.inputs.system import System
from costmodel.ops import distinct_table_rows
from solver.space.declaration import Skeleton, Space, coarse_facts, facts


def flag_combinations(space: Space, known: dict[str, int], num_networks: int,
                      names: frozenset[str] | None = None) -> np.ndarray:
    """Valid flag code rows (int32, columns in `space.flags` order; repeated as contiguous columns,
    then laid out row by row once), lexicographic in that order:
    built one flag at a time, each partial row extended by the codes its flag may take (and
    the space's pins admit), with numpy: row r's extensions follow one another where r stood.
    `names`: only those flags' columns (a set closed under the flags their conditions read)."""
    dims = tuple(dim for dim in space.flags if names is None or dim.name in names)
    position = {dim.name: i for i, dim in enumerate(dims)}
    # each flag's column over the rows of its own step and each row's parent row of the step
    # before (the table is gathered once at the end, not copied whole at every step); the
    # columns a later flag's condition reads are kept at the current rows
    read = {c.subject for dim in dims for c in dim.free_when if c.subject in position}
    columns, parents, current = [], [], {}
    rows = 1
    for dim in dims:
        domain = dim.domain(num_networks, known)
        free = tuple(code for code in domain if space.admits(dim.name, code))
        pinned = free[:1] if free[:1] == domain[:1] else ()
        if not all(c.holds(known) for c in dim.free_when if c.subject in known):
            may = np.zeros(rows, dtype=bool)
        else:
            may = np.ones(rows, dtype=bool)
            for c in dim.free_when:
                if c.subject not in known:
                    may &= np.asarray(c.holds_for(current[c.subject]), dtype=bool)
        counts = np.where(may, len(free), len(pinned))
        parent = np.repeat(np.arange(rows), counts)
        offset = np.arange(len(parent)) - np.repeat(np.cumsum(counts) - counts, counts)
        free_codes, pinned_codes = np.asarray(free, dtype=np.int64), np.asarray(pinned or (0,), dtype=np.int64)
        columns.append(np.where(may[parent], free_codes[np.minimum(offset, len(free) - 1)] if free else 0,
                                pinned_codes[np.minimum(offset, len(pinned_codes) - 1)]))
        parents.append(parent)
        current = {name: column[parent] for name, column in current.items()}
        if dim.name in read:
            current[dim.name] = columns[-1]
        rows = len(parent)
    combos, below = np.empty((len(dims), rows), dtype=np.int32), np.ones(rows, dtype=np.int64)
    for j in reversed(range(len(dims))):      # each step's value repeated over the final rows below it
        combos[j] = np.repeat(columns[j].astype(np.int32, copy=False), below)
        below = np.bincount(parents[j], below, len(parents[j - 1]) if j else 1).astype(np.int64)
    return np.ascontiguousarray(combos.T)


PROJECTIONS_KEPT = 4096
"""Flag projections kept (small tuples: `explain` asks ~1,000 distinct ones of one space, and
256 of them evicted one another)."""


def flag_projection(space: Space, names: tuple[str, ...], known: dict[str, int],
                    num_networks: int) -> list[tuple[int, ...]]:
    """The distinct valid assignments of the flags `names` (codes in that order) given the
    skeleton facts `known`: the valid flag combinations projected onto those flags (cached:
    the surrogate asks the same few projections of a space many times)."""
    return list(_projection_cached(space, tuple(names), tuple(sorted(known.items())), num_networks))


@lru_cache(maxsize=PROJECTIONS_KEPT)
def _projection_cached(space: Space, names: tuple[str, ...], known: tuple[tuple[str, int], ...],
                       num_networks: int) -> tuple[tuple[int, ...], ...]:
    # only the flags projected and those their conditions read, in turn: the others multiply
    # every assignment of these alike (hybrid sharding's codes, the networks), so the distinct
    # assignments are the same without them
    needed = set(names)
    by_name = {dim.name: dim for dim in space.flags}
    while True:
        more = {c.subject for name in needed for c in by_name[name].free_when if c.subject in by_name} - needed
        if not more:
            break
        needed |= more
    kept = [dim.name for dim in space.flags if dim.name in needed]
    position = {name: i for i, name in enumerate(kept)}
    index = [position[name] for name in names]
    projected = flag_combinations(space, dict(known), num_networks, frozenset(needed))[:, index]
    rows, first = np.unique(projected, axis=0, return_index=True)      # distinct, kept in order of first sight
    return tuple(map(tuple, rows[np.argsort(first)].tolist()))


FLAG_TABLES_KEPT = 64
"""Flag tables kept (one per space, skeleton facts and network count: a search asks a few;
each holds its two factors and their classes, at most a few megabytes)."""


@dataclass(frozen=True)
class RowClasses:
    """A flag table's rows in classes by some of its columns (rows agreeing on them), found on
    the two factors: class h·tails + t holds the rows whose head row is in the head's class h
    and whose tail row is in the tail's class t (every pair occurs: the table is their product)."""

    first: np.ndarray       # a row of the table in each class
    head: np.ndarray        # each head row's class among the head's
    tail: np.ndarray        # each tail row's class among the tail's
    tails: int              # the tail's classes

    def at(self, per_class: np.ndarray) -> np.ndarray:
        """A value of each class at every row of the table, in row order."""
        return per_class.reshape(-1, self.tails)[self.head].take(self.tail, axis=1).ravel()

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The class of each of the table's rows `rows`."""
        head_row, tail_row = np.divmod(rows, len(self.tail))
        return self.head[head_row] * self.tails + self.tail[tail_row]


def _part_classes(part: np.ndarray, columns: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(a row of each class, each row's class) of one factor's rows by its `columns`."""
    if not columns:
        return np.zeros(1, dtype=np.int64), np.zeros(len(part), dtype=np.int32)
    first, inverse, _ = distinct_table_rows(part, columns)
    return first, inverse.astype(np.int32)


@dataclass(frozen=True, eq=False)
class FlagTable:
    """Every valid flag combination on a skeleton (codes, columns in `space.flags` order), as the
    product of `head`, the valid rows of the leading flags, and `tail`, the valid rows of the
    trailing flags, which read no leading flag. Row r is head[r // len(tail)] followed by
    tail[r % len(tail)]: lexicographic, as the whole table would be. Read-only, shared by every
    skeleton with the same facts."""

    head: np.ndarray
    tail: np.ndarray
    _classes: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.head) * len(self.tail)

    def columns(self, rows: np.ndarray) -> list[np.ndarray]:
        """Each flag's codes at the table's rows `rows`, in `space.flags` order."""
        head_row, tail_row = np.divmod(rows, len(self.tail))
        # (row gathers: take is several times faster than indexing)
        head, tail = self.head.take(head_row, axis=0), self.tail.take(tail_row, axis=0)
        return [head[:, j] for j in range(head.shape[1])] + [tail[:, j] for j in range(tail.shape[1])]

    def whole(self) -> np.ndarray:
        """The table as one array, a row per combination (tests and small spaces)."""
        return np.column_stack(self.columns(np.arange(len(self))))

    def classes(self, columns: tuple[int, ...]) -> RowClasses:
        """The rows' classes by `columns` (indices in `space.flags` order), found once per table."""
        held = self._classes.get(columns)
        if held is None:
            width = self.head.shape[1]
            first_head, head = _part_classes(self.head, tuple(j for j in columns if j < width))
            first_tail, tail = _part_classes(self.tail, tuple(j - width for j in columns if j >= width))
            first = (first_head[:, None] * len(self.tail) + first_tail[None, :]).ravel()
            held = self._classes[columns] = RowClasses(first, head, tail, len(first_tail))
        return held


def _trailing(space: Space) -> int:
    """Where the trailing flags start: the first flag from which on none reads an earlier one."""
    names = [dim.name for dim in space.flags]
    start = len(names)
    for i in reversed(range(len(names))):
        if any(c.subject in names[:i] for dim in space.flags[i:] for c in dim.free_when):
            break
        start = i
    return start


@lru_cache(maxsize=FLAG_TABLES_KEPT)
def _flag_table_cached(space: Space, known: tuple[tuple[str, int], ...], num_networks: int) -> FlagTable:
    names = [dim.name for dim in space.flags]
    split = _trailing(space)
    head, tail = (flag_combinations(space, dict(known), num_networks, frozenset(part))
                  for part in (names[:split], names[split:]))
    head.flags.writeable = tail.flags.writeable = False         # shared by every skeleton with these facts
    return FlagTable(head, tail)


def flag_table(space: Space, skeleton: Skeleton, system: System) -> FlagTable:
    """All valid flag combinations on a skeleton. Conditions only test tp, cp, ep, etp, pp, dp
    and dp·cp against 1, so a few tables per (space, system) exist; they are cached."""
    return _flag_table_cached(space, coarse_facts(facts(skeleton, system)), len(system.networks))
