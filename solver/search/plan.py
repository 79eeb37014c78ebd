"""A whole training run planned over GPU counts: for each count and each training phase the
certified best mapping (solver.search.solve, the search `mapsat solve` runs), its iteration
time turned into steps, days, GPU-hours, energy and money with failures and checkpoints
(costmodel.terms.training_cost), and the count chosen by a deadline or a budget.

The GPU count is searched by solving every count of the list: time against GPUs is jagged
(a count whose factors split the model badly is slower than a smaller one), so no count is
skipped on a monotonicity argument.

A phase is (tokens, sequence length, global batch): Llama 3 raised the batch twice and then
the context to 128K (docs/plan.md); without a phases file the run is one phase.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated
from collections.abc import Callable

from pydantic import BaseModel, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.terms.context import Context
from costmodel.errors import InputError
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.limits import Bound
from costmodel.inputs.load import parse, read_document
from costmodel.inputs.model import INPUT_CONFIG, Model, RealNumber, WholeNumber, within
from costmodel.inputs.system import Datatype, System
from costmodel.terms.training_cost import Failures, RunCost, failures, run_cost, steps
from solver.search.engine import CountShare
from solver.search.solve import SolveResult, SolveStatus, SolverConfig, solve
from solver.space.declaration import Space
from solver.space.pins import check_pins, pinned

TOKENS = Bound(1.0, 1e18, "a quintillion tokens, 10^4 × the largest training sets (15-36T)")


class Phase(BaseModel):
    """One stretch of training at one sequence length and global batch."""

    model_config = INPUT_CONFIG

    name: str = Field("phase", description="A label for the tables.")
    tokens: Annotated[RealNumber, within(TOKENS)] = Field(description="Tokens trained in this phase.")
    seq_size: Annotated[WholeNumber, within(limits.SEQ_SIZE)] = Field(description="Sequence length, tokens.")
    batch: Annotated[WholeNumber, within(limits.MAX_BATCH_SEARCH)] | None = Field(
        None, description="Global batch, sequences (fixed: only splits whose dp divides it remain).")
    batch_tokens: Annotated[WholeNumber, within(limits.GPUS_COUNT)] | None = Field(
        None, description="Global batch, tokens: a whole number of sequences of seq_size.")

    @model_validator(mode="after")
    def _one_batch(self) -> Phase:
        if self.batch is not None and self.batch_tokens is not None:
            raise ValueError(f"batch {self.batch} and batch_tokens {self.batch_tokens}: give one of them")
        if self.batch_tokens is not None and self.batch_tokens % self.seq_size:
            raise ValueError(f"batch_tokens {self.batch_tokens} is not a whole number of sequences of seq_size "
                             f"{self.seq_size} ({self.batch_tokens / self.seq_size:g})")
        return self

    @property
    def batch_sequences(self) -> int | None:
        """The fixed global batch in sequences, or None (capped by --max-batch, chosen by the search)."""
        return self.batch_tokens // self.seq_size if self.batch_tokens is not None else self.batch


class PhasesFile(BaseModel):
    """A phases file: `phases:` a list of phases, run in order."""

    model_config = INPUT_CONFIG

    phases: list[Phase] = Field(min_length=1, description="The training phases, in order.")


def load_phases(path: str | Path) -> list[Phase]:
    return list(parse(PhasesFile, read_document(path), str(path)).phases)


@dataclass(frozen=True)
class Settings:
    """Failures, checkpoints, energy and price (costmodel.terms.training_cost's inputs)."""

    failure_rate_per_gpu_hour: float
    checkpoint_gbps: float
    async_checkpoint: bool
    snapshot_gbps: float
    restart_minutes: float
    gpu_power_w: float | None = None
    pue: float = 1.0
    gpu_hour_price_usd: float | None = None


@dataclass(frozen=True)
class Target:
    """What decides the chosen count: a deadline, a budget, both or neither."""

    deadline_days: float | None = None
    budget_usd: float | None = None


@dataclass(frozen=True)
class PhasePlan:
    phase: Phase
    result: SolveResult
    steps: float = math.nan
    compute_s: float = math.nan
    """steps · the certified best iteration time"""


@dataclass(frozen=True)
class CountPlan:
    """One GPU count: each phase's best mapping and the run's totals (None when a phase has
    no feasible mapping at this count; `reason` says which and why)."""

    num_gpus: int
    phases: list[PhasePlan]
    failures: Failures | None = None
    cost: RunCost | None = None
    mfu: float | None = None
    """each phase's MFU weighted by its compute time"""
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.cost is not None

    @property
    def unanswered(self) -> bool:
        """No phase proven infeasible, one without an answer: the time limit (or Ctrl-C) came
        before any mapping was found — not the same as infeasible."""
        return not self.feasible and any(p.result.status in (SolveStatus.unknown, SolveStatus.interrupted) for p in self.phases)


@dataclass(frozen=True)
class Choice:
    plan: CountPlan | None
    rule: str
    """fastest | fastest within budget | cheapest within deadline | the given count"""
    message: str = ""


@dataclass(frozen=True)
class PlanResult:
    counts: list[CountPlan]
    choice: Choice
    state_bytes: float
    seconds: float
    settings: Settings
    target: Target
    notes: list[str] = field(default_factory=list)
    interrupted_at: int | None = None
    """Ctrl-C: the GPU count whose solve it stopped (left out: its answer is not certified);
    `counts` holds those planned before it, `choice` is among them"""


# ---- the GPU counts ----

_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


MAX_PLAN_COUNTS = 256
"""GPU counts one plan solves at most: each is a certified solve of seconds to minutes, so 256
counts is already hours; more is a range whose step was left at one NVLink domain."""


def parse_counts(text: str, step: int, option: str = "--gpus") -> list[int]:
    """GPU counts as written: "1024", "512,1024,2048", "1024-8192" (every `step`, the NVLink
    domain by default) or "1024-8192:1024" (every 1024); parts joined by commas. Sorted,
    each once; more than MAX_PLAN_COUNTS is refused before any is listed."""
    ranges: list[range] = []
    for part in text.split(","):
        part = part.strip()
        ranged = _RANGE.match(part)
        if ranged:
            low, high, by = int(ranged[1]), int(ranged[2]), int(ranged[3] or step)
            if low > high or by < 1:
                raise InputError(f"{option} {part}: a range is LOW-HIGH[:STEP] with LOW <= HIGH and STEP >= 1")
            ranges.append(range(low, high + 1, by))
        elif part.isdigit():
            ranges.append(range(int(part), int(part) + 1))
        else:
            raise InputError(f"{option} {part!r}: not a count, a comma list or a range LOW-HIGH[:STEP]")
    for n in (r[i] for r in ranges for i in (0, -1)):
        if limits.GPUS_SEARCH.problem(n):
            raise InputError(f"{option} {n}: {limits.GPUS_SEARCH.problem(n)}")
    listed = sum(len(r) for r in ranges)
    if listed > MAX_PLAN_COUNTS:
        fewer = "a larger --gpu-step or a smaller --max-gpus" if option == "--max-gpus" else "a larger STEP or a list"
        raise InputError(f"{option} {text.strip()[:60]}: {listed:,} GPU counts, more than {MAX_PLAN_COUNTS} (each is a "
                         f"solve): give {fewer}")
    return sorted({n for r in ranges for n in r})


def check_buyable(counts: list[int], domain: int, name: str) -> None:
    """A count a user can buy: whole NVLink domains (or nodes), or part of one domain."""
    for n in counts:
        if n % domain and domain % n:
            raise InputError(f"--gpus {n}: not a multiple of the {name} domain of {domain} GPUs (nor a part of one); "
                             f"counts a cluster is bought in are whole domains")


# ---- the plan ----

def checkpoint_state_bytes(model: Model, context: Context) -> float:
    """What a checkpoint writes: every parameter's weights as training keeps them (the
    datatype's bytes, or the precision recipe's stored weight) and its optimizer state (fp32
    master copy and Adam's two moments: Context.precision.optimizer_bytes_per_param), the
    same terms costmodel.terms.stage_state sizes per GPU. Gradients are not checkpointed."""
    weight = context.precision.elem_bytes if context.precision.recipe is None else context.precision.recipe.weight_storage_bytes
    return model.total_params * (weight + context.precision.optimizer_bytes_per_param)


def phase_model(model: Model, phase: Phase) -> Model:
    """The model at the phase's sequence length, checked as a model file would be."""
    if phase.seq_size == model.seq_size:
        return model
    return parse(Model, {**model.model_dump(), "seq_size": phase.seq_size}, f"phase {phase.name}")


def solve_phase(model: Model, system: System, num_gpus: int, phase: Phase, *, max_batch: int, space: Space,
                pins: tuple, datatype: Datatype, kernels: Kernels, config: SolverConfig,
                progress: Callable[[str], None] | None = None, share: CountShare | None = None) -> SolveResult:
    """The certified best mapping of one phase at one count: `solve` on the phase's model, its
    batch fixed (or capped by `max_batch`), the --fix pins applied. `share`: the context and
    tables the other counts' solves built (the same answer, sooner)."""
    batch = phase.batch_sequences
    batch_pins = (("batch", (batch,)),) if batch is not None else ()
    return solve(phase_model(model, phase), system, num_gpus, max_batch=batch if batch is not None else max_batch,
                 datatype=datatype, space=pinned(space, tuple(pins) + batch_pins), kernels=kernels, config=config,
                 progress=progress, share=share)


def plan_count(model: Model, system: System, num_gpus: int, phases: list[Phase], state_bytes: float,
               settings: Settings, **solve_args) -> CountPlan:
    """Every phase at `num_gpus` GPUs, and the run's totals."""
    try:
        check_pins(tuple(solve_args["pins"]), phase_model(model, phases[0]), system, num_gpus, solve_args["space"])
    except InputError as err:
        return CountPlan(num_gpus, [], reason=str(err))
    done: list[PhasePlan] = []
    solved: dict[tuple, SolveResult] = {}     # phases of one sequence and batch share one problem
    for phase in phases:
        problem = (phase.seq_size, phase.batch_sequences)
        if problem not in solved:
            solved[problem] = solve_phase(model, system, num_gpus, phase, **solve_args)
        result = solved[problem]
        if result.best is None:
            why = "; ".join(result.infeasible_reasons) or result.status
            return CountPlan(num_gpus, done + [PhasePlan(phase, result)], reason=f"phase {phase.name}: {why}")
        n_steps = steps(phase.tokens, result.best.mapping.batch_size, phase.seq_size)
        done.append(PhasePlan(phase, result, n_steps, n_steps * result.best.iteration_time_s))
    compute_s = sum(p.compute_s for p in done)
    fail = failures(num_gpus, state_bytes, failure_rate_per_gpu_hour=settings.failure_rate_per_gpu_hour,
                    checkpoint_gbps=settings.checkpoint_gbps, async_checkpoint=settings.async_checkpoint,
                    snapshot_gbps=settings.snapshot_gbps, restart_minutes=settings.restart_minutes)
    if fail.goodput <= 0:
        return CountPlan(num_gpus, done, fail, reason=no_progress_reason(fail))
    cost = run_cost(num_gpus, compute_s, fail, gpu_power_w=settings.gpu_power_w, pue=settings.pue,
                    gpu_hour_price_usd=settings.gpu_hour_price_usd)
    mfu = sum(p.compute_s * p.result.best.mfu for p in done) / compute_s
    return CountPlan(num_gpus, done, fail, cost, mfu)


def no_progress_reason(fail: Failures) -> str:
    """Why a run whose goodput is 0 never finishes: the time lost per interruption against the
    job's mean time between interruptions."""
    return (f"failures: goodput 0, the run never finishes; lower --failure-rate or --restart-minutes (job MTBF {fail.mtbf_s / 60:.3g} min at "
            f"{fail.failure_rate_per_gpu_hour:g} per GPU-hour; restart {fail.restart_s / 60:.3g} min; "
            f"checkpoint stall {fail.checkpoint_stall_s:.3g} s)")


def choose(counts: list[CountPlan], target: Target) -> Choice:
    """The chosen count. With a budget: the fastest run within it (and within the deadline,
    when one is given too); with a deadline alone: the cheapest run that meets it (money with
    a price, GPU-hours without); with neither: the fastest (one count: that count). Ties go
    to fewer GPUs. None when no count qualifies, the message naming the nearest miss."""
    feasible = [c for c in counts if c.feasible]
    if not feasible and all(c.unanswered for c in counts):
        return Choice(None, "none", "no GPU count was answered within the time limit (none proven infeasible "
                                    "either): give a longer --time-limit")
    if not feasible:
        reasons = {(c.reason or "").split(" (")[0] for c in counts}
        if len(reasons) == 1 and next(iter(reasons)):
            return Choice(None, "none", f"no GPU count can train: {reasons.pop()}")
        return Choice(None, "none", "no GPU count has a feasible mapping for every phase")
    if len(counts) == 1 and target.deadline_days is None and target.budget_usd is None:
        return Choice(feasible[0], "the given count")

    def price(plan: CountPlan) -> float:
        return plan.cost.cost_usd if plan.cost.cost_usd is not None else plan.cost.gpu_hours

    ok = [c for c in feasible
          if (target.deadline_days is None or c.cost.wall_days <= target.deadline_days)
          and (target.budget_usd is None or c.cost.cost_usd <= target.budget_usd)]
    if target.budget_usd is not None:
        rule = "fastest within budget" + (" and deadline" if target.deadline_days is not None else "")
        key = lambda c: (c.cost.wall_s, c.num_gpus)
    elif target.deadline_days is not None:
        rule = "cheapest within deadline"
        key = lambda c: (price(c), c.cost.wall_s, c.num_gpus)
    else:
        return Choice(min(feasible, key=lambda c: (c.cost.wall_s, c.num_gpus)), "fastest")
    if ok:
        return Choice(min(ok, key=key), rule)
    fastest = min(feasible, key=lambda c: (c.cost.wall_s, c.num_gpus))
    cheapest = min(feasible, key=lambda c: (price(c), c.num_gpus))
    misses = []
    if target.deadline_days is not None:
        misses.append(f"the fastest, {fastest.num_gpus:,} GPUs, takes {fastest.cost.wall_days:.1f} days "
                      f"> deadline {target.deadline_days:g}")
    if target.budget_usd is not None:
        misses.append(f"the cheapest, {cheapest.num_gpus:,} GPUs, costs ${cheapest.cost.cost_usd:,.0f} "
                      f"> budget ${target.budget_usd:,.0f}")
    return Choice(None, rule, "no GPU count qualifies: " + "; ".join(misses))


def plan(model: Model, system: System, counts: list[int], phases: list[Phase], settings: Settings,
         target: Target = Target(), *, max_batch: int, space: Space, pins: tuple = (),
         datatype: Datatype = Datatype.bfloat16, kernels: Kernels | None = None, config: SolverConfig | None = None,
         progress: Callable[[str], None] | None = None, share: CountShare | None = None) -> PlanResult:
    """Plan the run at every count of `counts` (each solved, none skipped) and choose one.
    The counts' solves share one CountShare (`share`, or a new one): each phase's exact-model
    context and count-independent tables are built once; each answer is `solve`'s."""
    import time

    started = time.perf_counter()
    kernels, config = kernels or Kernels(), config or SolverConfig(top_k=1)
    state_bytes = checkpoint_state_bytes(model, Context.build(model, system, datatype, kernels))
    say = progress or (lambda text: None)
    share = share or CountShare()
    rows, stopped, current = [], None, counts[0]
    try:
        for i, n in enumerate(counts):
            current = n
            say(f"{n:,} GPUs ({i + 1} of {len(counts)})")
            row = plan_count(model, system, n, phases, state_bytes, settings, max_batch=max_batch, space=space,
                             pins=pins, datatype=datatype, kernels=kernels, config=config, progress=progress,
                             share=share)
            if any(p.result.status == SolveStatus.interrupted for p in row.phases):     # Ctrl-C inside CP-SAT
                stopped = n
                break
            rows.append(row)
    except KeyboardInterrupt:                # Ctrl-C anywhere else (the tables, between counts)
        stopped = current
    choice = choose(rows, target) if rows else Choice(None, "none", "interrupted (Ctrl-C) before any count was planned")
    return PlanResult(rows, choice, state_bytes, time.perf_counter() - started, settings, target,
                      interrupted_at=stopped)


__all__ = [
    "MAX_PLAN_COUNTS",
    "TOKENS",
    "Choice",
    "CountPlan",
    "Phase",
    "PhasePlan",
    "PhasesFile",
    "PlanResult",
    "Settings",
    "Target",
    "check_buyable",
    "checkpoint_state_bytes",
    "choose",
    "load_phases",
    "no_progress_reason",
    "parse_counts",
    "phase_model",
    "plan",
    "plan_count",
    "solve_phase",
]
