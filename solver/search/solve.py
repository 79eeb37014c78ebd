"""The certified optimum: the top K distinct mappings of a space, one question to the
certified search engine (solver.search.engine: CP-SAT over a sound surrogate, refined by
the exact model), with what binds the best, and why nothing fits when nothing does.

Because the surrogate never over-estimates an exact time and its constraints never exclude
a feasible mapping, the end of the loop certifies the exact model's optimum — the same
answer as scoring every mapping (solver.search.brute), ties broken the same way (time, then
enumeration order).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

import numpy as np

import costmodel.inputs.limits as limits
from costmodel.terms.context import Context
from costmodel.space.dimensions import SPANS_TEXT, SPLIT_TEXT
from costmodel.errors import InputError
from costmodel.evaluate import Evaluation, evaluate_in_context, group_spans
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB
from solver.search.distinct import equivalents
from solver.search.engine import SEARCHED_FLAGS, CountShare, Engine, OutOfTime, Question
from solver.space.declaration import Space, get_space

if TYPE_CHECKING:
    from solver.search.cpsat.constraints import Problem


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


class SolveStatus(StrEnum):
    """How a solve ended. The values are what the JSON output and the batch records say."""

    optimal = "optimal"               # certified: the exact model's best, ties broken as brute force breaks them
    feasible = "feasible"             # a mapping found, not certified before the time limit
    infeasible = "infeasible"         # certified: no mapping of the space fits
    unknown = "unknown"               # no mapping found before the time limit
    interrupted = "interrupted"       # Ctrl-C (inside CP-SAT or between rounds)


@dataclass(frozen=True)
class SolveResult:
    status: SolveStatus
    best: Evaluation | None
    top: list[Evaluation]
    certified_optimal: bool
    bound_s: float | None             # proven lower bound on the best exact time
    gap: float | None                 # (best - bound) / best
    seconds: float
    candidates_scored: int            # mappings the exact model scored
    blocks_scored: int                # (tp, cp, ep, etp, pp, interleaving, microbatch) blocks scored
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
                    "hfu": d["hfu"], "sample_rate": d["sample_rate"], "memory": d["memory"], "time": d["time"],
                    # what MFU counts (attention halved for the causal mask) and the peak it divides by
                    "model_flops_per_token": d["model_flops_per_token"], "throughput": d["throughput"]}

        return {"status": self.status.value, "certified_optimal": self.certified_optimal,
                "best": brief(self.best) if self.best else None,
                "top": [{**brief(e), "equivalent": same} for e, same in
                        zip(self.top, self.equivalents or [{}] * len(self.top))],
                "bound_s": self.bound_s, "gap": self.gap, "seconds": self.seconds,
                "candidates_scored": self.candidates_scored, "blocks_scored": self.blocks_scored,
                "rounds": self.rounds, "space_size": self.space_size, "binding": self.binding,
                "infeasible_reasons": self.infeasible_reasons, "cpsat_status": self.cpsat_status}


def solve(model: Model, system: System, num_gpus: int, *, max_batch: int = 3072,
          datatype: Datatype = Datatype.bfloat16, space: str | Space = "full", kernels: Kernels = Kernels(),
          config: SolverConfig = SolverConfig(), progress: Callable[[str], None] | None = None,
          share: CountShare | None = None) -> SolveResult:
    """The fastest mapping of `model` on `num_gpus` GPUs of `system` under the exact model.
    `progress(phase)` is told what the search is doing (for a batch's hard time limit).
    `share`: what solves of the same problem at other GPU counts already built (CountShare:
    the exact model's context and the count-independent tables); the answer is the same.
    The time limit holds from the start: when it runs out before the CP-SAT model is built,
    the answer is "unknown" with nothing found."""
    started = time.perf_counter()
    the_space = get_space(space) if isinstance(space, str) else space
    try:
        engine = Engine(model, system, num_gpus, max_batch, datatype, the_space, kernels, workers=config.workers,
                        seed=config.seed, one_question=True, deadline=started + config.time_limit_s, say=progress,
                        share=share)
    except OutOfTime:
        return SolveResult(SolveStatus.unknown, None, [], False, None, None, time.perf_counter() - started, 0, 0, 0, 0,
                           infeasible_reasons=["time limit reached before any feasible mapping was found"])
    problem, skels, total = engine.problem, engine.plan.skeletons, engine.plan.total
    if not skels:
        return _infeasible(started, 0, [no_split_reason(model, system, num_gpus, max_batch, the_space)])
    found = engine.search(Question(top_k=config.top_k, time_limit_s=config.time_limit_s
                                   - (time.perf_counter() - started)))
    blocks, scored = len(engine.scored), engine.mappings_scored()
    top = [evaluate_in_context(engine.c, engine.mapping(*group[0])) for group in found.groups]
    settings = [equivalents(engine.group_flags(group), np.arange(len(group))) for group in found.groups]
    seconds = time.perf_counter() - started
    if not top:
        if found.certified:
            say = progress or (lambda phase: None)
            say("diagnosing why no mapping is feasible")
            return _infeasible(started, scored, diagnose(problem, skels, engine.c,
                                                         started + config.time_limit_s - time.perf_counter()),
                               found.rounds, blocks, total, found.cpsat_status)
        return SolveResult(SolveStatus.interrupted if found.interrupted else SolveStatus.unknown, None, [], False, None, None, seconds,
                           scored, blocks, found.rounds, total,
                           infeasible_reasons=["interrupted (Ctrl-C) before any feasible mapping was found"
                                               if found.interrupted
                                               else "time limit reached before any feasible mapping was found"],
                           cpsat_status=found.cpsat_status)
    best_time = top[0].iteration_time_s
    gap = 0.0 if found.certified else (best_time - found.bound_s) / best_time
    status = (SolveStatus.optimal if found.certified
              else SolveStatus.interrupted if found.interrupted else SolveStatus.feasible)
    return SolveResult(status, top[0], top, found.certified, best_time if found.certified else found.bound_s, gap,
                       seconds, scored, blocks, found.rounds, total, binding=binding_constraints(problem, top[0]),
                       cpsat_status=found.cpsat_status, equivalents=settings)


def no_split_reason(model: Model, system: System, num_gpus: int, max_batch: int, space: Space) -> str:
    """Why no parallel split exists, in one short line: with a given batch that some split
    would take at another batch, the nearest batches that work; else the rules by name."""
    from solver.search.nearest import nearest_batches

    head = f"parallel split: no {SPLIT_TEXT} split of {num_gpus:,} GPUs"
    given = _given_batch(space)
    if given is not None:
        nearest = nearest_batches(model, system, num_gpus, given, space)
        if nearest:
            return (f"{head} has a dp that divides the given batch {given:,}; nearest batches that work: "
                    f"{' or '.join(f'{b:,}' for b in nearest)}")
        return f"{head} meets the divisibility rules (`mapsat spaces` lists them), at any batch"
    return (f"{head} meets the divisibility rules (`mapsat spaces` lists them) and the batch cap {max_batch:,} "
            f"(dp <= the cap)")


def _given_batch(space: Space) -> int | None:
    """The global batch the user fixed (--batch, a batch file's batch), or None under a cap."""
    fixed = dict(space.pins).get("batch")
    return fixed[0] if fixed is not None and len(fixed) == 1 else None


def _infeasible(started, scored, reasons, rounds=0, blocks=0, size=0, cpsat_status=None) -> SolveResult:
    return SolveResult(SolveStatus.infeasible, None, [], True, None, None, time.perf_counter() - started, scored, blocks,
                       rounds, size, infeasible_reasons=list(reasons), cpsat_status=cpsat_status)


def binding_constraints(problem: "Problem", ev: Evaluation) -> list[str]:
    """What limits the best mapping: capacities nearly used up, caps reached, networks filled."""
    out = []
    system, mapping = problem.system, ev.mapping
    hbm = system.usable_hbm_bytes
    if ev.hbm_bytes >= 0.9 * hbm:
        usable = " usable (capacity less the HBM headroom)" if system.hbm_headroom_bytes > 0 else ""
        out.append(f"hbm capacity: {ev.hbm_bytes / GiB:.1f} of {hbm / GiB:.1f} GiB{usable} used "
                   f"({100 * ev.hbm_bytes / hbm:.0f} %)")
    if system.offload is not None and ev.offload_bytes >= 0.9 * system.offload.capacity_bytes:
        cap = system.offload.capacity_bytes
        out.append(f"offload capacity: {ev.offload_bytes / GiB:.1f} of {cap / GiB:.1f} GiB used")
    given = _given_batch(problem.space)
    if given is not None:                 # the user fixed it: the given batch, not a cap, limits dp
        out.append(f"given batch: global batch {mapping.batch_size} sequences, fixed (dp {mapping.dp} divides it)")
    elif mapping.batch_size + mapping.dp > problem.max_batch:
        out.append(f"batch cap: global batch {mapping.batch_size} is the largest multiple of dp {mapping.dp} "
                   f"<= {problem.max_batch}")
    for name, degree, span, net in group_spans(SimpleNamespace(**mapping.values())):
        if name == "dp":
            continue
        size = system.networks[net].size
        if degree > 1 and span == size:
            out.append(f"network size: the {name} group spans all {size} GPUs of {system.networks[net].name}")
    if ev.time.offload_s > 0:
        out.append(f"offload bandwidth: {ev.time.offload_s:.3f} s of offload traffic is not hidden "
                   f"(needs {ev.offload_bytes_per_s_needed / 1e9:.0f} GB/s)")
    return out


DIAGNOSE_LIMIT_S = 30.0
"""At most this long explaining an infeasible problem (within what is left of the time limit)."""


def network_size_reason(system: System, num_gpus: int) -> str:
    """Why no mapping is feasible when the structure model (divisibility and network spans) has
    no solution."""
    sizes = ", ".join(f"{n.name} {n.size}" for n in system.networks)
    return f"network size: no split of {num_gpus} GPUs puts {SPANS_TEXT} on networks that span them ({sizes})"


def diagnose(problem: "Problem", skels, context: Context, time_limit_s: float = DIAGNOSE_LIMIT_S) -> list[str]:
    """Which named constraints rule out every mapping of the space's skeletons, with the numbers."""
    from ortools.sat.python import cp_model

    from solver.search.cpsat.model import local_batches, structure_model
    from solver.search.cpsat.run import checked_solve, new_solver
    from solver.search.cpsat.surrogate import add_bounds
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
        return [network_size_reason(system, problem.num_gpus)]
    if status == cp_model.UNKNOWN or deadline <= time.perf_counter():
        return out_of_time
    # the smallest HBM footprint any mapping can have (a sound lower bound)
    m, v = structure_model(problem, skels, flags=SEARCHED_FLAGS)
    local_batch = local_batches(problem, v)
    bounds = add_bounds(m, v, context, problem.num_gpus, local_batch, problem.space,
                        context.memory.hbm_capacity_bytes, enforce_hbm=False)
    m.Minimize(bounds.memory())
    solver = new_solver(deadline - time.perf_counter())
    status = checked_solve(m, solver)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        q = bounds.quantization
        smallest = max(0.0, solver.BestObjectiveBound() - q.memory_terms) * q.memory_unit_bytes
        if smallest > context.memory.hbm_capacity_bytes:
            # the relaxation also holds offloaded state within the offload capacity
            beside = (f", with at most {system.offload.capacity_gib:g} GiB in offload memory"
                      if system.offload is not None else "")
            reasons.append(f"hbm capacity: the smallest possible footprint is at least {smallest / GiB:.1f} GiB per "
                           f"GPU > {context.memory.hbm_capacity_bytes / GiB:.1f} GiB HBM{beside}")
    elif status == cp_model.INFEASIBLE and system.offload is not None:
        reasons.append(f"offload capacity: no mapping's offloaded state fits {system.offload.capacity_gib:g} GiB")
    elif status == cp_model.UNKNOWN:
        return out_of_time
    if not reasons:
        reasons.append("exact model: every mapping the relaxed constraints allow fails the exact memory, "
                       "offload-capacity or network check")
    return reasons
