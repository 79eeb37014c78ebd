"""What certified searches of one problem at several GPU counts share (`mapsat plan`): the
exact model's context, the surrogate's count-independent tables and the exact block terms
already computed (solver.search.engine takes them through `CountShare`)."""

from __future__ import annotations

from typing import NamedTuple

from costmodel.terms.context import Context
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.search.cpsat.block_tables import BlockTableCache

__all__ = ["CountShare", "Shared"]


class Shared(NamedTuple):
    """One problem's shared parts: the context, the surrogate's (tp, cp, ep, etp,
    microbatch) tables, and the exact block terms by distinct block
    (costmodel.evaluate.distinct_block_terms' memo)."""

    c: Context
    block_tables: BlockTableCache
    block_terms: dict


class CountShare:
    """What certified searches of one problem at several GPU counts share (`mapsat plan`):
    per (model, system, datatype, kernels), the exact model's context, the surrogate's
    (tp, cp, ep, etp, microbatch) tables (solver.search.cpsat.tables.BlockTableCache) and
    the exact terms of the blocks scored so far, which read neither the GPU count nor the
    batch. What does depend on the count — the splits
    (dp = N/(tp·cp·pp)), the local batch and the microbatches, the stage tables (DP
    reduction, optimizer, per-GPU state), the block floors and the exact scores — each
    engine computes itself. The last `MAX_PROBLEMS` problems are kept."""

    MAX_PROBLEMS = 8

    def __init__(self):
        self._problems: list[tuple[tuple, Shared]] = []

    def context(self, model: Model, system: System, datatype: Datatype, kernels: Kernels) -> Shared:
        inputs = (model, system, datatype, kernels)
        for i, (known, shared) in enumerate(self._problems):
            if known == inputs:
                self._problems.append(self._problems.pop(i))      # most recently used last
                return shared
        shared = Shared(Context.build(model, system, datatype, kernels), BlockTableCache(), {})
        self._problems = self._problems[-(self.MAX_PROBLEMS - 1):] + [(inputs, shared)]
        return shared
