"""What certified searches of one problem at several GPU counts share (`mapsat plan`): the
exact model's context and the surrogate's count-independent tables (solver.search.engine
takes them through `CountShare`)."""

from __future__ import annotations

from costmodel.context import Context
from costmodel.kernels import Kernels
from costmodel.model import Model
from costmodel.system import Datatype, System
from solver.search.cpsat.block_tables import BlockTableCache

__all__ = ["CountShare"]


class CountShare:
    """What certified searches of one problem at several GPU counts share (`mapsat plan`):
    per (model, system, datatype, kernels), the exact model's context and the surrogate's
    (tp, cp, ep, etp, microbatch) tables, which read neither the GPU count nor the batch
    (solver.search.cpsat.tables.BlockTableCache). What does depend on the count — the splits
    (dp = N/(tp·cp·pp)), the local batch and the microbatches, the stage tables (DP
    reduction, optimizer, per-GPU state), the block floors and the exact scores — each
    engine computes itself. The last `MAX_PROBLEMS` problems are kept."""

    MAX_PROBLEMS = 8

    def __init__(self):
        self._problems: list[tuple[tuple, Context, BlockTableCache]] = []

    def context(self, model: Model, system: System, datatype: Datatype,
                kernels: Kernels) -> tuple[Context, BlockTableCache]:
        inputs = (model, system, datatype, kernels)
        for i, (known, c, cache) in enumerate(self._problems):
            if known == inputs:
                self._problems.append(self._problems.pop(i))      # most recently used last
                return c, cache
        entry = (inputs, Context.build(model, system, datatype, kernels), BlockTableCache())
        self._problems = self._problems[-(self.MAX_PROBLEMS - 1):] + [entry]
        return entry[1], entry[2]
