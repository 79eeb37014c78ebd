"""mapsat validate: reproduce the measured Megatron-LM runs on Selene."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from costmodel.load import load_system
from costmodel.validation import validate_selene
from solver.cli.options import user_errors
from solver.report.tables import console, dumps

DEFAULT_SYSTEM = Path(__file__).resolve().parents[2] / "problems" / "systems" / "a100-80g-selene.yaml"


@click.command("validate")
@click.option("--system", "system_path", type=click.Path(dir_okay=False), default=str(DEFAULT_SYSTEM),
              show_default="problems/systems/a100-80g-selene.yaml", help="System file to validate.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@user_errors
def command(system_path, as_json):
    """Compare the model with Megatron-LM measured on Selene (Korthikanti et al. 2022):
    iteration time (Table 5), first-stage memory (Figure 1), activation memory (Figure 7).

    \b
    Example:
      mapsat validate
      mapsat validate --json
    """
    report = validate_selene(load_system(system_path))
    if as_json:
        click.echo(dumps(report.to_dict()))
        return
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
