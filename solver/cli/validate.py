"""mapsat validate: the cost model against measurements — the Megatron-LM runs on Selene, or
a file of measured training runs (--runs)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from costmodel.calibration.step_report import StepCheck, step_check
from costmodel.errors import InputError
from costmodel.inputs.load import load_system
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_report import RunsReport, gap_tags, validate_runs
from costmodel.measured.run_scoring import ErrorSummary, RunInputs
from costmodel.measured.validation import validate_selene
from solver.cli.options import user_errors, wide_console
from solver.report.documents import dumps
from solver.report.tables import console, counted

DEFAULT_SYSTEM = Path(__file__).resolve().parents[2] / "problems" / "systems" / "a100-80g-selene.yaml"


def _run_inputs(systems: tuple[str, ...]) -> RunInputs:
    """--system values with --runs: NAME=FILE replaces the system the runs call NAME; a bare
    FILE replaces every run's system."""
    by_name, for_all = {}, None
    for value in systems:
        name, sep, path = value.partition("=")
        if not sep:
            if for_all is not None or len(systems) > 1:
                raise InputError(f"--system {value}: with several --system, write each as NAME=FILE "
                                 f"(the system name the runs use, e.g. h100-80g-nvl8=my-h100.yaml)")
            for_all = load_system(value)
            continue
        if not name or not path:
            raise InputError(f"--system {value}: expected NAME=FILE, e.g. h100-80g-nvl8=my-h100.yaml")
        if name in by_name:
            raise InputError(f"--system {value}: system {name!r} is given twice")
        by_name[name] = load_system(path)
    return RunInputs(systems=by_name, system=for_all)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.1f} %"


def _summary_lines(title: str, summaries: tuple[ErrorSummary, ...]) -> list[str]:
    return [f"{title} {s.group}: {counted(s.count, 'run')}, median |error| {100 * s.median_abs_error:.1f} %, "
            f"mean signed {100 * s.mean_signed_error:+.1f} %, max |error| {100 * s.max_abs_error:.1f} %"
            for s in summaries]


def _print_runs_report(report: RunsReport) -> None:
    out = wide_console()
    for title, scores in (("newest release of each configuration", report.newest),
                          ("older releases of the same configurations", report.older)):
        if not scores:
            continue
        table = Table(title=f"{report.source}: {title}")
        for column in ("run", "release", "system", "precision", "measured (s)", "predicted (s)", "error", "status",
                       "not expressible"):
            table.add_column(column, justify="right" if column in ("measured (s)", "predicted (s)", "error") else "left")
        for s in scores:
            measured = "—" if s.run.step_time_s is None else f"{s.run.step_time_s:.4g}"
            predicted = "—" if s.predicted_step_s is None else f"{s.predicted_step_s:.4g}"
            table.add_row(s.run.name, s.run.software or "", s.system_name, s.run.precision.value, measured, predicted,
                          _percent(s.time_error), s.status, gap_tags(s))
        out.print(table)
    for s in report.unscored:
        out.print(f"{s.status} {s.run.name}: {'; '.join(s.reasons) or 'no measured step time'}")
    lines = (_summary_lines("step time,", report.overall) + _summary_lines("step time, system", report.by_system)
             + _summary_lines("step time, precision", report.by_precision)
             + _summary_lines("peak memory,", report.memory)
             + _summary_lines("older releases, step time,", report.older_overall))
    out.print("summary (newest release of each configuration; NVFP4 only in its precision's line):")
    for line in lines or ["no run was scored"]:
        out.print(f"  {line}")


def _print_selene(system_path: str) -> None:
    report = validate_selene(load_system(system_path))
    out = console()
    for title, rows, unit in (("iteration time, Table 5", report.iteration_time, "s"),
                              ("memory of the first stage, Figure 1", report.memory, "GiB"),
                              ("activation memory relative to none, Figure 7", report.activation_percent, "%")):
        table = Table(title=title)
        for column in ("model", "quantity", f"measured ({unit})", f"modelled ({unit})", "error"):
            table.add_column(column, justify="left" if column in ("model", "quantity") else "right")
        for r in rows:
            table.add_row(r.model, r.quantity, f"{r.measured:.4g}", f"{r.modelled:.4g}", f"{100 * r.error:+.2f} %")
        out.print(table)
    mean, worst = report.time_mean_max
    mem_mean, mem_worst = report.memory_mean_max
    out.print(f"iteration time: mean |error| {100 * mean:.2f} %, max {100 * worst:.2f} % "
              f"(Calculon published 3.4 % / 7.25 %)")
    out.print(f"memory: mean |error| {100 * mem_mean:.2f} %, max {100 * mem_worst:.2f} %")


def _check(files: dict, inputs: RunInputs) -> StepCheck | str:
    """The whole-step terms refitted on the runs and scored out of sample; why not, when no
    run can be fitted (no usable measured dense run, or too many)."""
    try:
        return step_check(files, inputs)
    except InputError as err:
        return str(err)


def _print_check(check: StepCheck | str) -> None:
    out = wide_console()
    if isinstance(check, str):
        out.print(f"out of sample: {check}")
        return
    fit = check.fit
    fitted = ", ".join(f"{name} {value:g} ± {fit.standard_errors[name]:.2g}" for name, value in fit.fields.items()
                       if name not in fit.held)
    held = ", ".join(f"{name} {fit.fields[name]:g}" for name in fit.held)
    out.print(f"whole-step terms refitted on these runs: {fitted or 'none'}; held at the system files' values "
              f"(the runs do not determine them): {held or 'none'}")
    for name in check.files:
        for scheme, title in (("in_sample", "in sample"), ("leave_one_configuration_out", "leave one configuration out"),
                              ("system_left_out", "its system left out"),
                              ("generation_left_out", "its generation left out")):
            for line in (_summary_lines(f"{name}, {title}, step time,", check.summary(scheme, name))
                         + _summary_lines(f"{name}, {title}, peak memory,", check.summary(scheme, name, memory=True))):
                out.print(f"  {line}")


@click.command("validate")
@click.option("--runs", "runs_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A file of measured training runs (this project's run file, Megatron-Bridge's published rows, "
                   "or single-GPU iterations; docs/training-runs.md) to score instead of Selene (repeatable: the "
                   "out-of-sample check refits the whole-step terms on every file's runs).")
@click.option("--system", "systems", multiple=True, metavar="FILE | NAME=FILE",
              help="System file. Without --runs: the Selene file (default problems/systems/a100-80g-selene.yaml). "
                   "With --runs: NAME=FILE scores the runs on system NAME with FILE (repeatable); a bare FILE, "
                   "every run.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--no-held-out", "no_held_out", is_flag=True,
              help="With --runs: skip the out-of-sample check (refitting the whole-step terms per fold).")
@user_errors
def command(runs_paths, systems, as_json, no_held_out):
    """Compare the model with measurements: Megatron-LM on Selene, or a file of training runs.

    Without --runs: Megatron-LM measured on Selene (Korthikanti et al. 2022), iteration time
    (Table 5), first-stage memory (Figure 1), activation memory (Figure 7). With --runs: each
    run's predicted step time (and peak memory) against the measured one, the newest release
    of each configuration summarised by system and precision, and every setting the model
    cannot yet express named; then the whole-step terms refitted on the runs and every run
    scored in sample, leaving its configuration out, its system out and its generation out
    (docs/training-runs.md).

    \b
    Example:
      mapsat validate
      mapsat validate --runs problems/runs/megatron-bridge-pretraining.json
      mapsat validate --runs problems/runs/h200-single-gpu-pytorch.json --json
      mapsat validate --runs problems/runs/megatron-bridge-pretraining.json \\
        --runs problems/runs/h200-single-gpu-pytorch.json --json
    """
    if not runs_paths:
        if len(systems) > 1:
            raise InputError(f"--system is given {len(systems)} times: without --runs give one system file")
        system_path = systems[0] if systems else str(DEFAULT_SYSTEM)
        if as_json:
            click.echo(dumps(validate_selene(load_system(system_path)).to_dict()))
        else:
            _print_selene(system_path)
        return
    inputs = _run_inputs(systems)
    files = {str(path): read_runs(path) for path in runs_paths}
    reports = [validate_runs(runs, inputs, source=path) for path, runs in files.items()]
    check = None if no_held_out else _check({Path(path).name: runs for path, runs in files.items()}, inputs)
    if as_json:
        held_out = None if no_held_out else (check.to_dict() if not isinstance(check, str) else {"skipped": check})
        if len(reports) == 1:
            click.echo(dumps({**reports[0].to_dict(), "whole_step_terms": held_out}))
        else:
            click.echo(dumps({"reports": [r.to_dict() for r in reports], "whole_step_terms": held_out}))
        return
    for report in reports:
        _print_runs_report(report)
    if not no_held_out:
        _print_check(check)
