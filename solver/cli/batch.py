"""`mapsat batch`: solve every problem of a batch file, resumably, into DIR/results.jsonl."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from solver.study.batch import load_batch
from solver.study.runner import Reporter, check_dask_address, run_batch
import costmodel.inputs.limits as limits
from costmodel.inputs.advice import model_warnings
from solver.cli.options import BoundedFloat, BoundedInt, model_warnings_on_stderr, user_errors, warn
from solver.study.store import RESULTS_CSV, RESULTS_JSONL
from solver.report.tables import throughput_lead


class ProgressReporter(Reporter):
    """A rich progress bar on stderr and one line per finished problem."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("[bold]batch"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self.console, transient=False, auto_refresh=False)
        self.task = None

    def start(self, total: int, skipped: int, pending: int) -> None:
        if skipped:
            self.console.print(f"{skipped} of {total} problems already done (resuming); {pending} to solve")
        else:
            self.console.print(f"{total} problems to solve")
        self.progress.start()
        self.task = self.progress.add_task("batch", total=total, completed=skipped)
        self.progress.refresh()

    def finished(self, record: dict) -> None:
        status = record.get("status")
        best = record.get("best") or {}
        detail = (throughput_lead(best.get("throughput"), best["mfu"]) if best.get("mfu") is not None
                  else (record.get("error") or ""))
        seconds = record.get("seconds")
        took = f" ({seconds:.1f} s)" if isinstance(seconds, (int, float)) else ""
        self.progress.console.print(f"{status:>10}  {record['id']}  {detail}{took}", markup=False, highlight=False)
        self.progress.advance(self.task)
        self.progress.refresh()

    def tick(self) -> None:
        self.progress.refresh()

    def stop(self) -> None:
        self.progress.stop()


@click.command(name="batch")
@click.argument("batch_file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help=f"Directory for {RESULTS_JSONL} and {RESULTS_CSV} (created; a rerun resumes).")
@click.option("--jobs", type=BoundedInt(limits.JOBS), default=None,
              help="Problems solved at once, each in its own process (default: cores / solver workers).")
@click.option("--time-limit", "time_limit_s", type=BoundedFloat(limits.TIME_LIMIT_S, low_open=0), default=None,
              help="Solver time limit per problem, seconds (replaces the file's time_limit_s).")
@click.option("--solver-workers", type=BoundedInt(limits.WORKERS), default=1, show_default=True,
              help="CP-SAT workers inside each problem.")
@click.option("--retry-errors", is_flag=True, help="Solve again the problems whose earlier result is an error.")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run on a running Dask distributed scheduler (tcp://host:8786) instead of local processes; "
                   "needs the dask extra.")
@click.option("--quiet", is_flag=True, help="No progress bar or per-problem lines.")
@user_errors
def command(batch_file: str, out_dir: str, jobs: int | None, time_limit_s: float | None, solver_workers: int,
            retry_errors: bool, dask_address: str | None, quiet: bool) -> None:
    """Solve every problem of a batch file (models × systems × GPU counts × overrides).

    Each result is appended to DIR/results.jsonl as soon as it is solved (one JSON object
    per line, fsync'ed), and DIR/results.csv is written at the end. Rerunning the same
    command resumes: finished problems are skipped, a result half-written by a killed run
    is redone. A failing problem is recorded with status "error" and never stops the
    batch. Exits 1 if any problem of the batch has status error, 130 when interrupted.
    The file format: docs/batch-files.md.

    \b
    Example (the 256- vs 254-block pair of the paper's Figure 2):
      mapsat batch problems/paper/fig2-mappability.yaml --out runs/fig2
      mapsat plot runs/fig2
    """
    if dask_address is not None:
        dask_address = check_dask_address(dask_address)
    with model_warnings_on_stderr():
        problems = load_batch(batch_file, time_limit_s=time_limit_s)
    models = {problem.model.name: problem.model for problem in problems}
    warn(*[line for name, model in models.items() for line in model_warnings(model, f"{batch_file}: model {name!r}")])
    reporter = Reporter() if quiet else ProgressReporter()
    summary = run_batch(problems, out_dir, jobs=jobs, dask_address=dask_address, solver_workers=solver_workers,
                        retry_errors=retry_errors, reporter=reporter)
    err = Console(stderr=True, highlight=False)
    for warning in summary.warnings:
        err.print(f"warning: {warning}", markup=False)
    counts = ", ".join(f"{n} {status}" for status, n in summary.by_status.items()) or "nothing"
    done = sum(summary.by_status.values())
    click.echo(f"{done} of {summary.total} problems done ({counts}); solved {summary.solved} in this run, "
               f"{summary.skipped} from earlier runs, {summary.seconds:.1f} s. Results: {out_dir}/{RESULTS_JSONL}, "
               f"{out_dir}/{RESULTS_CSV}")
    if summary.interrupted:
        click.echo(f"interrupted: rerun the same command to solve the remaining {summary.total - done}", err=True)
        sys.exit(130)
    if summary.errors:
        click.echo(f"error: {summary.errors} problem(s) failed (status error in {RESULTS_JSONL}); "
                   f"rerun with --retry-errors to try them again", err=True)
        sys.exit(1)
