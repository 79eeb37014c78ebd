"""The one certified search: a CP-SAT model of a space over a sound surrogate, refined by the
exact model, asked one question or many.

    data        the space's skeletons, the exact model's tables (solver.search.cpsat.surrogate)
    variables   the split, batch, interleaving, microbatch and the flags CP-SAT decides
    constraints the named constraints (solver.search.cpsat.constraints) + the HBM relaxation
    objective   a piecewise-linear lower bound of the exact iteration time
    a question  which blocks and which of their mappings qualify (a pinned value, a capacity),
                the literals CP-SAT must take for it, how many distinct bests it wants
    the loop    warm start: score the qualifying blocks the surrogate ranks best until the
                next floor is above the K-th best; when every unscored block's floor is,
                the answer is certified without CP-SAT (and its model is never built).
                Else on by a margin, then solve (under the question's assumptions and "beat
                the K-th best") → score the blocks CP-SAT found exactly with the vectorized
                model, and their other interleavings → repeat until CP-SAT proves nothing
                left can beat the K-th best (certified), the block floors prove it without
                a round, or time runs out.

Every block the exact model scores is cut from the model once and kept (each mapping's
flags, exact time, HBM and offload bytes), so later questions start from what earlier ones
scored: `solve` asks one question, `explain` one per (dimension, value), `codesign` one per
candidate capacity.

CP-SAT (OR-Tools, whose import takes a good part of a second) is imported once the engine
builds its model: only when the block floors (numpy over the exact model's tables, each
skeleton's when the ranking reaches it: LazyFloors) cannot prove an answer. Searches at several
GPU counts (`mapsat plan`) share the context and the (tp, cp, ep, etp, microbatch) tables (CountShare).

Because the surrogate never over-estimates an exact time and its constraints never exclude
a feasible mapping, the end of the loop certifies the exact model's optimum — the same
answer as scoring every mapping (solver.search.brute), ties broken the same way (time, then
enumeration order), distinct answers grouped the same way (solver.search.distinct).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.space.dimensions import FLAGS, SPLIT_TEXT, BlockKey
from costmodel.encoding import MappingArrays
from costmodel.evaluate import (STRUCTURE_DIMENSIONS, TIME_ONLY_DIMENSIONS, capacity_fits, iteration_time_in_context,
                                memory_in_context, structure_fits)
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.search.count_share import CountShare
from solver.search.distinct import SKELETON, TopGroups
from solver.space.declaration import Space
from solver.space.enumerate import plan
from solver.space.flags import RowClasses

WARM_START_BLOCKS = 1024
"""At most this many blocks are scored before the first CP-SAT round, best surrogate bound
first (one block takes ~10 ms to score, a CP-SAT round on a large space seconds)."""
WARM_START_MARGIN = 0.005
"""The warm start goes on past the K-th best by this fraction: CP-SAT's tangent-line
objective sits up to ~0.2 % below the tables the ranking uses, so blocks just above the
line would otherwise come back as CP-SAT candidates one round at a time."""
SEARCHED_FLAGS = ("recompute", "tp_comm", "zero", "seq_par_ag_redo", "weight_offload",
                  "activations_offload", "optimizer_offload")
"""Flags CP-SAT decides. The others (TP overlap, DP overlap, the network of each dimension)
change only time, never memory: the surrogate takes their best case, and the exact scoring
of a block tries every value."""
FLAG_NAMES = tuple(dim.name for dim in FLAGS)

Key = BlockKey
"""A block: the split's degrees, the interleaving and the microbatch."""


@dataclass
class _CpSat:
    """The CP-SAT model of an engine: model, variables, surrogate bounds, objective."""

    m: object
    v: object
    bounds: object
    objective: object
    floor_cuts_added: bool = False


class OutOfTime(Exception):
    """The time limit ran out before the CP-SAT model was built: nothing was scored."""


@dataclass(frozen=True)
class ScoredBlock:
    """A scored block's feasible mappings, as much as ranking needs: each flag's codes, the
    exact time, HBM and offload bytes, the ordinal, and the row in the block (to rebuild the
    mapping from the plan: on a billion-mapping space whole rows would not fit in memory)."""

    flags: dict
    time_s: np.ndarray
    hbm_bytes: np.ndarray
    offload_bytes: np.ndarray
    ordinal: np.ndarray
    row: np.ndarray


@dataclass(frozen=True)
class Question:
    """What one certified search asks."""

    blocks: Callable[[Key], bool] = lambda key: True
    """which blocks can hold a qualifying mapping (a pinned split value decides it)"""
    rows: Callable[[ScoredBlock], np.ndarray] | None = None
    """which of a scored block's mappings qualify (a pinned flag, a capacity); None: all"""
    assumptions: tuple = ()
    """literals CP-SAT must take for this question only"""
    ranked: list | None = None
    """(floor, block) of every block with a finite surrogate floor, ascending; None: the
    engine's own (a question with smaller capacities has higher floors)"""
    top_k: int = 1
    warm_start_blocks: int | None = None
    """at most this many blocks scored before the first CP-SAT round (None: WARM_START_BLOCKS)"""
    time_limit_s: float = math.inf


@dataclass(frozen=True)
class Found:
    """A question's answer: its best distinct groups, each a list of (block, row j) with the
    first-enumerated member first, and how the search ended."""

    groups: list
    times_s: list
    certified: bool
    interrupted: bool
    rounds: int
    cpsat_status: str | None
    bound_s: float | None
    """a proven lower bound on the best time (= the best time when certified)"""


class Engine:
    """One CP-SAT model of a space with its surrogate bounds, and every block scored so far.

    The block floors (numpy over the exact model's tables) are built at once; the CP-SAT
    model (`m`, `v`, `bounds`, `objective`) only when first needed: a question whose floors
    prove its answer after the warm start never builds it, nor imports OR-Tools.

    `one_question`: the model serves a single search (solve), so its "beat the K-th best"
    bound is added for good each round instead of as an assumption. `share`: the context and
    tables shared with searches at other GPU counts (CountShare)."""

    def __init__(self, model: Model, system: System, num_gpus: int, max_batch: int, datatype: Datatype,
                 space: Space, kernels: Kernels, *, workers: int = 1, seed: int = 0, one_question: bool = False,
                 deadline: float = math.inf, say: Callable[[str], None] | None = None,
                 share: CountShare | None = None):
        say = say or (lambda phase: None)
        self.say = say
        self.datatype, self.kernels, self.workers, self.seed = datatype, kernels, workers, seed
        self.one_question = one_question
        _check(deadline)
        say("building the exact model's tables and the space")
        self.c, block_tables, self.block_memo = (share or CountShare()).context(model, system, datatype, kernels)
        self.plan = plan(model, system, num_gpus, max_batch, space, chunk_rows=1 << 62)
        _check(deadline)
        from solver.search.cpsat.constraints import Problem
        from solver.search.cpsat.lazy_floors import LazyFloors
        from solver.search.cpsat.tables import SplitKeys, Tables, local_batches_of
        self.problem = Problem(model, system, num_gpus, max_batch, space)
        self.index = {s.split: i for i, s in enumerate(self.plan.skeletons)}
        self._memory_columns = tuple(j for j, dim in enumerate(space.flags) if dim.name not in TIME_ONLY_DIMENSIONS)
        self._structure_columns = tuple(j for j, dim in enumerate(space.flags) if dim.name in STRUCTURE_DIMENSIONS)
        self.scored: dict[Key, ScoredBlock] = {}
        self._cpsat: _CpSat | None = None
        if not self.plan.skeletons:
            return
        keys = SplitKeys(self.plan.skeletons)
        self.tables = Tables(self.c, keys, num_gpus, space, len(self.c.net.size), cache=block_tables,
                             block_memo=self.block_memo, check=(check := lambda: _check(deadline)))
        self.local_batch = local_batches_of(keys.split, num_gpus, space, max_batch)
        self.lazy_floors = LazyFloors(self.tables, self.c, space, self.plan.skeletons, self.local_batch,
                                      len(system.networks), check)
        _check(deadline)

    @functools.cached_property
    def block_floors(self) -> dict:
        """Every block's surrogate floor (block_lower_bounds: the skeletons the ranking has not reached computed now)."""
        return self.lazy_floors.all()

    # ---- the CP-SAT model, built when first needed ----
    def _model(self) -> _CpSat:
        if self._cpsat is None:
            from solver.search.cpsat.model import structure_model
            from solver.search.cpsat.surrogate import add_bounds
            self.say(f"building the CP-SAT model ({len(self.plan.skeletons)} {SPLIT_TEXT} splits)")
            m, v = structure_model(self.problem, self.plan.skeletons, flags=SEARCHED_FLAGS)
            bounds = add_bounds(m, v, self.c, self.problem.num_gpus, self.local_batch,
                                self.problem.space, self.c.memory.hbm_capacity_bytes, tables=self.tables)
            bounds.block_floors = self.block_floors
            objective = bounds.objective()
            m.Minimize(objective)
            for key in self.scored:             # blocks scored before the model existed
                v.exclude_block(key)
            self._cpsat = _CpSat(m, v, bounds, objective)
        return self._cpsat

    @property
    def m(self):
        return self._model().m

    @property
    def v(self):
        return self._model().v

    @property
    def bounds(self):
        return self._model().bounds

    @property
    def objective(self):
        return self._model().objective

    # ---- blocks, scored once each ----
    def skeleton_values(self, key: Key) -> tuple:
        """The block's value of each skeleton dimension, in solver.search.distinct.SKELETON order."""
        sk = self.plan.skeletons[self.index[key.split]]
        own = {"interleaving": key.interleaving, "microbatch": key.microbatch}
        return tuple(own[name] if name in own else getattr(sk, name) for name in SKELETON)

    def score(self, key: Key) -> ScoredBlock:
        """Score every mapping of one block exactly, keep its feasible ones, and cut the block
        from the CP-SAT model. Feasibility first: capacity is decided on one mapping per
        combination of the flags that change memory (all but TIME_ONLY_DIMENSIONS), the
        structural checks on one per combination of STRUCTURE_DIMENSIONS; only mappings
        passing both (few, in a block of every shard group and network) are timed, each
        holding its capacity class's HBM and offload bytes (tests/conftest.py
        assert_block_floors_below_exact checks that memory reads no time-only dimension)."""
        index, il, mb = self.index[key.split], key.interleaving, key.microbatch
        table = self.plan.flag_tables[index]

        def heads(classes: RowClasses) -> MappingArrays:        # a mapping of each class
            return self.plan.block(index, il, mb, flag_rows=classes.first)[0]

        memory, structure = table.classes(self._memory_columns), table.classes(self._structure_columns)
        hbm_bytes, offload_bytes = (np.broadcast_to(held, (len(memory.first),)) for held in
                                    memory_in_context(self.c, heads(memory), self.block_memo))
        fit = np.flatnonzero(memory.at(capacity_fits(self.c, hbm_bytes, offload_bytes))
                             & structure.at(structure_fits(self.c, heads(structure))))
        rows, ordinals = self.plan.block(index, il, mb, flag_rows=fit)
        held = memory.of(fit)                       # (each mapping's memory is its class's)
        block = ScoredBlock({name: rows.columns[name] for name in FLAG_NAMES},
                            iteration_time_in_context(self.c, rows, self.block_memo),
                            hbm_bytes[held], offload_bytes[held], ordinals, fit.astype(np.int32))
        self.scored[key] = block
        if self._cpsat is not None:             # (else cut when the model is built)
            self._cpsat.v.exclude_block(key)
        return block

    def mapping(self, key: Key, j: int):
        """The j-th kept mapping of a scored block, rebuilt from the plan."""
        rows, _ = self.plan.block(self.index[key.split], key.interleaving, key.microbatch,
                                  flag_rows=self.scored[key].row[j:j + 1])
        return rows.to_mapping(0, self.datatype, self.kernels)

    def mappings_scored(self) -> int:
        return sum(len(self.plan.flag_tables[self.index[key.split]]) for key in self.scored)

    # ---- one question ----
    def search(self, q: Question) -> Found:
        """The question's certified best K distinct groups (see the module docstring)."""
        started = time.perf_counter()
        deadline = started + q.time_limit_s
        ranked = self.lazy_floors.ranked if q.ranked is None else q.ranked     # ((floor, block) ascending)
        top = TopGroups(q.top_k)

        def offer(key: Key) -> None:
            block = self.scored[key]
            top.offer(key, self.skeleton_values(key), block, None if q.rows is None else q.rows(block))

        def score(key: Key) -> None:
            self.score(key)
            offer(key)

        for key in self.scored:
            if q.blocks(key):
                offer(key)
        rounds, certified, bound_units, cpsat_status, interrupted = 0, False, None, None, False
        try:
            # warm start: the qualifying unscored blocks the surrogate ranks best, scored
            # until the next one's bound cannot beat or tie the K-th best; when the floors
            # then prove the answer no CP-SAT model is built. Otherwise on past the K-th best
            # by WARM_START_MARGIN (blocks CP-SAT's objective would otherwise return one
            # round at a time), then CP-SAT.
            warm, warm_cap = 0, WARM_START_BLOCKS if q.warm_start_blocks is None else q.warm_start_blocks
            self.say("warm start: scoring the blocks the surrogate ranks best")

            def warm_start(beyond: Callable[[float], bool]) -> None:
                nonlocal warm
                for floor, key in ranked:
                    if warm >= warm_cap or beyond(floor) or time.perf_counter() >= deadline:
                        break
                    if key in self.scored or not q.blocks(key):
                        continue
                    score(key)
                    warm += 1

            def left(key: Key) -> bool:
                return key not in self.scored and q.blocks(key)

            warm_start(lambda floor: floor > top.target_s)
            if not floors_prove(ranked, left, top.target_s):
                warm_start(lambda floor: floor >= top.target_s * (1 + WARM_START_MARGIN))
            while True:
                if floors_prove(ranked, left, top.target_s):
                    certified = True      # no unscored block's floor reaches the K-th best
                    break
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                from ortools.sat.python import cp_model

                from solver.search.cpsat.model import BlockCollector
                from solver.search.cpsat.run import checked_solve, new_solver
                cpsat = self._model()
                if not cpsat.floor_cuts_added:
                    cpsat.bounds.add_floor_cuts(cpsat.m, cpsat.v, exclude=list(self.scored))
                    cpsat.floor_cuts_added = True
                q_units = cpsat.bounds.quantization
                target = top.target_s
                assumptions = list(q.assumptions)
                if math.isfinite(target):
                    if self.one_question:
                        self.bounds.add_cutoff(self.m, target)
                    else:
                        beat = self.m.NewBoolVar("beat_target")
                        self.m.Add(self.objective <= math.floor(target / q_units.time_unit_s) + q_units.time_terms
                                   ).OnlyEnforceIf(beat)
                        assumptions.append(beat)
                self.m.ClearAssumptions()
                self.m.AddAssumptions(assumptions)
                solver = new_solver(remaining, self.workers, self.seed)
                collector = BlockCollector(self.v)
                self.say(f"CP-SAT round {rounds + 1} ({len(self.scored):,} scored blocks)")
                status = checked_solve(self.m, solver, collector)
                rounds += 1
                cpsat_status = solver.StatusName(status)
                if status == cp_model.INFEASIBLE:
                    certified = True      # no unscored qualifying mapping's bound beats the K-th best
                    break
                if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                    break                 # UNKNOWN: the time ran out inside the round
                bound_units = solver.BestObjectiveBound()
                # Score each candidate's block, and the same split and microbatch at every other
                # interleaving: neighbours that are often nearly as fast, cheap to score together.
                for candidate in collector.blocks:
                    for il in self.plan.skeletons[self.index[candidate.split]].interleavings:
                        key = candidate._replace(interleaving=il)
                        if key not in self.scored and q.blocks(key):
                            score(key)
                if status == cp_model.OPTIMAL and self.bounds.seconds(bound_units) >= top.target_s:
                    certified = True
                    break
        except KeyboardInterrupt:     # Ctrl-C: the best found so far, not certified
            interrupted = True
        finally:
            if self._cpsat is not None:
                self._cpsat.m.ClearAssumptions()
        # Every block left unscored has a surrogate floor; when none can reach the K-th best
        # (or none is left), the top K is proven whether or not CP-SAT finished a round.
        unscored = next((f for f, key in ranked if key not in self.scored and q.blocks(key)), math.inf)  # (ascending)
        certified = not interrupted and (certified or math.isinf(unscored) or unscored > top.target_s)
        times = [float(top.time_s[g[0]]) for g in top.groups]
        if certified:
            bound_s = times[0] if times else None
        elif times:
            # Sound either way: CP-SAT's proven bound on what was left in its last round, and
            # the smallest surrogate floor of any block not yet scored.
            cpsat_bound = self.bounds.seconds(bound_units) if bound_units is not None else 0.0
            bound_s = min(max(cpsat_bound, min(unscored, times[0])), times[0])
        else:
            bound_s = None
        return Found(top.members(), times, certified, interrupted, rounds, cpsat_status, bound_s)

    def group_flags(self, group: list) -> dict:
        """A group's members' flag codes, column by column (they share one block)."""
        key = group[0][0]
        js = np.asarray([j for _, j in group], dtype=np.int64)
        return {name: codes[js] for name, codes in self.scored[key].flags.items()}


def floors_prove(ranked: list, left: Callable[[Key], bool], target_s: float) -> bool:
    """True when every block still `left` (unscored and qualifying) has a surrogate floor
    above `target_s` (blocks with no feasible mapping have none): nothing left can beat or
    tie it, with no CP-SAT round needed. `ranked`: (floor, block) of the finite floors,
    ascending (so the scan stops at the first floor above the target)."""
    for floor, key in ranked:
        if floor > target_s:
            return True
        if left(key):
            return False
    return True


def _check(deadline: float) -> None:
    if time.perf_counter() >= deadline:
        raise OutOfTime


__all__ = ["SEARCHED_FLAGS", "WARM_START_BLOCKS", "WARM_START_MARGIN", "CountShare", "Engine", "Found", "Key",
           "OutOfTime", "Question", "ScoredBlock", "floors_prove"]
