"""mapsat explain: why the best mapping wins — the certified best for every value of every dimension."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from costmodel.space.dimensions import BY_NAME
from costmodel.errors import InputError, MapsatError
from costmodel.inputs.system import Datatype
from solver.cli.options import (batch_header, datatype_option, load_problem, problem_options,
                                progress_line, space_and_cap, space_options, system_label, user_errors,
                                wide_console)
from solver.report.figure import image_path
from solver.report.bands import band_json, band_line
from solver.report.documents import dumps
from solver.report.tables import counted, mapping_summary, mfu_text
from solver.search.explain import Explanation, explain
from solver.search.solve import SolverConfig
from solver.space.pins import pins_text


@click.command("explain")
@problem_options
@space_options
@datatype_option
@click.option("--dims", default=None, metavar="DIM[,DIM...]",
              help="Only these dimensions (default: every one that takes more than one value).")
@click.option("--time-limit", "time_limit_s", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Wall-clock limit per value, s; a value not proven in time is marked so.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="CP-SAT search workers.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw the per-value MFU of each dimension into this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of tables.")
@user_errors
def command(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size, num_gpus, max_batch,
            batch, batch_tokens, space_name, fix, kernels, datatype, dims, time_limit_s, workers, plot_path,
            as_json):
    """Explain the best mapping: the certified best time for each value of each dimension.

    For every dimension (tp, pp, microbatch, recompute, offloads, networks, ...) and every
    value it takes, the best mapping with that value fixed, each proven optimal as `solve`
    proves its answer; then what binds the winner and the runner-up (the fastest mapping
    any other value allows). One CP-SAT model answers every question.

    \b
    Example:
      mapsat explain --model problems/models/gpt-1t-256b.yaml \\
                     --system problems/systems/h100-80g-nvl8.yaml --gpus 4096 \\
                     --datatype float8 --offload-gib 1024 --offload-gbps 100
    """
    if plot_path is not None:              # before the search: a path it could not write is refused now
        plot_path = image_path(plot_path, "--plot")
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model, system,
                                     num_gpus)
    wanted = None
    if dims:
        wanted = tuple(d.strip() for d in dims.split(","))
        unknown = [d for d in wanted if d not in BY_NAME]
        if unknown:
            raise InputError(f"--dims: {', '.join(unknown)} is not a dimension (see `mapsat spaces`)")
    with progress_line() as say:
        result = explain(model, system, num_gpus, max_batch=max_batch, datatype=Datatype(datatype), space=space,
                         kernels=kernels,
                         config=SolverConfig(time_limit_s=time_limit_s, workers=workers), dimensions=wanted,
                         progress=say)
    label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
    title = (f"{model.name} on {num_gpus:,} x {label}, {datatype}, space {space_name}{pins_text(space)}, "
             f"{batch_header(space, max_batch, model)}, {kernels.label}")
    if plot_path is not None and result.winner is not None:
        from solver.report.explain_plot import plot_explanation

        plot_explanation(result, plot_path, title)
    winner = result.winner
    if as_json:
        band = None if winner is None else band_json(model, system, winner.mapping, winner.iteration_time_s)
        click.echo(dumps({**result.to_dict(), "error_band": band}))
    else:
        print_explanation(result, title,
                          None if winner is None else band_line(model, system, winner.mapping, winner.iteration_time_s))
    if result.interrupted:
        click.echo(f"interrupted (Ctrl-C): a partial explanation, the {len(result.rows)} values proven before it",
                   err=True)
        sys.exit(130)
    if result.winner is None:
        raise MapsatError("infeasible: no mapping of the space fits, or none exists (`mapsat solve` and `mapsat count` "
                          "say why)")


def print_explanation(result: Explanation, title: str, band: str | None = None) -> None:
    console = wide_console()
    winner = result.winner
    proven = ("partial: interrupted by Ctrl-C, the values proven before it" if result.interrupted else
              "every row certified" if result.certified else "NOT every row certified (time limit)")
    console.print(f"{title}: {proven}; {counted(result.blocks_scored, 'block')} scored exactly in {result.seconds:.1f} s")
    if winner is None:
        return
    console.print(f"  best: {winner.iteration_time_s:.4f} s, {mfu_text(winner)}: "
                  f"{mapping_summary(winner.mapping.model_dump(mode='json'))}")
    if band is not None:
        console.print(f"  measured would be (error band): {band}")
    for line in result.winner_binding:
        console.print(f"    binding: {line}")
    table = Table(title="Certified best per value (the winner's values marked *)", title_justify="left")
    for header in ("dimension", "value", "best s", "MFU", "vs best", "proven"):
        table.add_column(header, justify="right" if header not in ("dimension", "value") else "left")
    current = None
    for row in result.rows:
        mine = row.best is not None and row.best.mapping == winner.mapping
        name = row.dimension if row.dimension != current else ""
        current = row.dimension
        if row.best is None:
            table.add_row(name, row.label, "infeasible", "", "", "yes" if row.certified else "no")
            continue
        slower = row.best.iteration_time_s / winner.iteration_time_s - 1
        table.add_row(name, row.label + (" *" if mine else ""), f"{row.best.iteration_time_s:.4f}",
                      f"{row.best.mfu:.1%}", "—" if slower < 1e-9 else f"+{slower:.1%}",
                      "yes" if row.certified else "no")
    console.print(table)
    runner = result.runner_up
    if runner is not None:
        slower = runner.best.iteration_time_s / winner.iteration_time_s - 1
        console.print(f"runner-up: {runner.dimension} = {runner.label}, {slower:.2%} slower: "
                      f"{mapping_summary(runner.best.mapping.model_dump(mode='json'))}")
        for line in result.runner_up_binding:
            console.print(f"    binding: {line}")
