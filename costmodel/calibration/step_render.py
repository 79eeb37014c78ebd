"""Writing fitted whole-step terms into system files: `mapsat calibrate --runs`'s output.

A system file that takes the terms has, at the top level, the marker

    # mapsat-calibrate: step

and below it the block a previous run wrote (comment lines saying what the terms were fitted
to and their errors where fitted and held out, then `step:` with its fields). A run replaces
that block and copies every other line as it is; `mapsat calibrate --base` copies the block
through. The result is a pure function of the file's other lines and the fit, so a test can
regenerate the shipped files and compare them byte for byte. The fit and its out-of-sample
check are costmodel.calibration.step_fit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import yaml

from costmodel.calibration.render import MARKER, _number
from costmodel.calibration.step_fit import FOLDS, FittedStep, HeldOut, fit_step, held_out, held_out_scores
from costmodel.errors import InputError
from costmodel.inputs.load import parse
from costmodel.measured.run_scoring import RunInputs, RunScore
from costmodel.terms.step_terms import WholeStep

__all__ = ["RunsCalibration", "StepSummary", "calibrate_runs", "render_step", "step_comment", "summary_of"]


@dataclass(frozen=True)
class StepSummary:
    """Median |error| and mean signed error of step time (and of peak memory where measured)."""

    runs: int
    time_median: float
    time_mean: float
    memory_runs: int
    memory_median: float | None

    def text(self) -> str:
        memory = (f"; peak memory {self.memory_runs} runs, median {100 * self.memory_median:.1f} %"
                  if self.memory_runs else "")
        return (f"step time {self.runs} runs, median {100 * self.time_median:.1f} %, mean signed "
                f"{100 * self.time_mean:+.1f} %{memory}")


def summary_of(scores: Iterable[RunScore]) -> StepSummary:
    scores = [s for s in scores if s.status == "scored"]
    time = [s.time_error for s in scores if s.time_error is not None]
    memory = [s.memory_error for s in scores if s.memory_error is not None]
    return StepSummary(len(time), statistics.median(abs(e) for e in time) if time else float("nan"),
                       statistics.fmean(time) if time else float("nan"), len(memory),
                       statistics.median(abs(e) for e in memory) if memory else None)


def _of_file(scores: Iterable[RunScore], runs: Iterable) -> list[RunScore]:
    ids = {id(run) for run in runs}
    return [s for s in scores if id(s.run) in ids]


def step_comment(fit: FittedStep, run_files: dict[str, Iterable], loco: Iterable[HeldOut]) -> list[str]:
    """The comment lines above a written `step:` (they start as costmodel.calibration.render's
    generated comments do, so a later run drops them): what the fit used, and per run file its
    errors where fitted and left out (leave one configuration out)."""
    counts, loco_scores = fit.counts(), held_out_scores(loco)
    lines = [f"# Fitted by `mapsat calibrate --runs` to {', '.join(run_files)} (newest release of each "
             f"configuration, dense, not NVFP4): {counts['time']} step times, {counts['memory']} peaks; the same "
             "values in every system file."]
    for name, runs in run_files.items():
        runs = tuple(runs)
        lines.append(f"# |error| of time where fitted, {name}: {summary_of(_of_file(fit.after, runs)).text()}.")
    for name, runs in run_files.items():
        runs = tuple(runs)
        lines.append(f"# Held out, leave one configuration out (refitted without it), {name}: "
                     f"{summary_of(_of_file(loco_scores, runs)).text()}.")
    return lines


def _step_lines(fit: FittedStep) -> list[str]:
    fields = fit.fields
    return ["step:"] + [f"  {name}: {'true' if value is True else 'false' if value is False else _number(value)}"
                        for name, value in fields.items()]


WRITTEN_COMMENTS = ("# Fitted by `mapsat calibrate --runs`", "# |error| of time", "# Held out,")
"""How the comment lines a run writes above `step:` start: a later run drops them."""


def _after_written(lines: list[str], start: int) -> int:
    """The index of the first line after the block a previous run wrote below the marker: its
    comment lines, then `step:` and the lines indented below it."""
    index = start
    while index < len(lines) and lines[index].startswith(WRITTEN_COMMENTS):
        index += 1
    if index < len(lines) and lines[index].split(":")[0] == "step":
        index += 1
        while index < len(lines) and lines[index].startswith(" ") and lines[index].strip():
            index += 1
    return index


def render_step(text: str, fit: FittedStep, comment: list[str], path: Path | str = "system file") -> str:
    """`text` (a system file) with the block below its step marker replaced by the fit."""
    lines = text.splitlines()
    out, found, index = [], False, 0
    while index < len(lines):
        line = lines[index]
        index += 1
        match = MARKER.match(line)
        if not match or match["what"].split() != ["step"]:
            out.append(line)
            continue
        if match["indent"]:
            raise InputError(f"{path}: the step marker must be at the top level, not indented")
        found = True
        out.append(line)
        index = _after_written(lines, index)
        out += comment + _step_lines(fit)
    if not found:
        raise InputError(f"{path}: no '# mapsat-calibrate: step' marker; add one at the top level where the "
                         "whole-step terms go")
    result = "\n".join(out) + ("\n" if text.endswith("\n") else "")
    doc = yaml.safe_load(result)
    parse(WholeStep, doc.get("step") if isinstance(doc, dict) else None, f"{path}: step")
    return result


@dataclass(frozen=True)
class RunsCalibration:
    """`mapsat calibrate --runs`: the fit, its leave-one-configuration-out folds, and each system
    file's new text."""

    fit: FittedStep
    loco: tuple[HeldOut, ...]
    texts: dict[str, str]


def calibrate_runs(run_files: dict[str, Iterable], system_files: Iterable[Path | str],
                   inputs: RunInputs | None = None) -> RunsCalibration:
    """Fit the whole-step terms to the runs of `run_files` (label → runs) and write them into
    each of `system_files` (their new texts; nothing is written to disk here)."""
    inputs = inputs or RunInputs()
    run_files = {name: tuple(runs) for name, runs in run_files.items()}
    fit = fit_step([run for runs in run_files.values() for run in runs], inputs)
    loco = held_out(fit, inputs, FOLDS["configuration"])
    comment = step_comment(fit, run_files, loco)
    texts = {}
    for path in system_files:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InputError(f"--system {path}: {err.strerror}") from None
        texts[str(path)] = render_step(text, fit, comment, path)
    return RunsCalibration(fit, loco, texts)
