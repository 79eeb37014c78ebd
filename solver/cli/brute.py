"""`mapsat brute`: exhaustive search over every mapping with the exact vectorized model."""

from __future__ import annotations

import json
import sys

import click

import costmodel.inputs.limits as limits
from costmodel.errors import MapsatError
from costmodel.evaluate import evaluate
from costmodel.inputs.load import ensure_parent
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.system import Datatype
from solver.cli.options import (BoundedInt, batch_header, datatype_option, load_problem, problem_options,
                                space_and_cap, space_options, system_label, user_errors, wide_console)
from solver.cli.progress import progress_line, quiet
from solver.report.tables import evaluation_tables, top_table
from solver.search.brute import BruteResult, scan
from solver.space.pins import describe_pins, pins_text


@click.command(name="brute")
@problem_options
@space_options
@datatype_option
@click.option("--top-k", type=BoundedInt(limits.TOP_K), default=10, show_default=True, help="How many best mappings to list.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True),
              help="Write every feasible mapping with its time and memory to this CSV file (enumeration order).")
@click.option("--workers", type=BoundedInt(limits.WORKERS), default=None, help="Processes (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@user_errors
def command(model_path: str, system_path: str, seq_size: int | None, hbm_gib: float | None, offload_gib: float | None,
            offload_gbps: float | None, nvlink_size: int | None, num_gpus: int, max_batch: int, batch: int | None,
            batch_tokens: int | None, space_name: str, fix: tuple[str, ...],
            kernels: Kernels, datatype: str, top_k: int, csv_path: str | None, workers: int | None,
            as_json: bool) -> None:
    """Evaluate every mapping with the exact model and list the fastest.

    Exhaustive and exact: the reference the CP-SAT solver is tested against. Ties in time
    go to the mapping enumerated first (see docs/mapping-space.md). Exits 1 when no mapping
    is feasible, naming the checks that rule them out.

    \b
    Example (1.05 billion mappings, about five minutes on two cores):
      mapsat brute --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --offload-gib 1024 --offload-gbps 100 \\
                   --gpus 4096 --datatype float8 --top-k 5
    """
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model, system,
                                     num_gpus)
    if csv_path is not None:
        ensure_parent(csv_path, "--csv")
    from rich.console import Console

    # a bar on a terminal; piped or with --json, progress on stderr past 2 s; --quiet: neither
    bar = Console(stderr=True).is_terminal and not as_json and not quiet()
    with progress_line(enabled=not bar and not quiet()) as say:
        result = scan(model, system, num_gpus, max_batch, space, Datatype(datatype), kernels,
                      top_k=top_k, workers=workers, progress=bar, csv_path=csv_path, say=say)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "fixed": describe_pins(space)}, indent=2))
    else:
        label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
        best = evaluate(model, system, result.best.mapping) if result.best is not None else None
        print_brute(result, model.name, f"{label}{pins_text(space)}, {batch_header(space, max_batch, model)}", best)
    if result.interrupted:
        click.echo(f"interrupted (Ctrl-C) after scoring {result.evaluated:,} of {result.space_size:,} mappings: "
                   + ("the best of those, not the optimum" if result.best else "none of them feasible"), err=True)
        sys.exit(130)
    if result.best is None:
        raise MapsatError(result.infeasible_reason(system.usable_hbm_bytes))


def print_brute(result: BruteResult, model_name: str, system_name: str, best_evaluation=None) -> None:
    """Human output: counts, the best mapping with its time and memory, the top-k table."""
    console = wide_console()
    if result.proof is not None:
        console.print(f"{model_name} on {result.num_gpus:,} GPUs of {system_name}: none of the "
                      f"{result.space_size:,} mappings scored, their infeasibility proven in {result.seconds:.1f} s")
        return
    rate = result.evaluated / result.seconds if result.seconds > 0 else 0.0
    console.print(f"{model_name} on {result.num_gpus:,} GPUs of {system_name}, {result.datatype}, "
                  f"space {result.space}, {result.kernels.label}: "
                  f"evaluated [bold]{result.evaluated:,}[/bold] mappings, [bold]{result.feasible:,}[/bold] feasible, "
                  f"in {result.seconds:.1f} s ({rate:,.0f} mappings/s, {result.workers} workers)")
    if result.best is None or best_evaluation is None:
        return
    for table in evaluation_tables(best_evaluation, title="Best mapping"):
        console.print(table)
    console.print(top_table([(c.iteration_time_s, c.mfu, c.memory["hbm_bytes"], c.memory["offload_bytes"],
                              c.mapping.model_dump(mode="json"), c.equivalents) for c in result.top],
                            f"Top {len(result.top)} distinct (ties: first enumerated wins)"))
