"""Whole-step terms fitted to measured iterations, and checked on iterations the fit did not
see: `mapsat calibrate --runs`'s library side (the terms: costmodel.terms.step_terms).

What is fitted, on what:

| field of `step:` | unit | fitted to | how it enters |
| --- | --- | --- | --- |
| `kernel_gap_us` | µs per kernel | measured step times | each kernel's fixed cost (GEMM and attention `launch_us`, `hbm.latency_us`) |
| `allocator_fragmentation` | fraction | measured peak memory | of the bytes allocated and freed every microbatch |
| `power_window_ms` | ms | measured step times | each GEMM pays at least the `power_drop` of a GEMM lasting this long |

The runs a fit uses (`fit_pool`): the newest software release of each configuration, dense
models (mixture-of-experts rows are another term's), not NVFP4 (the model has no FP4
datatype), measured, and feasible in the model. One value of each field is shared by every
system the runs use: systems differ only through their specifications and microbenchmarks.

The fit minimises a robust loss of the log ratios predicted / measured (Cauchy, scale
`ROBUST_SCALE`: a run the model cannot express, such as a group spanning two NVLink racks,
weighs like a run 10 % off rather than deciding the fit alone) by iteratively reweighted
Gauss–Newton with exact evaluations of the cost model; parameters stay within their bounds
(>= 0, and at most a ceiling where one is declared) and are rounded to 3 significant digits, and every error reported is that of the rounded values.

Only what the runs determine is fitted (`_determined`): each term's standard error from the
fit's Jacobian; a term known to no better than `RELATIVE_SE_LIMIT` of its value (or of its
resolution near 0) is held at the replaced file's value (`prior`) and the others refitted. Runs
the model predicts more than `USABLE_RATIO` off are not used; at most `MAX_RUNS` are fitted. Each
term has a physical range (`StepParameter.low`, `high`, `why`): costmodel.calibration.step_render
refuses a fit outside it, or worse left out than the terms it replaces.

Out of sample (`held_out`): for each fold the terms are fitted anew on the other runs, from
their starting values as the whole fit is, and the fold's runs are scored with them. Folds leave out
one configuration (LOCO; for a single-GPU iteration, that iteration) or one group of systems
(one system, or a generation: Hopper, Blackwell).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from costmodel.calibration.fit import rounded
from costmodel.errors import InputError
from costmodel.measured.run_scoring import (RunInputs, RunScore, newest_per_configuration, score_runs,
                                   split_dense)
from costmodel.measured.runs import Precision, Run
from costmodel.inputs.step import WholeStep

__all__ = ["FOLDS", "FittedStep", "HeldOut", "LOCO_TOLERANCE", "MAX_RUNS", "RELATIVE_SE_LIMIT", "STEP_PARAMETERS",
           "StepParameter", "blackwell_or_hopper", "current_step", "fit_pool", "fit_step", "held_out", "held_out_scores",
           "relative_error", "scores_with_step"]

ROBUST_SCALE = 0.10
"""Cauchy scale of the log-ratio residuals: a run this far off weighs half as much as a run on
the mark, one 3.4× off (log 1.22) 1/150 as much."""


@dataclass(frozen=True)
class StepParameter:
    """One fitted field of `step:`: what it is fitted to, the step of its sensitivity, the value
    below which it is written as 0, the physical range a fit must land in, and the resolution
    (the size below which it no longer matters: its standard error is judged against its value
    or this, whichever is larger)."""

    name: str
    target: str            # "time" or "memory"
    probe: float           # finite-difference step, file units
    floor: float
    low: float
    high: float
    why: str
    """where the range comes from"""
    resolution: float
    ceiling: float = float("inf")
    start: float = 0.0
    """where the fit starts: the term's default, or (the power window, whose effect has no slope
    at 0: no GEMM of a step is smaller than a window of 0) a value where it has one"""


STEP_PARAMETERS = (
    # 1 µs: a tenth of the shipped gap, about 1 % of a small model's step (test_step_terms)
    StepParameter("kernel_gap_us", "time", 1.0, 0.01, 0.0, 50.0,
                  "a CUDA launch and stream synchronisation cost a few µs (NVIDIA, 'Getting Started with CUDA "
                  "Graphs', 2019: ~2-4 µs per launch), eager PyTorch's Python dispatch tens of µs at most",
                  resolution=1.0),
    # 0.5 ms: the probe; a window that short changes only GEMMs shorter than it
    StepParameter("power_window_ms", "time", 0.5, 0.01, 0.0, 10_000.0, start=1.0,
                  why="a GPU's power limiter acts over milliseconds to seconds (NVIDIA H100 power capping; "
                      "nvidia-smi's power samples), not over minutes", resolution=0.5),
    # 0.02: moves the single-GPU peaks by 1-1.6 % (their sensitivity is 0.5-0.8 per unit), the
    # median error of the measured peaks
    StepParameter("allocator_fragmentation", "memory", 0.01, 1e-4, 0.0, 0.5,
                  why="a caching allocator holding more than half again of what it frees every microbatch "
                      "would run out of memory first (PyTorch CUDA caching allocator: block splitting and "
                      "rounding to 512 B / 2 MiB)", resolution=0.02))

RELATIVE_SE_LIMIT = 0.5
"""A term is fitted only if its standard error is at most half its value (or half its
resolution, for a value near 0): beyond that the runs do not determine it, and it is held."""

LOCO_TOLERANCE = 0.01
"""How much worse (median |error| of step time, absolute) the fit's leave-one-configuration-out
error may be than the replaced terms' error on the same runs before it is refused: leaving a
configuration out costs a refit its optimism; on the shipped runs that is 0.1-0.3 points."""

USABLE_RATIO = 10.0
"""A run is used only if the model, with the replaced terms, predicts its step within this
factor: one further off is a run the model cannot express (or a typo), which no whole-step
term of microseconds should absorb."""

MAX_RUNS = 200
"""At most this many runs are fitted: each fit iteration scores every run once per term, and
leave-one-configuration-out refits once per configuration (the shipped 62 take about half a
minute; the time grows as the square of the count)."""


def fit_pool(runs: Iterable[Run], inputs: RunInputs) -> tuple[Run, ...]:
    """The runs a fit may use: newest release of each configuration, dense, not NVFP4, measured
    (feasibility is checked when they are scored)."""
    dense, _ = split_dense(runs, inputs)
    newest, _ = newest_per_configuration(dense)
    return tuple(run for run in newest if run.step_time_s is not None and run.precision is not Precision.nvfp4)


def _with_step(inputs: RunInputs, runs: Iterable[Run], step: WholeStep) -> RunInputs:
    names = {run.system for run in runs}
    systems = {}
    for run in runs:
        if run.system in systems:
            continue
        try:
            systems[run.system] = inputs.system(run).model_copy(update={"step": step})
        except InputError:
            pass
    return inputs.with_systems({name: systems[name] for name in names if name in systems})


def scores_with_step(runs: Iterable[Run], inputs: RunInputs, step: WholeStep) -> tuple[RunScore, ...]:
    """Every run scored with `step` as the whole-step terms of every system it uses."""
    runs = tuple(runs)
    return score_runs(runs, _with_step(inputs, runs, step))


def _step(values: dict[str, float]) -> WholeStep:
    return WholeStep(**values)


def _residuals(scores: tuple[RunScore, ...], target: str) -> np.ndarray:
    error = (lambda s: s.time_error) if target == "time" else (lambda s: s.memory_error)
    values = [error(s) if s.status == "scored" else None for s in scores]
    return np.array([np.nan if v is None else np.log1p(v) for v in values])


def _weights(residual: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + (residual / ROBUST_SCALE) ** 2)


def _solve(residual: np.ndarray, jacobian: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The parameter change minimising the Cauchy loss of residual + jacobian · change over
    `rows` (IRLS on the linear model)."""
    r, jac = residual[rows], jacobian[rows]
    change = np.zeros(jac.shape[1])
    for _ in range(50):
        w = _weights(r + jac @ change)
        normal = jac.T @ (w[:, None] * jac) + 1e-12 * np.eye(jac.shape[1])
        new = np.linalg.solve(normal, -jac.T @ (w * r))
        if np.allclose(new, change, rtol=1e-9, atol=1e-12):
            return new
        change = new
    return change


@dataclass(frozen=True)
class _Linear:
    """One target's residuals (log ratios) and their Jacobian in the free terms, at one point."""

    params: tuple[StepParameter, ...]
    residual: np.ndarray
    jacobian: np.ndarray
    rows: np.ndarray


def _linearised(pool: tuple[Run, ...], inputs: RunInputs, values: dict, params: list[StepParameter],
                target: str, base: tuple[RunScore, ...]) -> _Linear | None:
    r = _residuals(base, target)
    rows = np.isfinite(r)
    if not rows.any() or not params:
        return None
    jac = np.empty((len(pool), len(params)))
    for j, p in enumerate(params):
        # a one-sided difference, backwards at the upper bound
        step = -p.probe if values[p.name] + p.probe > p.ceiling else p.probe
        probe = dict(values, **{p.name: values[p.name] + step})
        shifted = _residuals(scores_with_step(pool, inputs, _step(probe)), target)
        jac[:, j] = (shifted - r) / step
    return _Linear(tuple(params), r, jac, rows & np.isfinite(jac).all(axis=1))


def _fit_values(pool: tuple[Run, ...], inputs: RunInputs, iterations: int,
                held: dict[str, float]) -> tuple[dict, tuple[_Linear, ...]]:
    """The fitted fields (the `held` ones at their given values, the others from their starting
    values, `StepParameter.start`) by iteratively reweighted Gauss–Newton, each iteration scoring
    the pool exactly at the current values and one probe per free field; and each target's
    linearisation at the last iteration (the final values where the fit converged)."""
    values = {p.name: held.get(p.name, p.start) for p in STEP_PARAMETERS}
    linear: tuple[_Linear, ...] = ()
    for _ in range(iterations):
        base = scores_with_step(pool, inputs, _step(values))
        moved, linear = False, ()
        for target in ("time", "memory"):
            params = [p for p in STEP_PARAMETERS if p.target == target and p.name not in held]
            lin = _linearised(pool, inputs, values, params, target, base)
            if lin is None:
                continue
            linear += (lin,)
            change = _solve(np.nan_to_num(lin.residual), np.nan_to_num(lin.jacobian), lin.rows)
            for p, delta in zip(params, change):
                new = min(rounded(max(values[p.name] + delta, 0.0), p.floor), p.ceiling)
                moved |= new != values[p.name]
                values[p.name] = new
        if not moved:
            break
    return values, linear


def _standard_errors(lin: _Linear) -> dict[str, float]:
    """Each free term's standard error from the fit's Jacobian: s² (Jᵀ W J)⁻¹ with the Cauchy
    weights W and s² = Σ w r² / (n − p); infinite where the runs are no more than the terms or
    a term has no effect on them (a singular Jᵀ W J)."""
    r, jac = lin.residual[lin.rows], lin.jacobian[lin.rows]
    n, k = jac.shape
    if n <= k:
        return {p.name: float("inf") for p in lin.params}
    w = _weights(r)
    normal = jac.T @ (w[:, None] * jac)
    if np.linalg.matrix_rank(normal, tol=1e-10 * max(1.0, float(np.abs(normal).max()))) < k:
        return {p.name: float("inf") for p in lin.params}
    variance = float(w @ r ** 2) / (n - k) * np.diag(np.linalg.inv(normal))
    return {p.name: float(np.sqrt(max(v, 0.0))) for p, v in zip(lin.params, variance)}


def relative_error(param: StepParameter, value: float, standard_error: float) -> float:
    """A term's standard error against its value (or its resolution, for a value near 0)."""
    return standard_error / max(abs(value), param.resolution)


@dataclass(frozen=True)
class FittedStep:
    """A fit: the terms (file units, rounded), which were fitted (with their standard errors)
    and which held at the replaced file's values, the runs it used, and what they say of it."""

    step: WholeStep
    pool: tuple[Run, ...]
    """the runs the fit used (`fit_pool`, less the runs the model cannot express)"""
    before: tuple[RunScore, ...]
    """every pool run scored with the replaced terms (`prior`)"""
    after: tuple[RunScore, ...]
    """the same runs scored with the fitted terms"""
    standard_errors: dict[str, float]
    """each fitted term's standard error, file units"""
    held: tuple[str, ...] = ()
    """the terms held at the replaced file's values: the runs do not determine them"""
    unusable: tuple[str, ...] = ()
    """runs left out: not scored, or predicted more than `USABLE_RATIO` off with the replaced terms"""

    @property
    def fields(self) -> dict:
        return {p.name: getattr(self.step, p.name) for p in STEP_PARAMETERS}

    def counts(self) -> dict[str, int]:
        """How many runs each target was fitted on (scored, with that measurement)."""
        return {"time": sum(s.status == "scored" for s in self.after),
                "memory": sum(s.status == "scored" and s.memory_error is not None for s in self.after)}


def current_step(runs: Iterable[Run], inputs: RunInputs) -> WholeStep:
    """The whole-step terms of the first system the runs use that states them (none: all 0)."""
    for run in runs:
        try:
            step = inputs.system(run).step
        except InputError:
            continue
        if step is not None:
            return step
    return WholeStep(kernel_gap_us=0.0)


def _usable(pool: tuple[Run, ...], inputs: RunInputs, prior: WholeStep) -> tuple[tuple[Run, ...], tuple[str, ...]]:
    """The pool runs the model scores within `USABLE_RATIO` of their measured step, and the others' names."""
    kept, dropped = [], []
    for score in scores_with_step(pool, inputs, prior):
        error = score.time_error if score.status == "scored" else None
        ratio = None if error is None else error + 1.0
        ok = ratio is not None and np.isfinite(ratio) and 1 / USABLE_RATIO <= ratio <= USABLE_RATIO
        (kept if ok else dropped).append(score.run if ok else score.run.name)
    return tuple(kept), tuple(dropped)


def _determined(pool: tuple[Run, ...], inputs: RunInputs, prior: WholeStep,
                iterations: int) -> tuple[dict, dict[str, float], tuple[str, ...]]:
    """The terms the pool determines, fitted with their standard errors; the others held at
    `prior`'s values (one at a time, the least determined first, refitting after each)."""
    held: dict[str, float] = {}
    while True:
        values, linear = _fit_values(pool, inputs, iterations, held)
        errors = {name: se for lin in linear for name, se in _standard_errors(lin).items()}
        free = [p for p in STEP_PARAMETERS if p.name not in held]
        relative = {p.name: relative_error(p, values[p.name], errors.get(p.name, float("inf"))) for p in free}
        worst = max(relative, key=relative.get, default=None)
        if worst is None or relative[worst] <= RELATIVE_SE_LIMIT:
            return values, {name: errors[name] for name in relative}, tuple(held)
        held[worst] = getattr(prior, worst)


def fit_step(runs: Iterable[Run], inputs: RunInputs | None = None, iterations: int = 12,
             prior: WholeStep | None = None) -> FittedStep:
    """The whole-step terms fitted to `runs` (their fit pool), shared by every system they use:
    those the runs determine, the others held at `prior`'s (the replaced file's) values."""
    inputs = inputs or RunInputs()
    pool = fit_pool(runs, inputs)
    if not pool:
        raise InputError("no run to fit: need measured runs of dense models (newest release of each "
                         "configuration, not NVFP4)")
    if len(pool) > MAX_RUNS:
        raise InputError(f"{len(pool)} runs to fit: at most {MAX_RUNS} (the fit and its leave-one-out "
                         "checks grow as the square of the count); fit a sample of them")
    prior = prior or current_step(pool, inputs)
    pool, unusable = _usable(pool, inputs, prior)
    if not pool:
        raise InputError(f"no usable run to fit: each of the {len(unusable)} runs is infeasible in the model or "
                         f"measured more than {USABLE_RATIO:g}x off its prediction ({', '.join(unusable[:3])}"
                         f"{', ...' if len(unusable) > 3 else ''})")
    values, errors, held = _determined(pool, inputs, prior, iterations)
    step = _step(values)
    return FittedStep(step, pool, scores_with_step(pool, inputs, prior), scores_with_step(pool, inputs, step),
                      errors, held, unusable)


# ---------------------------------------------------------------- out of sample

def blackwell_or_hopper(run: Run) -> str:
    """A run's system generation: Blackwell (B200, GB200, B300, GB300) or Hopper (H100, H200)."""
    return "blackwell" if run.system.startswith(("b", "gb")) else "hopper"


FOLDS: dict[str, Callable[[Run], str]] = {
    "configuration": lambda run: run.configuration_key,
    "system": lambda run: run.system,
    "generation": blackwell_or_hopper,
}
"""How `held_out` may group runs into folds: one configuration, one system, one generation."""


@dataclass(frozen=True)
class HeldOut:
    """One fold: the group left out, the terms refitted without it, and its runs scored with them."""

    group: str
    step: WholeStep
    scores: tuple[RunScore, ...]


def held_out(fit: FittedStep, inputs: RunInputs, group_of: Callable[[Run], str],
             groups: Iterable[str] | None = None, iterations: int = 12,
             prior: WholeStep | None = None) -> tuple[HeldOut, ...]:
    """For each group (all of them, or `groups`), the terms fitted anew on the fit's other runs
    (from their starting values, as `fit_step` does, holding what those runs do not determine at
    `prior`'s values: nothing of the left-out runs reaches the fold) and the group's runs scored
    with them."""
    prior = prior or current_step(fit.pool, inputs)
    labels = [group_of(run) for run in fit.pool]
    wanted = list(dict.fromkeys(labels)) if groups is None else list(groups)
    folds = []
    for group in wanted:
        rest = tuple(run for run, label in zip(fit.pool, labels) if label != group)
        out = tuple(run for run, label in zip(fit.pool, labels) if label == group)
        if not out or not rest:
            continue
        step = _step(_determined(rest, inputs, prior, iterations)[0])
        folds.append(HeldOut(group, step, scores_with_step(out, inputs, step)))
    return tuple(folds)


def held_out_scores(folds: Iterable[HeldOut]) -> tuple[RunScore, ...]:
    """Every fold's runs, each scored by the fit that did not see it."""
    return tuple(score for fold in folds for score in fold.scores)

