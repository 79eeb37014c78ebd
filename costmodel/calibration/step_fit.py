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
from costmodel.terms.step_terms import WholeStep

__all__ = ["FOLDS", "FittedStep", "HeldOut", "STEP_PARAMETERS", "StepParameter", "blackwell_or_hopper", "fit_pool",
           "fit_step", "held_out", "held_out_scores", "scores_with_step"]

ROBUST_SCALE = 0.10
"""Cauchy scale of the log-ratio residuals: a run this far off weighs half as much as a run on
the mark, one 3.4× off (log 1.22) 1/150 as much."""


@dataclass(frozen=True)
class StepParameter:
    """One fitted field of `step:`: what it is fitted to, the step of its sensitivity, and the
    value below which it is written as 0."""

    name: str
    target: str            # "time" or "memory"
    probe: float           # finite-difference step, file units
    floor: float
    ceiling: float = float("inf")
    start: float = 0.0
    """where the fit starts: the term's default, or (the power window, whose effect has no slope
    at 0: no GEMM of a step is smaller than a window of 0) a value where it has one"""


STEP_PARAMETERS = (StepParameter("kernel_gap_us", "time", 1.0, 0.01),
                   StepParameter("power_window_ms", "time", 0.5, 0.01, start=1.0),
                   StepParameter("allocator_fragmentation", "memory", 0.01, 1e-4))


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
class FittedStep:
    """A fit: the terms (file units, rounded), the runs it used, and what they say of it."""

    step: WholeStep
    pool: tuple[Run, ...]
    """the runs the fit used (`fit_pool`)"""
    before: tuple[RunScore, ...]
    """every pool run scored with the system files as given"""
    after: tuple[RunScore, ...]
    """the same runs scored with the fitted terms"""

    @property
    def fields(self) -> dict:
        return {p.name: getattr(self.step, p.name) for p in STEP_PARAMETERS}

    def counts(self) -> dict[str, int]:
        """How many runs each target was fitted on (scored, with that measurement)."""
        return {"time": sum(s.status == "scored" for s in self.after),
                "memory": sum(s.status == "scored" and s.memory_error is not None for s in self.after)}


def _fit_values(pool: tuple[Run, ...], inputs: RunInputs, iterations: int) -> dict:
    """The fitted fields, from each term's starting value (`StepParameter.start`) by iteratively reweighted
    Gauss–Newton, each iteration scoring the pool exactly at the current values and one probe
    per field."""
    values = {p.name: p.start for p in STEP_PARAMETERS}
    for _ in range(iterations):
        base = scores_with_step(pool, inputs, _step(values))
        moved = False
        for target in ("time", "memory"):
            params = [p for p in STEP_PARAMETERS if p.target == target]
            r = _residuals(base, target)
            rows = np.isfinite(r)
            if not rows.any():
                continue
            jac = np.empty((len(pool), len(params)))
            for j, p in enumerate(params):
                # a one-sided difference, backwards at the upper bound
                step = -p.probe if values[p.name] + p.probe > p.ceiling else p.probe
                probe = dict(values, **{p.name: values[p.name] + step})
                shifted = _residuals(scores_with_step(pool, inputs, _step(probe)), target)
                jac[:, j] = (shifted - r) / step
            rows &= np.isfinite(jac).all(axis=1)
            change = _solve(np.nan_to_num(r), np.nan_to_num(jac), rows)
            for p, delta in zip(params, change):
                new = min(rounded(max(values[p.name] + delta, 0.0), p.floor), p.ceiling)
                moved |= new != values[p.name]
                values[p.name] = new
        if not moved:
            break
    return values


def fit_step(runs: Iterable[Run], inputs: RunInputs | None = None, iterations: int = 12) -> FittedStep:
    """The whole-step terms fitted to `runs` (their fit pool), shared by every system they use."""
    inputs = inputs or RunInputs()
    pool = fit_pool(runs, inputs)
    if not pool:
        raise InputError("no run to fit: need measured runs of dense models (newest release of each "
                         "configuration, not NVFP4)")
    step = _step(_fit_values(pool, inputs, iterations))
    return FittedStep(step, pool, score_runs(pool, inputs), scores_with_step(pool, inputs, step))


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
             groups: Iterable[str] | None = None, iterations: int = 12) -> tuple[HeldOut, ...]:
    """For each group (all of them, or `groups`), the terms fitted anew on the fit's other runs
    (from their starting values, as `fit_step` does: nothing of the left-out runs reaches the fold) and
    the group's runs scored with them."""
    labels = [group_of(run) for run in fit.pool]
    wanted = list(dict.fromkeys(labels)) if groups is None else list(groups)
    folds = []
    for group in wanted:
        rest = tuple(run for run, label in zip(fit.pool, labels) if label != group)
        out = tuple(run for run, label in zip(fit.pool, labels) if label == group)
        if not out:
            continue
        step = _step(_fit_values(rest, inputs, iterations))
        folds.append(HeldOut(group, step, scores_with_step(out, inputs, step)))
    return tuple(folds)


def held_out_scores(folds: Iterable[HeldOut]) -> tuple[RunScore, ...]:
    """Every fold's runs, each scored by the fit that did not see it."""
    return tuple(score for fold in folds for score in fold.scores)

