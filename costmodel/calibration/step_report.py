"""The whole-step terms in sample and out of sample, per run file: what
`benchmarks/bench_training_runs.py` prints and `mapsat validate --runs ... --json` reports.

    check = step_check({"bridge.json": bridge_runs, "h200.json": h200_runs}, inputs)
    check.to_dict()

One fit on the runs of every file (costmodel.calibration.step_fit.fit_step), then the same
runs scored four ways: in sample (the fit saw them), leaving out their configuration (LOCO; a
single-GPU iteration is its own configuration), leaving out their system, and leaving out
their generation (Hopper: H100, H200; Blackwell: B200, GB200, B300, GB300). Each figure is
given per file, for step time and, where measured, peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from costmodel.calibration.step_fit import (FOLDS, STEP_PARAMETERS, FittedStep, HeldOut, fit_step, held_out,
                                           held_out_scores)
from costmodel.measured.run_scoring import ErrorSummary, RunInputs, RunScore, summarize
from costmodel.measured.runs import Run

__all__ = ["SCHEMES", "StepCheck", "step_check"]

SCHEMES = ("in_sample", "leave_one_configuration_out", "system_left_out", "generation_left_out")
"""The four ways a run is scored, in the order reports list them."""


@dataclass(frozen=True)
class StepCheck:
    """A fit and its runs scored in and out of sample."""

    fit: FittedStep
    files: dict[str, tuple[Run, ...]]
    scores: dict[str, tuple[RunScore, ...]]           # scheme → every pool run, scored that way
    folds: dict[str, tuple[HeldOut, ...]]             # scheme → its folds (not in_sample)

    def of_file(self, scheme: str, name: str) -> tuple[RunScore, ...]:
        ids = {id(run) for run in self.files[name]}
        return tuple(s for s in self.scores[scheme] if id(s.run) in ids)

    def summary(self, scheme: str, name: str, group_of: Callable[[RunScore], str] | None = None,
                memory: bool = False) -> tuple[ErrorSummary, ...]:
        error = (lambda s: s.memory_error) if memory else (lambda s: s.time_error)
        return summarize(self.of_file(scheme, name), group_of, error)

    def to_dict(self) -> dict:
        def rows(items: Iterable[ErrorSummary]) -> list[dict]:
            return [item.to_dict() for item in items]

        by_system = lambda s: s.system_name  # noqa: E731
        out = {"fitted": self.fit.fields, "standard_errors": self.fit.standard_errors, "held": list(self.fit.held),
               "not_used": list(self.fit.unusable), "fitted_on": self.fit.counts(), "schemes": {}}
        for scheme in SCHEMES:
            per_file = {}
            for name in self.files:
                per_file[name] = {"step_time": rows(self.summary(scheme, name)),
                                  "step_time_by_system": rows(self.summary(scheme, name, by_system)),
                                  "peak_memory": rows(self.summary(scheme, name, memory=True))}
            entry = {"files": per_file}
            if scheme in self.folds:
                entry["folds"] = [{"left_out": f.group,
                                   "fitted": {p.name: getattr(f.step, p.name) for p in STEP_PARAMETERS}}
                                  for f in self.folds[scheme]]
            out["schemes"][scheme] = entry
        out["runs"] = [{"name": s.run.name, "system": s.system_name,
                        **{scheme: {"time_error": score.time_error, "memory_error": score.memory_error}
                           for scheme in SCHEMES for score in self.scores[scheme] if score.run is s.run}}
                       for s in self.scores["in_sample"]]
        return out


def step_check(files: dict[str, Iterable[Run]], inputs: RunInputs | None = None) -> StepCheck:
    """Fit the whole-step terms on the runs of every file and score them in and out of sample."""
    inputs = inputs or RunInputs()
    files = {name: tuple(runs) for name, runs in files.items()}
    fit = fit_step([run for runs in files.values() for run in runs], inputs)
    pool_ids = {id(run) for run in fit.pool}
    files = {name: tuple(run for run in runs if id(run) in pool_ids) for name, runs in files.items()}
    folds = {"leave_one_configuration_out": held_out(fit, inputs, FOLDS["configuration"]),
             "system_left_out": held_out(fit, inputs, FOLDS["system"]),
             "generation_left_out": held_out(fit, inputs, FOLDS["generation"])}
    scores = {"in_sample": fit.after, **{scheme: held_out_scores(f) for scheme, f in folds.items()}}
    return StepCheck(fit, files, scores, folds)
