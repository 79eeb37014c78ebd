"""Why the best mapping wins: the certified best time for every value of every dimension.

For each dimension of the space (costmodel.dimensions) and each value it takes, the best
mapping with that one value fixed, certified like `solve`'s answer. One CP-SAT model of the
space serves every question: the value is an *assumption* (a literal CP-SAT must take for
that solve only), and so is each round's "beat the best so far" bound; every block the
exact model scores is cut from the model once and kept, so later questions start from what
earlier ones scored. A question on a flag CP-SAT does not decide (TP overlap, DP overlap,
networks) needs no literal: the exact scoring of a block tries every value and keeps the
pinned ones, and the surrogate, a lower bound over all of them, bounds the pinned ones too.

Certification is `solve`'s: the best scored mapping with the value fixed is optimal once
CP-SAT proves (under the assumption) that no unscored block's surrogate bound can beat it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from costmodel.context import Context
from costmodel.dimensions import BY_NAME, DIMENSIONS, FLAGS, NETWORK_GROUPS
from costmodel.encoding import MappingArrays
from costmodel.evaluate import Evaluation, evaluate_arrays_in_context, evaluate_in_context
from costmodel.kernels import Kernels
from costmodel.model import Model
from costmodel.system import Datatype, System
from solver.search.cpsat.constraints import Problem, group_span_expressions
from solver.search.cpsat.run import checked_solve
from solver.search.cpsat.surrogate import add_bounds
from solver.search.solve import (SEARCHED_FLAGS, WARM_START_BLOCKS, WARM_START_MARGIN, BlockCollector, SolverConfig,
                                 binding_constraints, local_batches, structure_model)
from solver.space.count import count_mappings
from solver.space.declaration import Space
from solver.space.enumerate import plan

PINNED_WARM_START_BLOCKS = 4096
"""With a split dimension pinned, at most this many compatible blocks are scored before the
first CP-SAT round (each is a few thousand mappings)."""
TIE_REL = 1e-9
"""Times within this relative distance of the winner's are ties (solve = brute tolerance)."""

FLAG_NAMES = tuple(dim.name for dim in FLAGS)
Key = tuple[int, int, int, int, int, int]
"""A block: (tp, cp, ep, pp, interleaving, microbatch)."""


@dataclass(frozen=True)
class ValueBest:
    """The best mapping with one dimension fixed to one value."""

    dimension: str
    value: int                    # a number, or a flag's code
    label: str                    # as people read it
    best: Evaluation | None       # None: no mapping with this value is feasible
    certified: bool               # optimal (or infeasible) proven
    seconds: float

    def to_dict(self) -> dict:
        best = self.best
        return {"dimension": self.dimension, "value": self.label, "certified": self.certified,
                "iteration_time_s": best.iteration_time_s if best else None, "mfu": best.mfu if best else None,
                "mapping": best.mapping.model_dump(mode="json") if best else None, "seconds": self.seconds}


@dataclass(frozen=True)
class Explanation:
    """The certified best per value of each dimension, the winner and the runner-up (the
    fastest mapping any other value allows) with what binds each."""

    winner: Evaluation | None
    rows: list[ValueBest]
    runner_up: ValueBest | None
    winner_binding: list[str] = field(default_factory=list)
    runner_up_binding: list[str] = field(default_factory=list)
    seconds: float = 0.0
    blocks_scored: int = 0

    @property
    def certified(self) -> bool:
        return all(row.certified for row in self.rows)

    def to_dict(self) -> dict:
        winner = self.winner
        return {"winner": None if winner is None else {"mapping": winner.mapping.model_dump(mode="json"),
                                                       "iteration_time_s": winner.iteration_time_s,
                                                       "mfu": winner.mfu},
                "winner_binding": self.winner_binding,
                "runner_up": None if self.runner_up is None else self.runner_up.to_dict(),
                "runner_up_binding": self.runner_up_binding, "rows": [r.to_dict() for r in self.rows],
                "certified": self.certified, "blocks_scored": self.blocks_scored, "seconds": self.seconds}


@dataclass(frozen=True)
class ScoredBlock:
    """A scored block's feasible mappings, as much as ranking needs: each flag's codes, the
    exact time, the ordinal, and the row in the block (to rebuild the mapping)."""

    flags: dict
    time_s: np.ndarray
    ordinal: np.ndarray
    row: np.ndarray

    @staticmethod
    def of(rows: MappingArrays, ordinals: np.ndarray, feasible: np.ndarray, time_s: np.ndarray,
           keep: np.ndarray | None = None) -> "ScoredBlock":
        keep = np.flatnonzero(feasible) if keep is None else keep
        return ScoredBlock({name: rows.columns[name][keep] for name in FLAG_NAMES}, time_s[keep], ordinals[keep],
                           keep.astype(np.int32))


class Explorer:
    """One CP-SAT model of a space, asked for the best mapping under a pinned value at a time."""

    def __init__(self, model: Model, system: System, num_gpus: int, max_batch: int, datatype: Datatype,
                 space: Space, kernels: Kernels, config: SolverConfig):
        self.config, self.datatype, self.kernels = config, datatype, kernels
        self.c = Context.build(model, system, datatype, kernels)
        self.plan = plan(model, system, num_gpus, max_batch, space, chunk_rows=1 << 62)
        self.problem = Problem(model, system, num_gpus, max_batch, space)
        self.m, self.v = structure_model(self.problem, self.plan.skeletons, flags=SEARCHED_FLAGS)
        bounds = add_bounds(self.m, self.v, self.c, num_gpus, local_batches(self.problem, self.v),
                            space.tp_overlap_codes, self.c.hbm_capacity_bytes, skeletons=self.plan.skeletons)
        self.bounds, self.objective = bounds, bounds.objective()
        self.m.Minimize(self.objective)
        self.index = {s.split: i for i, s in enumerate(self.plan.skeletons)}
        self.scored: dict[Key, ScoredBlock] = {}
        self.literals: dict[tuple[str, int], cp_model.IntVar] = {}   # one assumption literal per pin
        self.ranked = sorted((floor, key) for key, floor in bounds.block_floors.items() if math.isfinite(floor))
        self._floor_cuts_added = False

    # ---- scoring blocks, once each ----
    def _block_rows(self, key: Key) -> tuple[MappingArrays, np.ndarray]:
        return self.plan.block(self.index[key[:4]], *key[4:])

    def _score(self, key: Key) -> None:
        rows, ordinals = self._block_rows(key)
        ev = evaluate_arrays_in_context(self.c, rows)
        self.scored[key] = ScoredBlock.of(rows, ordinals, ev.feasible, ev.iteration_time_s)
        self.v.exclude_block(key)

    def _mapping(self, key: Key, j: int):
        """The j-th kept mapping of a scored block, rebuilt from the plan (blocks keep only
        what ranking needs: on a billion-mapping space whole rows would not fit in memory)."""
        rows, _ = self._block_rows(key)
        return rows.to_mapping(int(self.scored[key].row[j]), self.datatype, self.kernels)

    def _compatible(self, key: Key, name: str | None, value: int | None) -> bool:
        """Whether a block can hold mappings with the pinned value (skeleton pins only decide)."""
        if name is None or BY_NAME[name].is_flag:
            return True
        tp, cp, ep, pp, il, mb = key
        dp = self.problem.num_gpus // (tp * cp * pp)
        own = {"tp": tp, "cp": cp, "ep": ep, "pp": pp, "interleaving": il, "microbatch": mb, "dp": dp,
               "batch": self.plan.skeletons[self.index[(tp, cp, ep, pp)]].batch}
        return own[name] == value

    def _floors_prove(self, target_s: float, name: str | None, value: int | None) -> bool:
        """True when every unscored block that could hold the pinned value has a surrogate
        floor above `target_s` (blocks with no feasible mapping have none): nothing left
        can beat or tie the best scored one, with no CP-SAT round needed."""
        return all(floor > target_s for floor, key in self.ranked
                   if key not in self.scored and self._compatible(key, name, value))

    def _block_best(self, key: Key, name: str | None, value: int | None) -> tuple[float, int, Key, int]:
        """(time, ordinal, block, row) of the best scored mapping of one block with the pinned
        value ((inf, ...) when it has none)."""
        block = self.scored[key]
        time_s, ordinal = block.time_s, block.ordinal
        ok = np.ones(len(time_s), dtype=bool)
        if name is not None and BY_NAME[name].is_flag:
            ok &= block.flags[name] == value
        if not self._compatible(key, name, value) or not ok.any():
            return (math.inf, -1, key, -1)
        candidates = np.flatnonzero(ok)
        j = candidates[np.lexsort((ordinal[candidates], time_s[candidates]))[0]]
        return (float(time_s[j]), int(ordinal[j]), key, int(j))

    def _incumbent(self, name: str | None, value: int | None) -> tuple[float, int, Key, int]:
        """The best scored mapping with the pinned value, over every scored block."""
        return min((self._block_best(key, name, value) for key in self.scored), key=rank_of,
                   default=(math.inf, -1, None, -1))

    def _assumption(self, name: str | None, value: int | None) -> list:
        """The literal CP-SAT must take for the pin. A flag CP-SAT does not decide gets one
        that implies what the pin needs of the split: a degree > 1 for a value other than the
        pinned-by-default first code, and for a network, that the group fits it."""
        if name is None:
            return []
        if (name, value) not in self.literals:
            self.literals[(name, value)] = self._pin_literal(name, value)
        return [self.literals[(name, value)]]

    def _pin_literal(self, name: str, value: int):
        v, m, dim = self.v, self.m, BY_NAME[name]
        if name in v.flags:
            return v.flags[name][value] if value in v.flags[name] else m.NewConstant(0)
        if name == "batch":
            lit = m.NewBoolVar(f"batch_is[{value}]")
            m.Add(v.batch == value).OnlyEnforceIf(lit)
            return lit
        if not dim.is_flag:
            one_hot = getattr(v, name)
            return one_hot.is_.get(value, m.NewConstant(0))
        lit = m.NewBoolVar(f"pin_{name}[{dim.label_of(value)}]")
        degree_gt1 = {fact: (getattr(v, fact).is_[1].Not() if 1 in getattr(v, fact).is_ else m.NewConstant(1))
                      for fact, _ in NETWORK_GROUPS}
        if value != dim.codes(v.num_networks)[0]:
            for cond in dim.free_when:
                if cond.subject in degree_gt1:
                    m.AddImplication(lit, degree_gt1[cond.subject])
        spans = group_span_expressions(v, self.problem.num_gpus)
        for (fact, net), span in zip(NETWORK_GROUPS, spans, strict=True):
            if net == name:
                size = self.problem.system.networks[value].size
                if isinstance(span, int):
                    if span > size:
                        m.AddBoolOr([lit.Not(), degree_gt1[fact].Not()])
                else:
                    m.Add(span <= size).OnlyEnforceIf([lit, degree_gt1[fact]])
        return lit

    # ---- one question ----
    def best(self, name: str | None = None, value: int | None = None) -> tuple[Evaluation | None, bool]:
        """The certified best mapping with dimension `name` fixed to `value` (None: no pin),
        and whether it is proven (or its absence proven)."""
        started = time.perf_counter()
        incumbent = self._incumbent(name, value)

        def score(key: Key) -> None:
            nonlocal incumbent
            self._score(key)
            incumbent = min(incumbent, self._block_best(key, name, value), key=rank_of)

        # warm start: the compatible unscored blocks the surrogate ranks best; a pinned split
        # dimension leaves few compatible blocks, so scoring them beats CP-SAT rounds
        warm = 0
        split_pin = name in BY_NAME and not BY_NAME[name].is_flag
        warm_cap = PINNED_WARM_START_BLOCKS if split_pin else WARM_START_BLOCKS
        for floor, key in self.ranked:
            if warm >= warm_cap or floor >= incumbent[0] * (1 + WARM_START_MARGIN):
                break
            if key in self.scored or not self._compatible(key, name, value):
                continue
            score(key)
            warm += 1
        if not self._floor_cuts_added:
            self.bounds.add_floor_cuts(self.m, self.v, exclude=list(self.scored))
            self._floor_cuts_added = True
        certified = False
        q = self.bounds.quantization
        while True:
            if self._floors_prove(incumbent[0], name, value):
                certified = True      # solve's closing check: no unscored block's floor reaches it
                break
            remaining = self.config.time_limit_s - (time.perf_counter() - started)
            if remaining <= 0:
                break
            target = incumbent[0]
            assumptions = self._assumption(name, value)
            if math.isfinite(target):
                beat = self.m.NewBoolVar("beat_target")
                self.m.Add(self.objective <= math.floor(target / q.time_unit_s) + q.time_terms).OnlyEnforceIf(beat)
                assumptions.append(beat)
            self.m.ClearAssumptions()
            self.m.AddAssumptions(assumptions)
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = remaining
            solver.parameters.num_workers = self.config.workers
            solver.parameters.random_seed = self.config.seed
            collector = BlockCollector(self.v)
            status = checked_solve(self.m, solver, collector)
            if status == cp_model.INFEASIBLE:
                certified = True
                break
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break
            for tp, cp, ep, pp, _, mb in collector.blocks:
                for il in self.plan.skeletons[self.index[(tp, cp, ep, pp)]].interleavings:
                    key = (tp, cp, ep, pp, il, mb)
                    if key not in self.scored and self._compatible(key, name, value):
                        score(key)
            if status == cp_model.OPTIMAL and self.bounds.seconds(solver.BestObjectiveBound()) >= incumbent[0]:
                certified = True
                break
        self.m.ClearAssumptions()
        time_s, _, key, j = incumbent
        if not math.isfinite(time_s):
            return None, certified
        return evaluate_in_context(self.c, self._mapping(key, j)), certified


def explain(model: Model, system: System, num_gpus: int, *, max_batch: int, datatype: Datatype, space: Space,
            kernels: Kernels = Kernels(), config: SolverConfig = SolverConfig(),
            dimensions: tuple[str, ...] | None = None, progress=None) -> Explanation:
    """The certified best time for each value of each dimension (all that take more than one
    value in the space, or `dimensions`), the winner and the runner-up. `progress(text)`, if
    given, hears which value is being proven."""
    say = progress or (lambda text: None)
    started = time.perf_counter()
    counted = count_mappings(model, system, num_gpus, max_batch, space)
    if not counted.mappings:      # no split passes the rules: nothing to explain
        return Explanation(winner=None, rows=[], runner_up=None, seconds=time.perf_counter() - started)
    explorer = Explorer(model, system, num_gpus, max_batch, datatype, space, kernels, config)
    say("the best mapping")
    winner, _ = explorer.best()
    rows: list[ValueBest] = []
    wanted = dimensions or tuple(d.name for d in DIMENSIONS)
    for dim in DIMENSIONS:
        values = counted.by_dimension.get(dim.name, {})
        if dim.name not in wanted or len(values) < 2:
            continue
        for label in values:
            value = _value_of(dim.name, label)
            begun = time.perf_counter()
            say(f"{dim.name} = {label} (value {len(rows) + 1})")
            if winner is not None and _code(dim.name, winner.mapping.value(dim.name)) == value:
                best, certified = winner, True
            else:
                best, certified = explorer.best(dim.name, value)
            rows.append(ValueBest(dim.name, value, label, best, certified, time.perf_counter() - begun))
    # the runner-up: the fastest mapping some other value allows that is slower than the
    # winner (equally fast ones are ties: a setting with no effect, or an exact coincidence)
    slower = [r for r in rows if r.best is not None and winner is not None
              and r.best.iteration_time_s > winner.iteration_time_s * (1 + TIE_REL)]
    runner_up = min(slower, key=lambda r: r.best.iteration_time_s, default=None)
    return Explanation(
        winner=winner, rows=rows, runner_up=runner_up,
        winner_binding=binding_constraints(explorer.problem, winner) if winner else [],
        runner_up_binding=binding_constraints(explorer.problem, runner_up.best) if runner_up else [],
        seconds=time.perf_counter() - started, blocks_scored=len(explorer.scored))


def rank_of(best: tuple) -> tuple[float, int]:
    """Order of candidate bests: time, then enumeration order (brute force's tie-break)."""
    return best[0], best[1]


def _value_of(name: str, label: str) -> int:
    dim = BY_NAME[name]
    if not dim.is_flag:
        return int(label)
    return next(code for code in dim.codes(int(label) + 1 if dim.kind == "network" else 0) if dim.label_of(code) == label)


def _code(name: str, value) -> int:
    dim = BY_NAME[name]
    return dim.code_of(value) if dim.is_flag else int(value)
