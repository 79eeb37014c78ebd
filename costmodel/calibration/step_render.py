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
from costmodel.calibration.step_fit import (FOLDS, LOCO_TOLERANCE, STEP_PARAMETERS, FittedStep, HeldOut, fit_step,
                                           held_out, held_out_scores)
from costmodel.errors import InputError
from costmodel.inputs.load import parse
from costmodel.measured.run_scoring import RunInputs, RunScore
from costmodel.inputs.step import WholeStep

__all__ = ["RunsCalibration", "StepSummary", "calibrate_runs", "common_medians", "prior_step", "refusal", "render_step",
           "step_comment", "summary_of"]


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


def step_comment(fit: FittedStep, run_files: dict[str, Iterable], loco: Iterable[HeldOut],
                 forced: str | None = None) -> list[str]:
    """The comment lines above a written `step:` (they start as costmodel.calibration.render's
    generated comments do, so a later run drops them): what the fit used, and per run file its
    errors where fitted and left out (leave one configuration out)."""
    counts, loco_scores = fit.counts(), held_out_scores(loco)
    lines = [f"# Fitted by `mapsat calibrate --runs` to {', '.join(run_files)} (newest release of each "
             f"configuration, dense, not NVFP4): {counts['time']} step times, {counts['memory']} peaks; the same "
             "values in every system file."]
    if fit.held:
        lines.append(f"# Held out of the fit at the replaced file's values (the runs do not determine them): "
                     f"{', '.join(fit.held)}.")
    if forced:
        lines.append(f"# Written with --force although refused: {forced}")
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


WRITTEN_COMMENTS = ("# Fitted by `mapsat calibrate --runs`", "# |error| of time", "# Held out,",
                    "# Held out of the fit", "# Written with --force")
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


def common_medians(before: Iterable[RunScore], loco: Iterable[RunScore]) -> tuple[float, float, int]:
    """Median |error| of step time of the replaced terms and of leave-one-configuration-out, on
    the runs both scored."""
    held = {id(s.run): s.time_error for s in loco if s.status == "scored" and s.time_error is not None}
    pairs = [(abs(s.time_error), abs(held[id(s.run)])) for s in before
             if s.status == "scored" and s.time_error is not None and id(s.run) in held]
    if not pairs:
        return float("nan"), float("nan"), 0
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs), len(pairs)


def refusal(fit: FittedStep, loco: Iterable[HeldOut]) -> str | None:
    """Why the fit must not be written, or None: no term determined, a fitted term outside its
    physical range, or worse out of sample (leave one configuration out) than the replaced terms
    on the same runs by more than `LOCO_TOLERANCE`."""
    fitted = [p for p in STEP_PARAMETERS if p.name not in fit.held]
    if not fitted:
        return (f"refused: the {len(fit.pool)} usable runs determine none of the whole-step terms (each one's "
                "standard error is over half its value): nothing to write")
    for p in fitted:
        value = getattr(fit.step, p.name)
        if not p.low <= value <= p.high:
            return (f"refused: {p.name} {value:g} is outside its physical range {p.low:g}..{p.high:g} ({p.why})")
    before, after, count = common_medians(fit.before, held_out_scores(loco))
    if count == 0:
        return "refused: no run could be left out of the fit, so its error out of sample is unknown"
    if after > before + LOCO_TOLERANCE:
        return (f"refused: worse out of sample than the terms it replaces: median |error| of step time left one "
                f"configuration out {100 * after:.1f} % against {100 * before:.1f} % with the replaced terms "
                f"({count} runs)")
    return None


def prior_step(system_files: Iterable[Path | str]) -> WholeStep | None:
    """The whole-step terms the fit replaces: those of the first system file that states them."""
    for path in system_files:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise InputError(f"--system {path}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise InputError(f"--system {path}: not YAML ({str(err).splitlines()[0]})") from None
        if isinstance(doc, dict) and doc.get("step") is not None:
            return parse(WholeStep, doc["step"], f"{path}: step")
    return None


@dataclass(frozen=True)
class RunsCalibration:
    """`mapsat calibrate --runs`: the fit, its leave-one-configuration-out folds, why it must not
    be written (None if it may), and each system file's new text."""

    fit: FittedStep
    loco: tuple[HeldOut, ...]
    refused: str | None
    texts: dict[str, str]


def calibrate_runs(run_files: dict[str, Iterable], system_files: Iterable[Path | str],
                   inputs: RunInputs | None = None, force: bool = False) -> RunsCalibration:
    """Fit the whole-step terms to the runs of `run_files` (label → runs), holding what they do
    not determine at the system files' values, and render each of `system_files` with them (their
    new texts, empty when refused without `force`; nothing is written to disk here)."""
    inputs = inputs or RunInputs()
    system_files = [Path(path) for path in system_files]
    run_files = {name: tuple(runs) for name, runs in run_files.items()}
    prior = prior_step(system_files)
    fit = fit_step([run for runs in run_files.values() for run in runs], inputs, prior=prior)
    loco = held_out(fit, inputs, FOLDS["configuration"], prior=prior)
    refused = refusal(fit, loco)
    if refused and not force:
        return RunsCalibration(fit, loco, refused, {})
    comment = step_comment(fit, run_files, loco, forced=refused)
    texts = {}
    for path in system_files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InputError(f"--system {path}: {err.strerror}") from None
        texts[str(path)] = render_step(text, fit, comment, path)
    return RunsCalibration(fit, loco, refused, texts)
