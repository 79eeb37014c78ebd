"""Two arithmetic backends for the same formulas: Python scalars and numpy arrays.

The cost model is written once against this tiny interface (`where`, `maximum`,
`minimum`, `floor`, `all`, `lookup`, `pick`), so the scalar evaluator that explains one
mapping and the vectorized one that scores millions are the same code by construction; the
property test in tests/ checks that both backends agree.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, fields, is_dataclass
from types import SimpleNamespace

import numpy as np


@dataclass(frozen=True)
class Curve:
    """A step efficiency curve: sizes ascending (the first is 0), an efficiency per step."""

    sizes: tuple[float, ...]
    efficiencies: tuple[float, ...]

    @staticmethod
    def of(pairs) -> "Curve":
        return Curve(tuple(float(s) for s, _ in pairs), tuple(float(e) for _, e in pairs))


class ScalarOps:
    """Backend for one mapping: plain Python floats, fast for a single evaluation."""

    @staticmethod
    def where(condition, if_true, if_false):
        return if_true if condition else if_false

    maximum = staticmethod(max)
    minimum = staticmethod(min)

    @staticmethod
    def floor(value):
        return float(math.floor(value))

    all = staticmethod(bool)
    any = staticmethod(bool)

    @staticmethod
    def lookup(curve: Curve, size):
        return curve.efficiencies[bisect_right(curve.sizes, size) - 1]

    @staticmethod
    def pick(table: tuple, index):
        """table[index] for a per-network parameter and a network index."""
        return table[int(index)]

    @staticmethod
    def logical_not(value):
        return not value

    @staticmethod
    def per_distinct(formula, m, names: tuple[str, ...]):
        """formula(m) (see ArrayOps.per_distinct)."""
        return formula(m)


class ArrayOps:
    """Backend for many mappings at once: every quantity is a numpy array."""

    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    floor = staticmethod(np.floor)     # whole-number tests: ~80x faster than a float %
    all = staticmethod(np.all)
    any = staticmethod(np.any)
    logical_not = staticmethod(np.logical_not)

    @staticmethod
    def lookup(curve: Curve, size):
        # A few masked copies beat searchsorted + gather on curves of a handful of steps,
        # and give exactly the listed efficiencies (the scalar path's values).
        size = np.asarray(size)
        out = np.full(size.shape, curve.efficiencies[0])
        for threshold, efficiency in zip(curve.sizes[1:], curve.efficiencies[1:]):
            np.copyto(out, efficiency, where=size >= threshold)
        return out

    @staticmethod
    def per_distinct(formula, m, names: tuple[str, ...]):
        """formula(view) where `view` holds only m's attributes `names`, evaluated once per
        distinct combination of them and spread back over m's rows (a dataclass result field
        by field, nested ones too). `names` are the ones the formula reads: the view holds
        nothing else, so a formula that came to read another fails loudly rather than being
        shared wrongly. Scalar attributes pass as they are; array ones are non-negative
        integers, Booleans or whole-number floats (degrees, codes)."""
        values = {name: getattr(m, name) for name in names}
        arrays = {name: v for name, v in values.items() if isinstance(v, np.ndarray) and v.ndim == 1}
        if not arrays or not all(_whole(v) for v in arrays.values()):
            return formula(SimpleNamespace(**values))
        rows, inverse, _ = distinct_rows(list(arrays.values()))
        if len(rows) == len(inverse):
            return formula(SimpleNamespace(**values))
        view = SimpleNamespace(**{name: (v[rows] if name in arrays else v) for name, v in values.items()})
        return spread(formula(view), inverse, len(rows))

    @staticmethod
    def pick(table: tuple, index):
        # When every network has the same value (usual for some parameters), a scalar
        # broadcasts for free where a gather would copy a whole column.
        first = table[0]
        if all(x == first for x in table):
            return first
        return np.asarray(table)[index]


def _whole(column: np.ndarray) -> bool:
    """Whether a column holds only non-negative whole numbers (what distinct_rows packs)."""
    if column.dtype == bool or len(column) == 0:
        return True
    return bool(column.min() >= 0) and (column.dtype.kind in "iu" or bool(np.all(column == np.floor(column))))


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """(a row of each distinct combination of `columns`, each row's combination, the distinct
    combinations as bytes — an identity for memos): the columns (non-negative whole numbers)
    packed into one int64 key, mixed radix; by counting when the key range is small."""
    # (columns that cast to int64 safely join the key as they are, widened by the addition;
    # others, floats, are converted)
    columns = [column if np.can_cast(column.dtype, np.int64) else column.astype(np.int64)
               for column in map(np.asarray, columns)]
    key = np.zeros(len(columns[0]), dtype=np.int64)
    radices = []                            # (least value, values spanned) per column
    for column in columns:
        low = int(column.min()) if len(column) else 0
        radices.append((low, int(column.max()) - low + 1 if len(column) else 1))
        if np.prod([r for _, r in radices], dtype=float) >= 2.0 ** 62:
            wide = np.column_stack([column.astype(np.int64, copy=False) for column in columns])
            rows, first, inverse = np.unique(wide, axis=0, return_index=True, return_inverse=True)
            return first, inverse.ravel(), rows.tobytes()
        if radices[-1][1] > 1:
            key = key * radices[-1][1] + column - low
    return _distinct_keys(key, radices)


def distinct_table_rows(table: np.ndarray, columns: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """distinct_rows([table[:, j] for j in columns]) of a 2-D int32 table, the same answer: the
    least and largest values of every column in one pass, the key one product of each row with
    the place values (0 off `columns`), exact in int32 where the largest key fits (a column of a
    row-major table is strided: taken one at a time, each pass reads the whole table)."""
    if not columns or not len(table) or table.dtype != np.int32:
        return distinct_rows([table[:, j] for j in columns])
    least, largest = table.min(axis=0).astype(np.int64), table.max(axis=0).astype(np.int64)
    chosen = list(columns)
    spans = largest[chosen] - least[chosen] + 1
    place = np.append(np.cumprod(spans[:0:-1])[::-1], 1)                 # the mixed radix's place values
    if (len(set(chosen)) < len(chosen) or least[chosen].min() < 0 or np.prod(spans, dtype=float) >= 2.0 ** 62
            or float(largest[chosen] @ place) >= 2.0 ** 31):                   # (int32 would not hold the key)
        return distinct_rows([table[:, j] for j in columns])
    places = np.zeros(table.shape[1], dtype=np.int32)
    places[chosen] = place
    key = (table @ places).astype(np.int64) - int(least[chosen] @ place)
    return _distinct_keys(key, list(zip(least[chosen].tolist(), spans.tolist())))


def _distinct_keys(key: np.ndarray, radices: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """distinct_rows' answer from the packed key and each column's (least value, values spanned)."""
    span = math.prod(r for _, r in radices)
    if span > 4 * len(key) + 1024:
        keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        row_of = np.full(span, -1, dtype=np.int64)
        row_of[key] = np.arange(len(key))       # a row of each combination (any one serves)
        keys = np.flatnonzero(row_of >= 0)
        first = row_of[keys]
        rank = np.zeros(span, dtype=np.int64)
        rank[keys] = np.arange(len(keys))
        inverse = rank[key]
    return first, inverse, np.array(radices, dtype=np.int64).tobytes() + keys.tobytes()


def spread(result, inverse: np.ndarray, distinct: int):
    """`result` (per-distinct-row arrays; a dataclass or tuple of them, nested ones too) at every row."""
    if is_dataclass(result):
        return type(result)(**{f.name: spread(getattr(result, f.name), inverse, distinct) for f in fields(result)})
    if isinstance(result, tuple):
        return tuple(spread(item, inverse, distinct) for item in result)
    if isinstance(result, np.ndarray) and result.shape[:1] == (distinct,):
        return result.take(inverse, axis=0)
    return result
