"""Arrays whose axes are named, each with the values it runs over: the grids the search's
exact-model tables are evaluated on and reduced over (solver.search.cpsat.block_tables,
solver.search.cpsat.tables), read by name and value, never by position; and the tables they give,
read by key (Keyed)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


class Named:
    """An array whose axes are named, each with the values it runs over: tables are read by
    name and value (`.sel(recompute=RECOMPUTE_NONE)`, `.min("tp_net")`), never by position."""

    def __init__(self, values: np.ndarray, axes: dict[str, tuple]):
        self.values, self.axes = values, axes

    @staticmethod
    def grid(**axes) -> tuple[dict[str, np.ndarray], "Named"]:
        """The Cartesian product of named axes as flat columns to evaluate on, and an empty
        Named to shape the results with (`.of`)."""
        names = list(axes)
        mesh = np.meshgrid(*[np.asarray(axes[k]) for k in names], indexing="ij")
        return ({k: g.ravel() for k, g in zip(names, mesh)},
                Named(np.empty(mesh[0].shape), {k: tuple(np.asarray(axes[k]).tolist()) for k in names}))

    @staticmethod
    def open_grid(**axes) -> tuple[dict[str, np.ndarray], "Named"]:
        """As `grid`, with each column shaped to broadcast along its own axis only (a term
        that reads a few axes is computed over those alone), and results given `.of` in any
        shape that broadcasts to the grid's."""
        names = list(axes)
        mesh = np.meshgrid(*[np.asarray(axes[k]) for k in names], indexing="ij", sparse=True)
        shape = tuple(len(axes[k]) for k in names)
        return dict(zip(names, mesh)), Named(np.empty(shape), {k: tuple(np.asarray(axes[k]).tolist()) for k in names})

    def of(self, flat) -> "Named":
        """Flat results over the grid's rows (or one broadcast value, or results shaped to
        broadcast to the grid's shape) as a Named of its shape."""
        shape = self.values.shape
        if np.ndim(flat) > 1:
            return Named(np.broadcast_to(flat, shape), self.axes)
        return Named(np.broadcast_to(flat, (math.prod(shape),)).reshape(shape), self.axes)

    def _axis(self, name: str) -> int:
        return list(self.axes).index(name)

    def sel(self, **picks) -> "Named":
        """The values at the given axis values; a list keeps the axis with those values, a
        single value drops it."""
        values, axes = self.values, dict(self.axes)
        for name, pick in picks.items():
            axis = list(axes).index(name)
            if isinstance(pick, (list, tuple)):
                if tuple(pick) != axes[name]:         # (the whole axis in its order: nothing to take)
                    values, axes[name] = np.take(values, [axes[name].index(p) for p in pick], axis=axis), tuple(pick)
            else:                                     # (a view: the entries are read, not copied)
                values = values[(slice(None),) * axis + (axes[name].index(pick),)]
                del axes[name]
        return Named(values, axes)

    def min(self, *names: str, where: "Named | None" = None) -> "Named":
        """The minimum over the named axes (all but `key` when none are named). With `where`,
        over the entries it allows only; where it allows none (no mapping there is feasible,
        and the constraints exclude it), the plain minimum, a lower bound still."""
        names = names or tuple(n for n in self.axes if n != "key")
        axis = tuple(self._axis(n) for n in names)
        kept = {k: v for k, v in self.axes.items() if k not in names}
        if where is None:
            (values,) = _one_of_repeats([self.values], axis)
            return Named(values.min(axis=axis), kept)
        values, allowed = _one_of_repeats([self.values, np.broadcast_to(where.values, self.values.shape)], axis)
        least = np.where(allowed, values, np.inf).min(axis=axis)
        none_allowed = ~np.isfinite(least)
        if none_allowed.any():
            least = np.where(none_allowed, values.min(axis=axis), least)
        return Named(least, kept)


def _one_of_repeats(arrays: list[np.ndarray], axis: tuple) -> list[np.ndarray]:
    """`arrays` (of one shape) cut to their first entry along each axis of `axis` all of them only
    repeat (stride 0, broadcast): the same minima over `axis`, without reading the repeats."""
    cut = tuple(slice(0, 1) if i in axis and all(a.strides[i] == 0 for a in arrays) else slice(None)
                for i in range(arrays[0].ndim))
    return [a[cut] for a in arrays]


class Keyed(Mapping):
    """One table's values read by key as a dict's are, held as an array over the keys with the keys'
    positions in it (one positions dict shared by every table built over the same keys: the block
    tables, solver.search.cpsat.block_tables): built from an array without a Python float per key,
    and read in bulk by `rows` and `array`."""

    __slots__ = ("positions", "array")

    def __init__(self, positions: dict, array: np.ndarray):
        self.positions, self.array = positions, array

    def __getitem__(self, key) -> float:
        return float(self.array[self.positions[key]])

    def __contains__(self, key) -> bool:
        return key in self.positions

    def __iter__(self):
        return iter(self.positions)

    def __len__(self) -> int:
        return len(self.positions)

    def rows(self, keys: list) -> np.ndarray:
        """The positions of `keys` in `array`."""
        return np.fromiter(map(self.positions.__getitem__, keys), np.intp, len(keys))

    def extended(self, more: "Keyed", positions: dict) -> "Keyed":
        """This table with `more`'s keys (none of them its own) after its own, over `positions`
        (extended_positions of both)."""
        return Keyed(positions, np.concatenate([self.array, more.array]))


def extended_positions(positions: dict, more: dict) -> dict:
    """The positions of Keyed tables over `positions`' keys, then `more`'s (Keyed.extended)."""
    start = len(positions)
    return {**positions, **{key: start + at for key, at in more.items()}}
