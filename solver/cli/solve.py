"""mapsat solve: the certified optimal mapping with CP-SAT."""

from __future__ import annotations

import dataclasses
import sys

import click

import costmodel.inputs.limits as limits
from costmodel.errors import MapsatError
from costmodel.terms.param_counts import ParameterCounts
from costmodel.inputs.system import Datatype
from solver.cli.emit import echo_emitted, emit_options
from solver.cli.errors import debugging
from solver.cli.options import (BoundedFloat, BoundedInt, batch_header, datatype_option, load_problem, problem_options,
                                progress_line, space_and_cap, space_options, system_label, user_errors,
                                wide_console)
from solver.report.documents import dumps
from solver.report.bands import band_json, band_line, indistinguishable, indistinguishable_line
from solver.report.tables import counted, evaluation_tables, top_table
from solver.search.nearest import smallest_fitting_count
from solver.search.solve import SolveResult, SolveStatus, SolverConfig, solve
from solver.space.pins import describe_pins, pins_text

NOTHING_YET = "interrupted (Ctrl-C) before any mapping was found"


@click.command("solve")
@problem_options
@space_options
@datatype_option
@click.option("--top-k", type=BoundedInt(limits.TOP_K), default=5, show_default=True,
              help="How many best mappings to list (all certified when the search completes).")
@click.option("--time-limit", "time_limit_s", type=BoundedFloat(limits.TIME_LIMIT_S, low_open=0), default=120.0,
              show_default=True, help="Wall-clock limit, s; on expiry the incumbent is returned with its gap.")
@click.option("--workers", type=BoundedInt(limits.WORKERS), default=1, show_default=True,
              help="CP-SAT search workers; 1 keeps every output identical run to run, more may be faster.")
@click.option("--seed", type=BoundedInt(limits.SEED), default=0, show_default=True, help="CP-SAT random seed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of tables.")
@emit_options
@user_errors
def command(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size, num_gpus, max_batch,
            batch, batch_tokens, space_name, fix, kernels, datatype, top_k, time_limit_s, workers, seed, as_json, emit,
            lossy):
    """Find the fastest mapping under the exact model, certified optimal by CP-SAT.

    Exits 1 when no mapping is feasible, naming the constraints that rule every mapping out.

    \b
    Example:
      mapsat solve --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --gpus 4096 \\
                   --datatype float8 --offload-gib 1024 --offload-gbps 100
      mapsat solve --model problems/models/llama-3.1-70b/config.json --seq-size 8192 \\
                   --system problems/systems/h100-80g-nvl8.yaml --gpus 512
      mapsat solve --model problems/models/llama-3.1-70b/config.json --seq-size 8192 \\
                   --system problems/systems/h100-80g-nvl8.yaml --gpus 64 \\
                   --precision fp8-tensorwise --fix seq_par_ag_redo=on --emit megatron
    """
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model, system,
                                     num_gpus)
    config = SolverConfig(time_limit_s=time_limit_s, workers=workers, seed=seed, top_k=top_k)
    try:
        with progress_line() as say:
            result = solve(model, system, num_gpus, max_batch=max_batch, datatype=Datatype(datatype),
                           space=space, kernels=kernels, config=config, progress=say)
            fitting = None
            if result.status == SolveStatus.infeasible:
                say("finding the smallest GPU count that fits")
                def fits(count: int, left_s: float) -> bool:
                    return solve(model, system, count, max_batch=max_batch, datatype=Datatype(datatype), space=space,
                                 kernels=kernels, config=dataclasses.replace(config, time_limit_s=left_s, top_k=1)
                                 ).best is not None

                fitting = smallest_fitting_count(num_gpus, result.infeasible_reasons, system.networks[0].size, fits,
                                                 time_limit_s)
    except KeyboardInterrupt:            # while the search was being set up: nothing scored yet
        if debugging():
            raise
        click.echo(NOTHING_YET, err=True)
        sys.exit(130)
    if emit and result.best is not None:
        echo_emitted(result.best.mapping, model, system, emit, lossy)
    elif emit:
        pass                             # no mapping: the reason follows, exit 1
    elif as_json:
        band = None if result.best is None else band_json(model, system, result.best.mapping,
                                                          result.best.iteration_time_s)
        click.echo(dumps({**result.to_dict(), "fixed": describe_pins(space), "smallest_fitting_gpus": fitting,
                          "parameters": ParameterCounts.of(model).to_dict(), "error_band": band,
                          "indistinguishable": indistinguishable(model, system, result.top)}))
    else:
        label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
        band = None if result.best is None else band_line(model, system, result.best.mapping,
                                                          result.best.iteration_time_s)
        print_result(result, f"{model.name} ({ParameterCounts.of(model).summary()}) on {num_gpus:,} x {label}, {datatype}, "
                             f"space {space_name}{pins_text(space)}, {batch_header(space, max_batch, model)}, {kernels.label}",
                     band, indistinguishable_line(indistinguishable(model, system, result.top), len(result.top)))
    if result.status == SolveStatus.interrupted:
        click.echo("interrupted (Ctrl-C): the best mapping found so far, not certified" if result.best
                   else NOTHING_YET, err=True)
        sys.exit(130)
    if result.status == SolveStatus.unknown:
        raise MapsatError(f"no mapping found within the time limit of {time_limit_s:g} s (none proven infeasible "
                          f"either): give a longer --time-limit")
    if result.best is None:
        domain = system.networks[0]
        fits = ("" if fitting is None else f"; the smallest GPU count that fits, in whole {domain.name} domains of "
                                           f"{domain.size} or a part of one: {fitting:,} (--gpus {fitting})")
        raise MapsatError(f"infeasible: {'; '.join(result.infeasible_reasons)}{fits}")


TABLE_COLUMNS = 120
"""The widest a breakdown table is printed (its cells' words wrap to fit)."""


def print_result(result: SolveResult, title: str, band: str | None = None, close: str | None = None) -> None:
    out = wide_console()
    if result.status == SolveStatus.infeasible:
        verdict = "proven infeasible"
    elif result.status == SolveStatus.unknown:
        verdict = "no mapping found before the time limit, none proven infeasible"
    elif result.certified_optimal:
        verdict = "certified optimal"
    elif result.gap == 0:
        verdict = f"best mapping proven optimal, the rest of the top {len(result.top)} not certified (time limit)"
    else:
        verdict = f"best found, not certified: gap {100 * (result.gap or 0):.2f} % to the bound"
    out.print(f"{title}: {verdict} in {result.seconds:.2f} s "
              f"({counted(result.rounds, 'CP-SAT round')}; {result.candidates_scored:,} of "
              f"{counted(result.space_size, 'mapping')} scored exactly, in {counted(result.blocks_scored, 'block')})")
    if result.best is None:
        return
    for table in evaluation_tables(result.best, title="Best mapping", band=band):
        out.print(table, width=min(out.width, TABLE_COLUMNS))         # long cells wrap their words
    same = result.equivalents or [{}] * len(result.top)
    out.print(top_table([(ev.iteration_time_s, ev.mfu, ev.hbm_bytes, ev.offload_bytes, ev.mapping.model_dump(mode="json"),
                          settings) for ev, settings in zip(result.top, same)],
                        f"Top {len(result.top)} distinct (ties: first enumerated wins)"))
    if close is not None:
        out.print(close)
    bound = f"{result.bound_s:.4f} s" if result.bound_s is not None else "none"
    out.print(f"lower bound on any mapping: {bound}; gap {100 * (result.gap or 0):.3f} %")
    if result.binding:
        out.print("what limits it: " + "; ".join(result.binding))
