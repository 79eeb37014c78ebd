"""`mapsat brute`: exhaustive search over every mapping with the exact vectorized model."""

from __future__ import annotations

import json

import click
from rich.table import Table

from costmodel.errors import MapsatError
from costmodel.kernels import Kernels
from costmodel.system import Datatype
from costmodel.units import GiB
import costmodel.limits as limits
from solver.cli.options import (BoundedInt, datatype_option, load_problem, problem_options,
                                space_and_cap, space_options, user_errors, wide_console)
from solver.report.tables import MAPPING_HEADERS, mapping_cells
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
            attention: str, datatype: str, top_k: int, csv_path: str | None, workers: int | None,
            as_json: bool) -> None:
    """Evaluate every mapping with the exact model and list the fastest.

    Exhaustive and exact: the reference the CP-SAT solver is tested against. Ties in time
    go to the mapping enumerated first (see docs/mapping-space.md). Exits 1 when no mapping
    is feasible, naming the checks that rule them out.

    \b
    Example (92.2 million mappings, under two minutes on two cores):
      mapsat brute --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --offload-gib 1024 --offload-gbps 100 \\
                   --gpus 4096 --datatype float8 --top-k 5
    """
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=seq_size)
    space, max_batch = space_and_cap(space_name, fix, max_batch, batch, batch_tokens, model)
    result = scan(model, system, num_gpus, max_batch, space, Datatype(datatype), Kernels.with_attention(attention),
                  top_k=top_k, workers=workers, progress=not as_json, csv_path=csv_path)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "fixed": describe_pins(space)}, indent=2))
    else:
        print_brute(result, model.name, system.name + pins_text(space))
    if result.best is None:
        raise MapsatError(result.infeasible_reason(system.hbm.capacity_bytes))


def print_brute(result: BruteResult, model_name: str, system_name: str) -> None:
    """Human output: counts, the best mapping with its time and memory, the top-k table."""
    console = wide_console()
    rate = result.evaluated / result.seconds if result.seconds > 0 else 0.0
    console.print(f"{model_name} on {result.num_gpus:,} GPUs of {system_name}, {result.datatype}, "
                  f"space {result.space}, {result.attention} attention: "
                  f"evaluated [bold]{result.evaluated:,}[/bold] mappings, [bold]{result.feasible:,}[/bold] feasible, "
                  f"in {result.seconds:.1f} s ({rate:,.0f} mappings/s, {result.workers} workers)")
    if result.best is None:
        return
    best = result.best
    console.print(f"best: [bold]{best.iteration_time_s:.4f} s[/bold] per iteration, MFU {best.mfu:.1%}")
    mapping_table = Table(title="Best mapping", title_justify="left", show_header=False)
    for key, value in best.mapping.model_dump(mode="json").items():
        mapping_table.add_row(key, str(value))
    console.print(mapping_table)
    detail = Table(title="Where the time goes and memory per GPU", title_justify="left")
    detail.add_column("time term")
    detail.add_column("s", justify="right")
    detail.add_column("memory")
    detail.add_column("GiB", justify="right")
    times = list(result.best_time_breakdown_s.items())
    memory = list(best.memory.items())
    for i in range(max(len(times), len(memory))):
        t = times[i] if i < len(times) else ("", None)
        mem = memory[i] if i < len(memory) else ("", None)
        detail.add_row(t[0], "" if t[1] is None else f"{t[1]:.4f}", mem[0], "" if mem[1] is None else f"{mem[1] / GiB:.2f}")
    console.print(detail)
    top = Table(title=f"Top {len(result.top)} (ties: first enumerated wins)", title_justify="left")
    for header in ("#", "time s", "MFU", *MAPPING_HEADERS, "HBM GiB", "offload GiB"):
        top.add_column(header, justify="right")
    for rank, c in enumerate(result.top, start=1):
        top.add_row(str(rank), f"{c.iteration_time_s:.4f}", f"{c.mfu:.1%}", *mapping_cells(c.mapping.model_dump(mode="json")),
                    f"{c.memory['hbm_bytes'] / GiB:.1f}", f"{c.memory['offload_bytes'] / GiB:.1f}")
    console.print(top)
