"""`mapsat count`: how many mappings a model has on N GPUs (closed form), and optionally how
many of them the exact model accepts."""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.table import Table

from costmodel.terms.context import Context
from costmodel.space.dimensions import SPLIT_TEXT
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.system import Datatype
import costmodel.inputs.limits as limits
from solver.cli.options import (progress_line, quiet, BoundedInt, batch_header, datatype_option, load_problem, problem_options,
                                space_and_cap, space_options, system_label, user_errors, wide_console,
                                wide_option)
from solver.search.brute import scan
from solver.space.pins import describe_pins, pins_text
from solver.space.count import CountResult, count_mappings


@click.command(name="count")
@problem_options
@space_options(counting=True)
@click.option("--feasible", is_flag=True,
              help="Also count the mappings that pass the exact model's network-size and memory checks "
                   "(evaluates every mapping: seconds to minutes).")
@datatype_option
@click.option("--workers", type=BoundedInt(limits.WORKERS), default=None, help="Processes for --feasible (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@wide_option
@user_errors
def command(model_path: str, system_path: str, seq_size: int | None, hbm_gib: float | None, offload_gib: float | None,
            offload_gbps: float | None, nvlink_size: int | None, num_gpus: int, max_batch: int, batch: int | None,
            batch_tokens: int | None, space_name: str, fix: tuple[str, ...],
            kernels: Kernels, feasible: bool, datatype: str, workers: int | None, as_json: bool, wide: bool) -> None:
    """Count the mappings of a model onto N GPUs, in closed form (milliseconds).

    Prints the total and how many mappings each value of each dimension contributes (tp,
    pp, interleaving, microbatch, recompute, ...), which shows why one model shape maps
    better than another.

    \b
    Example (the brief's 256-block model: 15,612,832 mappings):
      mapsat count --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --offload-gib 1024 \\
                   --gpus 4096 --space calculon-2023
    """
    for option, value, bound in (("--gpus", num_gpus, limits.GPUS_SEARCH), ("--max-batch", max_batch,
                                                                            limits.MAX_BATCH_SEARCH)):
        if feasible and value is not None and bound.problem(value):
            raise click.BadParameter(f"{value} is {bound.problem(value)} (--feasible scores every mapping)",
                                     param_hint=f"'{option}'")
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    if click.get_current_context().get_parameter_source("datatype") is not click.core.ParameterSource.DEFAULT:
        system.compute_for(Datatype(datatype))   # a datatype given explicitly must exist, counted or not
    if kernels.precision is not None:            # so must a recipe the GPU runs, with the datatype it needs
        Context.of(model, system, Datatype(datatype), kernels)
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model, system,
                                     num_gpus)
    result = count_mappings(model, system, num_gpus, max_batch, space)
    if feasible:
        start = time.perf_counter()
        # a bar on a terminal; piped or with --json, progress on stderr past 2 s; --quiet: neither
        bar = Console(stderr=True).is_terminal and not as_json and not quiet()
        with progress_line(enabled=not bar and not quiet()) as say:
            scanned = scan(model, system, num_gpus, max_batch, space, Datatype(datatype), kernels,
                           top_k=0, workers=workers, progress=bar, say=say)
        result = result.with_feasible(scanned.feasible, scanned.feasible_by_dimension, Datatype(datatype),
                                      time.perf_counter() - start, kernels)
        if scanned.interrupted:
            raise KeyboardInterrupt   # a partial feasible count is no count: user_errors exits 130
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "fixed": describe_pins(space)}, indent=2))
    else:
        label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
        print_count(result, model.name, label + pins_text(space), batch_header(space, max_batch, model), wide)


def print_count(result: CountResult, model_name: str, system_name: str, batch: str | None = None,
                wide: bool = False) -> None:
    """Human output: the total, then one row per dimension with the count per value (wrapped
    to the terminal's width, or COLUMNS; `wide`: 200 columns)."""
    console = wide_console(wide)
    line = (f"[bold]{result.mappings:,}[/bold] mappings of {model_name} on {result.num_gpus:,} GPUs of {system_name} "
            f"(space {result.space}, {result.skeletons} {SPLIT_TEXT} splits)")
    if result.feasible is not None:
        line += f"; [bold]{result.feasible:,}[/bold] feasible in {result.datatype}, {result.kernels.label}"
    console.print(line)
    console.print(batch or f"global batch ≤ {result.max_batch:,} sequences")
    if not result.mappings:
        console.print(f"No mapping: no {SPLIT_TEXT} split satisfies the divisibility and batch rules (see `mapsat spaces`).")
        return
    table = Table(title="Mappings per value of each dimension", title_justify="left")
    table.add_column("dimension")
    table.add_column("value: mappings")
    if result.feasible_by_dimension is not None:
        table.add_column("value: feasible")
    for name, values in result.by_dimension.items():
        row = [name, ", ".join(f"{value}: {count:,}" for value, count in values.items())]
        if result.feasible_by_dimension is not None:
            feasible = result.feasible_by_dimension.get(name, {})
            row.append(", ".join(f"{value}: {count:,}" for value, count in feasible.items()) or "-")
        table.add_row(*row)
    console.print(table)
    console.print(f"took {result.seconds:.3f} s")
