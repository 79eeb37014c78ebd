"""The error bands a whole-step fit leaves (costmodel.measured.error_bands): each dense run's
error with its configuration left out of the fit, and each run the fit does not take (mixture-
of-experts and NVFP4 runs, the newest release of each configuration: nothing is fitted on
them), by class."""

from __future__ import annotations

from typing import Iterable

from costmodel.calibration.step_fit import FittedStep, HeldOut, held_out_scores
from costmodel.measured.error_bands import ClassedError, classed_errors
from costmodel.measured.run_scoring import RunInputs, newest_per_configuration, score_runs
from costmodel.measured.runs import Run


def out_of_sample_errors(run_files: dict[str, Iterable[Run]], fit: FittedStep, loco: Iterable[HeldOut],
                         inputs: RunInputs) -> list[ClassedError]:
    """The classed errors of the fit's runs left out by configuration (`loco`, its folds) and of
    the runs of `run_files` it does not take, scored on the system files as they are."""
    errors = classed_errors(held_out_scores(loco), inputs)
    pooled = {run.configuration_key for run in fit.pool}
    others = [run for file_runs in run_files.values() for run in file_runs if run.configuration_key not in pooled]
    newest, _ = newest_per_configuration(others)
    return errors + classed_errors(score_runs(newest, inputs), inputs)
