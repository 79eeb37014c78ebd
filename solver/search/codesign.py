"""Co-design: the least system (over a grid of knob values) whose certified best mapping
reaches a target time, with the proof that every smaller system misses it.

    knobs     hbm_gib, offload_gib (capacities) and offload_gbps, nvlink_size (outer knobs),
              each with ascending candidate values
    order     lexicographic over the knobs in the order given (`minimize`, then the other
              varied knobs in the order they were varied), each ascending; or, with
              `cost` weights, Σ weight·value first and that lexicographic order to break ties
    target    a time T; a system reaches it when its certified best time is <= T

Structure instead of a sweep:

  * Capacity enters the exact model only through feasibility (costmodel.evaluate's
    `_feasibility`: hbm_bytes <= HBM capacity, offload_bytes <= offload capacity); no
    time formula reads it. So for fixed outer knobs every mapping keeps its time as the
    capacities change, and a larger capacity only adds feasible mappings: the best time
    is non-increasing in each capacity. One CP-SAT model per outer combination, built at
    the largest capacities, answers every capacity question: each question's capacities
    are an *assumption* (HBM: the surrogate's memory lower bound <= the capacity; offload
    0: no offload flag on), and every block the exact model scores is kept, with each
    mapping's exact time, HBM and offload footprint, for all later questions
    (the pattern of solver.search.explain).
  * Offload bandwidth changes times, so each value gets its own model; but it enters only
    as bytes / (rate · efficiency(bytes)) in offload times that are exposed through
    max(·, compute) or summed, so more bandwidth never makes a mapping slower: it is
    monotone like the capacities. NVLink size changes times and which groups the networks
    hold, with no such guarantee: it is enumerated, nothing pruned across its values.
  * Lexicographic order: knob by knob, the smallest value for which *some* completion
    reaches the target — remaining monotone knobs at their largest values (exact, by
    monotonicity), remaining NVLink sizes enumerated. Every smaller candidate then has
    monotone knobs at most those of a question that missed, with the same NVLink size:
    it is proven infeasible or slower by that certified answer. Cost order: candidates in
    order, each skipped when such a missed question dominates it, else asked.

`sweep` is the reference: `solve` at every grid point (`least_in_sweep` reads its answer).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field


from costmodel.errors import InputError, InternalError
from costmodel.evaluate import Evaluation, evaluate
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB
from solver.search.codesign_grid import (CAPACITY_KNOBS, ENUMERATED_KNOBS, KNOBS, MONOTONE_KNOBS, OUTER_KNOBS,
                                         Grid, System_, Target, Verdict, as_json, check_values, least_reaching, reaches,
                                         system_at)
from solver.search.cpsat.surrogate import MAX_LINEAR_UNITS, floor_families
from solver.search.cpsat.tables import Tables, block_lower_bounds
from solver.search.cpsat.model import local_batches
from solver.search.engine import Question
from solver.search.explain import Explorer
from solver.search.solve import SolverConfig, solve
from solver.space.declaration import Space

__all__ = ["KNOBS", "CodesignResult", "Grid", "Target", "Verdict", "codesign", "least_in_sweep", "reaches", "sweep",
           "system_at"]

OFFLOAD_FLAGS = ("weight_offload", "activations_offload", "optimizer_offload")
LIVE_MODELS = 8
"""CP-SAT models (one per outer combination, tens to hundreds of MB each) kept at once; the
least recently used is dropped, and rebuilt only if a new question needs it (the answers
asked are kept)."""


@dataclass(frozen=True)
class CodesignResult:
    system: System_ | None            # the least system reaching the target (None: none does)
    best: Evaluation | None           # its certified best mapping
    certified_optimal: bool           # every question behind the answer and the proof certified
    target_time_s: float | None
    reference: Evaluation | None      # the fastest mapping of the systems asked (--within: of the grid)
    proof: list[Verdict]              # every candidate less than the answer (all, if none reaches)
    questions: int                    # candidate systems asked (certified best times computed)
    grid_size: int
    seconds: float
    asked: dict = field(default_factory=dict, repr=False)   # key -> (system, best, certified)

    def front(self, knob: str, group: str | None) -> dict:
        """MFU against `knob` for each value of `group`: {group value: [(knob value, best MFU
        over the other knobs)]} from the systems asked (all, with pareto=True)."""
        out: dict = {}
        for point, best, _ in self.asked.values():
            line = out.setdefault(point.get(group) if group else None, {})
            mfu = best.mfu if best is not None else 0.0
            line[point[knob]] = max(line.get(point[knob], 0.0), mfu)
        return {g: sorted(line.items()) for g, line in sorted(out.items(), key=lambda kv: (kv[0] is None, kv[0]))}

    def to_dict(self) -> dict:
        def brief(ev: Evaluation | None) -> dict | None:
            if ev is None:
                return None
            d = ev.to_dict()
            return {k: d[k] for k in ("mapping", "iteration_time_s", "mfu", "hfu", "sample_rate", "memory", "time")}

        return {"system": as_json(self.system), "best": brief(self.best), "certified_optimal": self.certified_optimal,
                "target_time_s": self.target_time_s, "reference": brief(self.reference),
                "proof": [v.to_dict() for v in self.proof], "questions": self.questions,
                "grid_size": self.grid_size, "seconds": self.seconds}


class CapacityExplorer(Explorer):
    """One CP-SAT model for one outer combination, at the grid's largest capacities, asked
    for the certified best mapping under smaller capacities (each an assumption)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tables = Tables(self.c, self.v, self.problem.num_gpus, self.plan.space, len(self.c.net.size))
        self.floors: dict[tuple[float, float], dict] = {}

    def best_under(self, capacity: tuple[float, float]) -> tuple[Evaluation | None, bool]:
        """The certified best mapping within (HBM bytes, offload bytes). The surrogate's block
        floors are recomputed for these capacities (a block none of whose mappings fits gets
        inf): they rank the warm start and prove the answer, and their minimum per split and
        per (tp, microbatch) over the blocks not yet scored is a cut enforced by the
        capacity's literal."""
        if capacity not in self.floors:
            hbm, offload = capacity
            c = dataclasses.replace(self.c, memory=dataclasses.replace(self.c.memory, offload_capacity_bytes=offload))
            floors = block_lower_bounds(self.tables, c, self.plan.space, self.plan.skeletons,
                                        local_batches(self.problem, self.v), offload > 0, self.v.num_networks, hbm)
            self.floors[capacity] = floors
            self._conditional_floor_cuts(self._assumption("capacity", capacity)[0], floors)
        floors = self.floors[capacity]
        return self.best_of(Question(
            rows=lambda block: (block.hbm_bytes <= capacity[0]) & (block.offload_bytes <= capacity[1]),
            assumptions=tuple(self._assumption("capacity", capacity)),
            ranked=sorted((f, k) for k, f in floors.items() if math.isfinite(f))))

    def _conditional_floor_cuts(self, literal, floors: dict) -> None:
        """Bounds.add_floor_cuts for one capacity, each inequality enforced by its literal."""
        m, v, q = self.m, self.v, self.bounds.quantization
        for family, lits in floor_families(floors, v, self.scored):
            weighted = []
            for key, pair in lits.items():
                value = family.get(key, math.inf)
                if not math.isfinite(value):      # nothing unscored there fits these capacities
                    m.AddBoolOr([pair.Not(), literal.Not()])
                else:
                    units = math.floor(min(value / q.time_unit_s, MAX_LINEAR_UNITS)) - q.time_terms
                    weighted.append(max(0, units) * pair)
            m.Add(self.objective >= sum(weighted)).OnlyEnforceIf(literal)

    def _assumption(self, name, capacity) -> list:
        """capacity = (HBM bytes, offload bytes). HBM: the surrogate's lower bound of the
        footprint fits (as add_bounds does for the largest); offload 0: no offload flag on.
        Smaller positive offload capacities add nothing here (a relaxation: the exact
        scoring decides)."""
        if capacity not in self.literals:
            m, v, q = self.m, self.v, self.bounds.quantization
            lit = m.NewBoolVar(f"capacity[{capacity[0] / GiB:g}GiB,{capacity[1] / GiB:g}GiB]")
            m.Add(self.bounds.memory() <= math.floor(capacity[0] / q.memory_unit_bytes) + q.memory_terms
                  ).OnlyEnforceIf(lit)
            if capacity[1] <= 0:
                for flag in OFFLOAD_FLAGS:
                    if flag in v.flags and 1 in v.flags[flag]:
                        m.AddImplication(lit, v.flags[flag][1].Not())
            self.literals[capacity] = lit
        return [self.literals[capacity]]


class Codesign:
    """The questions, asked once each: certified best time of one candidate system."""

    def __init__(self, model: Model, base: System, num_gpus: int, grid: Grid, *, max_batch: int,
                 datatype: Datatype, space: Space, kernels: Kernels, config: SolverConfig):
        self.model, self.base, self.num_gpus, self.grid = model, base, num_gpus, grid
        self.args = dict(max_batch=max_batch, datatype=datatype, space=space, kernels=kernels, config=config)
        self.explorers: dict[tuple, CapacityExplorer] = {}
        self.asked: dict[tuple, tuple[System_, Evaluation | None, bool]] = {}
        self.top = {k: max(v) for k, v in grid.values.items() if k in CAPACITY_KNOBS}

    def _explorer(self, point: System_) -> CapacityExplorer:
        outer = self.grid.outer(point)
        if outer in self.explorers:       # most recently used last: the first is dropped when full
            self.explorers[outer] = self.explorers.pop(outer)
        else:
            if len(self.explorers) >= LIVE_MODELS:
                del self.explorers[next(iter(self.explorers))]
            largest = system_at(self.base, {**{k: v for k, v in point.items() if k in OUTER_KNOBS}, **self.top})
            a = self.args
            explorer = CapacityExplorer(self.model, largest, self.num_gpus, a["max_batch"], a["datatype"],
                                        a["space"], a["kernels"], a["config"])
            self.explorers[outer] = explorer
        return self.explorers[outer]

    def ask(self, point: System_) -> tuple[Evaluation | None, bool]:
        """The certified best mapping of one candidate system (None: none feasible)."""
        key = self.grid.key(point)
        if key not in self.asked:
            system = system_at(self.base, point)
            capacity = (system.usable_hbm_bytes, system.offload.capacity_bytes if system.offload else 0.0)
            found, certified = self._explorer(point).best_under(capacity)
            best = None
            if found is not None:    # re-evaluated on the candidate itself: its own feasibility
                best = evaluate(self.model, system, found.mapping)
                if not best.feasible:
                    raise InternalError(f"internal error: co-design's best mapping at {point} is infeasible there "
                                        f"({'; '.join(best.reasons)}); please report it with the input files")
            self.asked[key] = (point, best, certified)
        return self.asked[key][1:]


def codesign(model: Model, system: System, num_gpus: int, grid: Grid, target: Target, *, max_batch: int = 3072,
             datatype: Datatype = Datatype.bfloat16, space: Space, kernels: Kernels = Kernels(),
             config: SolverConfig = SolverConfig(), pareto: bool = False) -> CodesignResult:
    """The least system of `grid` whose certified best time reaches `target`, with the proof.
    `pareto`: also ask every grid point (result.front), on the same shared models."""
    started = time.perf_counter()
    check_values(system, grid)
    q = Codesign(model, system, num_gpus, grid, max_batch=max_batch, datatype=datatype, space=space,
                 kernels=kernels, config=config)
    top = {k: max(v) for k, v in grid.values.items() if k in MONOTONE_KNOBS}
    outer_values = [dict(zip(ENUMERATED_KNOBS, combo)) for combo in
                    itertools.product(*(grid.values.get(k, (None,)) for k in ENUMERATED_KNOBS))]
    outer_values = [{k: v for k, v in o.items() if v is not None} for o in outer_values]
    tops = ({**o, **top} for o in outer_values)   # each NVLink size with every monotone knob largest
    if target.kind == "within":      # relative to the fastest the grid allows: every top is needed
        found = [ev for ev, _ in (q.ask(p) for p in tops) if ev is not None]
    elif target.kind == "mfu":       # MFU·time is one constant: any feasible mapping gives it
        found = next(([ev] for ev, _ in (q.ask(p) for p in tops) if ev is not None), [])
    else:
        found = [None]
    if not found:                    # nothing is feasible even at the largest capacities
        target_s, answer = None, None
    else:
        target_s = target.time_s(min(found, key=lambda ev: ev.iteration_time_s)) if found[0] else target.value
        _check_one_batch(target, q)
        answer = (_lexicographic if not grid.cost else _by_cost)(q, grid, target_s)
    asked = [best for _, best, _ in q.asked.values() if best is not None]
    reference = min(asked, key=lambda ev: ev.iteration_time_s, default=None)
    if pareto:                       # grouped by outer combination: each model built once
        for point in sorted(grid.candidates(), key=lambda p: tuple(p.get(k, 0.0) for k in OUTER_KNOBS)):
            q.ask(point)
    return _result(q, grid, answer, target_s, reference, started)


def _lexicographic(question: Codesign, grid: Grid, target_s: float) -> System_ | None:
    """Knob by knob in order, the smallest value some completion reaches the target with."""
    fixed: System_ = {}
    for i, knob in enumerate(grid.order):
        rest = grid.order[i + 1:]
        free_outer = [k for k in rest if k in ENUMERATED_KNOBS]
        top = {k: max(grid.values[k]) for k in rest if k in MONOTONE_KNOBS}
        completions = [dict(zip(free_outer, combo))
                       for combo in itertools.product(*(grid.values[k] for k in free_outer))]

        def some_completion_reaches(value: float) -> bool:
            return any(reaches(question.ask({**fixed, knob: value, **c, **top})[0], target_s) for c in completions)

        # more of a monotone knob never misses where less reaches: bisect its values
        value = least_reaching(grid.values[knob], some_completion_reaches, monotone=knob in MONOTONE_KNOBS)
        if value is None:
            return None
        fixed = {**fixed, knob: value}
    return fixed


def _by_cost(question: Codesign, grid: Grid, target_s: float) -> System_ | None:
    """Candidates cheapest first; one a missed question dominates is skipped."""
    for point in grid.candidates():
        missed = [p for p, best, _ in question.asked.values() if not reaches(best, target_s)]
        if any(grid.dominates(p, point) for p in missed):
            continue
        if reaches(question.ask(point)[0], target_s):
            return point
    return None


def _check_one_batch(target: Target, question: Codesign) -> None:
    if target.kind != "mfu":
        return
    batches = {sk.batch for e in question.explorers.values() for sk in e.plan.skeletons}
    if len(batches) > 1:
        raise InputError(f"--target-mfu: the space's splits train different global batches "
                         f"({', '.join(str(b) for b in sorted(batches))}), so MFU is not one function of time; "
                         f"give --batch, or use --target-time or --within")


def _result(question: Codesign, grid: Grid, answer, target_s, reference, started) -> CodesignResult:
    candidates = grid.candidates()
    limit = grid.key(answer) if answer is not None else None
    smaller = [p for p in candidates if limit is None or grid.key(p) < limit]
    proof = []
    for point in smaller:
        key = grid.key(point)
        if key in question.asked:
            _, best, certified = question.asked[key]
            proof.append(Verdict(point, best.iteration_time_s if best else None, certified))
            continue
        # the tightest missed question dominating it
        # (with no target, nothing is feasible at the largest capacities: every top misses)
        over = [(p, best, cert) for p, best, cert in question.asked.values()
                if grid.dominates(p, point) and (target_s is None or not reaches(best, target_s))]
        if not over:
            raise InternalError(f"internal error: co-design left {point} unproven; please report it")
        p, best, cert = min(over, key=lambda item: grid.key(item[0]))
        proof.append(Verdict(point, best.iteration_time_s if best else None, cert, dominated_by=p))
    best, certified = (None, True) if answer is None else question.ask(answer)
    all_certified = certified and all(v.certified for v in proof)
    return CodesignResult(answer, best, all_certified, target_s, reference, proof, len(question.asked),
                          len(candidates), time.perf_counter() - started, asked=dict(question.asked))


def sweep(model: Model, system: System, num_gpus: int, grid: Grid, *, max_batch: int = 3072,
          datatype: Datatype = Datatype.bfloat16, space: Space, kernels: Kernels = Kernels(),
          config: SolverConfig = SolverConfig()) -> dict[tuple, Evaluation | None]:
    """The reference: `solve` at every grid point, by the grid's key (None: infeasible)."""
    check_values(system, grid)
    return {grid.key(point): solve(model, system_at(system, point), num_gpus, max_batch=max_batch, datatype=datatype,
                                   space=space, kernels=kernels, config=config).best
            for point in grid.candidates()}


def least_in_sweep(grid: Grid, results: dict[tuple, Evaluation | None], target: Target) -> System_ | None:
    """The least grid point whose swept best reaches the target (None: none does)."""
    feasible = [ev for ev in results.values() if ev is not None]
    if not feasible:
        return None
    target_s = target.time_s(min(feasible, key=lambda ev: ev.iteration_time_s))
    return next((p for p in grid.candidates() if reaches(results[grid.key(p)], target_s)), None)
