"""The CP-SAT model of a space: its variables and named constraints (structure_model), the
batch each split trains per replica, and a callback that collects the blocks of the
solutions CP-SAT finds."""

from __future__ import annotations

from ortools.sat.python import cp_model

from costmodel.space.dimensions import BlockKey
from solver.search.cpsat.constraints import STRUCTURE, Problem
from solver.search.cpsat.tables import local_batches_of
from solver.search.cpsat.variables import Variables


class BlockCollector(cp_model.CpSolverSolutionCallback):
    """Records the block of every solution CP-SAT finds."""

    def __init__(self, variables: Variables):
        super().__init__()
        self.variables = variables
        self.blocks: list[BlockKey] = []

    def on_solution_callback(self) -> None:
        key, _ = self.variables.decode(self)
        if key not in self.blocks:
            self.blocks.append(key)


def structure_model(problem: Problem, skels, flags=None) -> tuple[cp_model.CpModel, Variables]:
    m = cp_model.CpModel()
    v = Variables(m, problem.space, list(skels), problem.num_gpus, len(problem.system.networks), flags=flags)
    for constraint in STRUCTURE:
        constraint.add(m, v, problem)
    return m, v


def local_batches(problem: Problem, variables: Variables) -> dict:
    """batch/dp of every (tp, cp, ep, etp, pp) split the variables allow (1 where no batch exists)."""
    return local_batches_of(variables.split, problem.num_gpus, problem.space, problem.max_batch)
