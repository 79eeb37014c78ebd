"""Two arithmetic backends for the same formulas: Python scalars and numpy arrays.

The cost model is written once against this tiny interface (`where`, `maximum`,
`minimum`, `floor`, `all`, `lookup`, `pick`), so the scalar evaluator that explains one
mapping and the vectorized one that scores millions are the same code by construction; the
property test in tests/ checks that both backends agree.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

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


class ArrayOps:
    """Backend for many mappings at once: every quantity is a numpy array."""

    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    floor = staticmethod(np.floor)     # whole-number tests: ~80x faster than a float %
    all = staticmethod(np.all)
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
    def pick(table: tuple, index):
        # When every network has the same value (usual for some parameters), a scalar
        # broadcasts for free where a gather would copy a whole column.
        first = table[0]
        if all(x == first for x in table):
            return first
        return np.asarray(table)[index]
