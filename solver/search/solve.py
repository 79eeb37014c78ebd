"""The certified optimum: CP-SAT over a sound surrogate, refined by the exact model.

    data        the space's skeletons, the exact model's tables (solver.search.cpsat.surrogate)
    variables   tp, pp, dp, batch, interleaving, microbatch and every flag (Variables)
    constraints the named constraints (solver.search.cpsat.constraints) + the HBM relaxation
    objective   a piecewise-linear lower bound of the exact iteration time
    loop        solve → take the candidates CP-SAT found → score their whole (tp, pp,
                interleaving, microbatch) block exactly with the vectorized model → keep the
                top K → cut the scored blocks → require the surrogate to beat the K-th best
                → repeat until CP-SAT proves nothing left can (certified) or time runs out.

Because the surrogate never over-estimates an exact time and its constraints never exclude
a feasible mapping, the end of the loop certifies the exact model's optimum — the same
answer as scoring every mapping (solver.search.brute), ties broken the same way (time, then
enumeration order).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from ortools.sat.python import cp_model

import costmodel.limits as limits
from costmodel.context import Context
from costmodel.encoding import MappingArrays
from costmodel.errors import InputError
from costmodel.evaluate import Evaluation, evaluate_arrays_in_context, evaluate_in_context
from costmodel.kernels import Kernels
from costmodel.model import Model
from costmodel.system import Datatype, System
from costmodel.units import GiB
from solver.search.cpsat.constraints import STRUCTURE, Problem
from solver.search.cpsat.surrogate import add_bounds
from solver.search.cpsat.run import checked_solve, new_solver
from solver.search.cpsat.variables import Variables
from solver.search.distinct import SKELETON, equivalents, group_keys, top_groups
from solver.space.enumerate import plan
from solver.space.declaration import Space, get_space


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


@dataclass(frozen=True)
class SolverConfig:
    """How hard and how to search. Nothing in the loop is hard-coded beyond these."""

    time_limit_s: float = 120.0   # wall-clock budget for the whole loop
    workers: int = 1              # CP-SAT search workers (1 is deterministic run to run)
    seed: int = 0                 # CP-SAT random seed
    top_k: int = 5                # mappings reported, all certified when the loop completes

    def __post_init__(self) -> None:
        """Library callers (batch, shape) get the command line's bounds: CP-SAT reads a NaN or
        infinite limit, a 32-bit overflowing seed or a huge worker count as an invalid model."""
        for name, bound in (("time_limit_s", limits.TIME_LIMIT_S), ("workers", limits.WORKERS),
                            ("seed", limits.SEED), ("top_k", limits.TOP_K)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"solver {name}: {value!r} is not a number")
            if not math.isfinite(value):
                raise InputError(f"solver {name}: {value!r} is not a finite number")
            if name != "time_limit_s" and not isinstance(value, int):
                raise InputError(f"solver {name}: {value!r} is not a whole number")
            if bound.problem(value):
                raise InputError(f"solver {name}: {value:g} is {bound.problem(value)}")


@dataclass(frozen=True)
class SolveResult:
    status: str                       # optimal | feasible | infeasible | unknown (no incumbent in time) | interrupted
    best: Evaluation | None
    top: list[Evaluation]
    certified_optimal: bool
    bound_s: float | None             # proven lower bound on the best exact time
    gap: float | None                 # (best - bound) / best
    seconds: float
    candidates_scored: int            # mappings the exact model scored
    blocks_scored: int                # (tp, cp, ep, pp, interleaving, microbatch) blocks scored
    rounds: int                       # CP-SAT solves
    space_size: int                   # mappings in the space
    binding: list[str] = field(default_factory=list)
    infeasible_reasons: list[str] = field(default_factory=list)
    cpsat_status: str | None = None   # CP-SAT's status in its last round, as it named it (None: no round)
    equivalents: list[dict[str, list[str]]] = field(default_factory=list)
    """per entry of `top`: the settings its equally fast and large group also takes"""

    def to_dict(self) -> dict:
        def brief(ev: Evaluation) -> dict:
            d = ev.to_dict()
            return {"mapping": d["mapping"], "iteration_time_s": d["iteration_time_s"], "mfu": d["mfu"],
                    "hfu": d["hfu"], "sample_rate": d["sample_rate"], "memory": d["memory"], "time": d["time"]}

        return {"status": self.status, "certified_optimal": self.certified_optimal,
                "best": brief(self.best) if self.best else None,
                "top": [{**brief(e), "equivalent": same} for e, same in
                        zip(self.top, self.equivalents or [{}] * len(self.top))],
                "bound_s": self.bound_s, "gap": self.gap, "seconds": self.seconds,
                "candidates_scored": self.candidates_scored, "blocks_scored": self.blocks_scored,
                "rounds": self.rounds, "space_size": self.space_size, "binding": self.binding,
                "infeasible_reasons": self.infeasible_reasons, "cpsat_status": self.cpsat_status}


class BlockCollector(cp_model.CpSolverSolutionCallback):
    """Records the (tp, cp, ep, pp, interleaving, microbatch) block of every solution CP-SAT finds."""

    def __init__(self, variables: Variables):
        super().__init__()
        self.variables = variables
        self.blocks: list[tuple[int, int, int, int, int, int]] = []

    def on_solution_callback(self) -> None:
        key, _ = self.variables.decode(self)
        if key not in self.blocks:
            self.blocks.append(key)


class _Incumbents:
    """The K best groups of equivalent exactly scored feasible mappings, by (time, smallest
    ordinal) (solver.search.distinct): every member of each is kept."""

    def __init__(self, k: int):
        self.k = k
        self.time_s = np.zeros(0)
        self.ordinal = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros((0, len(SKELETON) + 3), dtype=np.int64)
        self.rows: MappingArrays | None = None
        self.groups: list[np.ndarray] = []

    def offer(self, time_s: np.ndarray, ordinal: np.ndarray, rows: MappingArrays, hbm_bytes: np.ndarray,
              offload_bytes: np.ndarray) -> None:
        rows_all = rows if self.rows is None else MappingArrays.concatenate([self.rows, rows])
        time_all = np.concatenate([self.time_s, time_s])
        ord_all = np.concatenate([self.ordinal, ordinal])
        keys_all = np.concatenate([self.keys, group_keys(rows, time_s, hbm_bytes, offload_bytes)])
        groups = top_groups(time_all, ord_all, keys_all, self.k)
        keep = np.concatenate(groups)
        self.time_s, self.ordinal, self.keys, self.rows = time_all[keep], ord_all[keep], keys_all[keep], \
            rows_all.take(keep)
        sizes = np.cumsum([0] + [len(g) for g in groups])
        self.groups = [np.arange(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    @property
    def target_s(self) -> float:
        """The time a new mapping must beat (or tie) to enter the top K groups."""
        return float(self.time_s[self.groups[-1][0]]) if len(self.groups) == self.k else math.inf


def solve(model: Model, system: System, num_gpus: int, *, max_batch: int = 3072,
          datatype: Datatype = Datatype.bfloat16, space: str | Space = "full", kernels: Kernels = Kernels(),
          config: SolverConfig = SolverConfig(), progress: Callable[[str], None] | None = None) -> SolveResult:
    """The fastest mapping of `model` on `num_gpus` GPUs of `system` under the exact model.
    `progress(phase)` is told what the search is doing (for a batch's hard time limit)."""
    started = time.perf_counter()
    deadline = started + config.time_limit_s
    say = progress or (lambda phase: None)
    say("building the exact model's tables and the space")
    the_space = get_space(space) if isinstance(space, str) else space
    c = Context.build(model, system, datatype, kernels)
    the_plan = plan(model, system, num_gpus, max_batch, the_space, chunk_rows=1 << 62)
    skels = the_plan.skeletons
    problem = Problem(model, system, num_gpus, max_batch, the_space)
    if not skels:
        return _infeasible(started, 0, [f"parallel split: no (tp, cp, ep, pp, dp) split of {num_gpus} GPUs meets the "
                                         f"divisibility rules (tp | hidden {model.hidden}, heads {model.attn_heads}, "
                                         f"kv_heads {model.kv_groups}; 2·cp | seq {model.seq_size}; "
                                         f"pp | blocks {model.num_blocks}) and the batch cap {max_batch}"])

    say(f"building the CP-SAT model ({len(skels)} (tp, cp, ep, pp) splits)")
    m, v = structure_model(problem, skels, flags=SEARCHED_FLAGS)
    local_batch = local_batches(problem, v)
    bounds = add_bounds(m, v, c, num_gpus, local_batch, the_space.tp_overlap_codes, c.hbm_capacity_bytes,
                        skeletons=skels)
    objective = bounds.objective()
    m.Minimize(objective)

    index = {s.split: i for i, s in enumerate(skels)}
    best = _Incumbents(config.top_k)
    scored_keys: list[tuple[int, ...]] = []   # in scoring order
    scored_set: set[tuple[int, ...]] = set()

    def score(key: tuple[int, ...]) -> None:
        """Score every mapping of one (tp, cp, ep, pp, interleaving, microbatch) block exactly,
        keep the best, and cut the block from the CP-SAT model."""
        rows, ordinals = the_plan.block(index[key[:4]], *key[4:])
        ev = evaluate_arrays_in_context(c, rows)
        ok = np.flatnonzero(ev.feasible)
        if len(ok):
            best.offer(ev.iteration_time_s[ok], ordinals[ok], rows.take(ok), ev.hbm_bytes[ok], ev.offload_bytes[ok])
        scored_keys.append(key)
        scored_set.add(key)
        v.exclude_block(key)

    # Warm start: the blocks the surrogate ranks best, scored until the next one's bound
    # cannot beat the K-th best (or WARM_START_BLOCKS are done, or the time is up).
    rounds, certified, bound_units, cpsat_status, interrupted = 0, False, None, None, False
    try:
        say("warm start: scoring the blocks the surrogate ranks best")
        ranked = sorted((floor, key) for key, floor in bounds.block_floors.items() if math.isfinite(floor))
        for floor, key in ranked[:WARM_START_BLOCKS]:
            if floor >= best.target_s * (1 + WARM_START_MARGIN) or time.perf_counter() >= deadline:
                break
            score(key)
        bounds.add_floor_cuts(m, v, exclude=scored_keys)
        while True:
            if floors_prove(ranked, scored_set, best.target_s):
                certified = True
                break
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            if math.isfinite(best.target_s):
                bounds.add_cutoff(m, best.target_s)
            solver = new_solver(remaining, config.workers, config.seed)
            collector = BlockCollector(v)
            say(f"CP-SAT round {rounds + 1} ({len(scored_keys)} blocks scored)")
            status = checked_solve(m, solver, collector)
            rounds += 1
            cpsat_status = solver.StatusName(status)
            if status == cp_model.INFEASIBLE:
                certified = True      # no unscored mapping's bound beats the K-th best
                break
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break                 # UNKNOWN: the time ran out inside the round
            bound_units = solver.BestObjectiveBound()
            # Score each candidate's block, and the same split and microbatch at every other
            # interleaving: neighbours that are often nearly as fast, cheap to score together.
            for tp, cp, ep, pp, _, mb in collector.blocks:
                for il in skels[index[(tp, cp, ep, pp)]].interleavings:
                    if (tp, cp, ep, pp, il, mb) not in scored_set:
                        score((tp, cp, ep, pp, il, mb))
            if status == cp_model.OPTIMAL and bounds.seconds(bound_units) >= best.target_s:
                certified = True
                break
    except KeyboardInterrupt:     # Ctrl-C: the best found so far, not certified
        interrupted = True
    # Every block left unscored has a surrogate floor; when none can reach the K-th best
    # (or none is left), the top K is proven whether or not CP-SAT finished a round.
    unscored = min((f for k, f in bounds.block_floors.items() if k not in scored_set), default=math.inf)
    certified = not interrupted and (certified or math.isinf(unscored) or unscored > best.target_s)
    blocks = len(scored_keys)
    scored = sum(len(the_plan.flag_tables[index[k[:4]]]) for k in scored_keys)

    top = [evaluate_in_context(c, best.rows.to_mapping(int(group[0]), datatype, kernels)) for group in best.groups]
    settings = [equivalents(best.rows, group) for group in best.groups]
    seconds = time.perf_counter() - started
    if not top:
        if certified:
            say("diagnosing why no mapping is feasible")
            return _infeasible(started, scored, diagnose(problem, skels, c, deadline - time.perf_counter()),
                               rounds, blocks, the_plan.total, cpsat_status)
        return SolveResult("interrupted" if interrupted else "unknown", None, [], False, None, None, seconds, scored,
                           blocks, rounds, the_plan.total,
                           infeasible_reasons=["interrupted (Ctrl-C) before any feasible mapping was found" if interrupted
                                               else "time limit reached before any feasible mapping was found"],
                           cpsat_status=cpsat_status)
    best_time = top[0].iteration_time_s
    if certified:
        bound_s, gap = best_time, 0.0
    else:
        # Sound either way: CP-SAT's proven bound on what was left in its last round, and
        # the smallest surrogate floor of any block not yet scored.
        bound_s = max(bounds.seconds(bound_units) if bound_units is not None else 0.0, min(unscored, best_time))
        bound_s = min(bound_s, best_time)
        gap = (best_time - bound_s) / best_time
    status = "optimal" if certified else ("interrupted" if interrupted else "feasible")
    return SolveResult(status, top[0], top, certified, bound_s, gap, seconds,
                       scored, blocks, rounds, the_plan.total, binding=binding_constraints(problem, top[0]),
                       cpsat_status=cpsat_status, equivalents=settings)


def floors_prove(ranked: list, scored: set, target_s: float) -> bool:
    """Whether the exact block floors already prove the top K: no unscored block's floor
    reaches the K-th best (`ranked`: (floor, block) of every block with a finite floor)."""
    return all(floor > target_s for floor, key in ranked if key not in scored)


def _infeasible(started, scored, reasons, rounds=0, blocks=0, size=0, cpsat_status=None) -> SolveResult:
    return SolveResult("infeasible", None, [], True, None, None, time.perf_counter() - started, scored, blocks,
                       rounds, size, infeasible_reasons=list(reasons), cpsat_status=cpsat_status)


def binding_constraints(problem: Problem, ev: Evaluation) -> list[str]:
    """What limits the best mapping: capacities nearly used up, caps reached, networks filled."""
    out = []
    system, mapping = problem.system, ev.mapping
    hbm = system.hbm.capacity_bytes
    if ev.hbm_bytes >= 0.9 * hbm:
        out.append(f"hbm capacity: {ev.hbm_bytes / GiB:.1f} of {hbm / GiB:.1f} GiB used ({100 * ev.hbm_bytes / hbm:.0f} %)")
    if system.offload is not None and ev.offload_bytes >= 0.9 * system.offload.capacity_bytes:
        cap = system.offload.capacity_bytes
        out.append(f"offload capacity: {ev.offload_bytes / GiB:.1f} of {cap / GiB:.1f} GiB used")
    if mapping.batch_size + mapping.dp > problem.max_batch:
        out.append(f"batch cap: global batch {mapping.batch_size} is the largest multiple of dp {mapping.dp} "
                   f"<= {problem.max_batch}")
    for name, degree, span, net in (("tp", mapping.tp, mapping.tp, mapping.tensor_par_net),
                                    ("cp", mapping.cp, mapping.tp * mapping.cp, mapping.context_par_net),
                                    ("ep", mapping.ep, mapping.tp * mapping.ep, mapping.expert_par_net),
                                    ("pp", mapping.pp, mapping.tp * mapping.cp * mapping.pp, mapping.pipeline_par_net)):
        size = system.networks[net].size
        if degree > 1 and span == size:
            out.append(f"network size: the {name} group spans all {size} GPUs of {system.networks[net].name}")
    if ev.time_s["offload_s"] > 0:
        out.append(f"offload bandwidth: {ev.time_s['offload_s']:.3f} s of offload traffic is not hidden "
                   f"(needs {ev.offload_bytes_per_s_needed / 1e9:.0f} GB/s)")
    return out


def structure_model(problem: Problem, skels, flags=None) -> tuple[cp_model.CpModel, Variables]:
    m = cp_model.CpModel()
    v = Variables(m, problem.space, list(skels), problem.num_gpus, len(problem.system.networks), flags=flags)
    for constraint in STRUCTURE:
        constraint.add(m, v, problem)
    return m, v


DIAGNOSE_LIMIT_S = 30.0
"""At most this long explaining an infeasible problem (within what is left of the time limit)."""


def diagnose(problem: Problem, skels, c: Context, time_limit_s: float = DIAGNOSE_LIMIT_S) -> list[str]:
    """Which named constraints rule out every mapping of the space's skeletons, with the numbers."""
    reasons = []
    system = problem.system
    deadline = time.perf_counter() + min(time_limit_s, DIAGNOSE_LIMIT_S)
    out_of_time = ["no mapping is feasible (proven); no time was left to find which constraint rules them "
                   "all out (give a longer time limit)"]
    if deadline <= time.perf_counter():
        return out_of_time
    m, _ = structure_model(problem, skels)
    status = checked_solve(m, new_solver(deadline - time.perf_counter()))
    if status == cp_model.INFEASIBLE:
        sizes = ", ".join(f"{n.name} {n.size}" for n in system.networks)
        reasons.append(f"network size: no split of {problem.num_gpus} GPUs puts tp, tp·cp, tp·ep, tp·cp·pp and all GPUs on "
                       f"networks that span them ({sizes})")
        return reasons
    if status == cp_model.UNKNOWN or deadline <= time.perf_counter():
        return out_of_time
    # the smallest HBM footprint any mapping can have (a sound lower bound)
    m, v = structure_model(problem, skels, flags=SEARCHED_FLAGS)
    local_batch = local_batches(problem, v)
    bounds = add_bounds(m, v, c, problem.num_gpus, local_batch, problem.space.tp_overlap_codes,
                        c.hbm_capacity_bytes, enforce_hbm=False)
    m.Minimize(bounds.memory())
    solver = new_solver(deadline - time.perf_counter())
    status = checked_solve(m, solver)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        q = bounds.quantization
        smallest = max(0.0, solver.BestObjectiveBound() - q.memory_terms) * q.memory_unit_bytes
        if smallest > c.hbm_capacity_bytes:
            # the relaxation also holds offloaded state within the offload capacity
            beside = (f", with at most {system.offload.capacity_gib:g} GiB in offload memory"
                      if system.offload is not None else "")
            reasons.append(f"hbm capacity: the smallest possible footprint is at least {smallest / GiB:.1f} GiB per "
                           f"GPU > {c.hbm_capacity_bytes / GiB:.1f} GiB HBM{beside}")
    elif status == cp_model.INFEASIBLE and system.offload is not None:
        reasons.append(f"offload capacity: no mapping's offloaded state fits {system.offload.capacity_gib:g} GiB")
    elif status == cp_model.UNKNOWN:
        return out_of_time
    if not reasons:
        reasons.append("exact model: every mapping the relaxed constraints allow fails the exact memory, "
                       "offload-capacity or network check")
    return reasons


def local_batches(problem: Problem, v: Variables) -> dict:
    """batch/dp of every (tp, cp, ep, pp) split the variables allow (1 where no batch exists)."""
    out = {}
    for (t, c, e, p) in v.split:
        dp = problem.num_gpus // (t * c * p)
        batch = problem.space.batch_for(dp, problem.max_batch)
        out[(t, c, e, p)] = max(1, (batch or 1) // dp)
    return out
