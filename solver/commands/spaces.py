"""`mapsat spaces`: the named mapping spaces and what each dimension means.

Also holds the options every command over a mapping space shares (--gpus, --max-batch,
--space, --datatype), so `count`, `brute` and later `solve` spell them the same way.
"""

from __future__ import annotations

import json
from typing import Callable

import click
from rich.console import Console
from rich.table import Table

from costmodel.system import Datatype
from solver.cli import user_errors
from solver.space import ATTENTION_KERNELS, DEFAULT_SPACE, SPACES, Space


def wide_console() -> Console:
    """A console for tables: the terminal's width, or 200 columns when writing to a file or
    pipe (rich would otherwise squeeze tables into 80 and cut every cell)."""
    console = Console(soft_wrap=False)
    return console if console.is_terminal else Console(soft_wrap=False, width=200)


attention_option = click.option(
    "--attention", type=click.Choice(ATTENTION_KERNELS), default="fused", show_default=True,
    help="Attention core: one FlashAttention kernel (fused), or four kernels passing the s×s scores "
         "through HBM (unfused: Megatron-LM 2022, Calculon).")


def space_options(func: Callable) -> Callable:
    """--gpus N [--max-batch B] [--space NAME] [--attention fused|unfused]."""
    options = [
        click.option("--gpus", "num_gpus", required=True, type=click.IntRange(min=1),
                     help="Number of GPUs, N (tp·pp·dp = N)."),
        click.option("--max-batch", type=click.IntRange(min=1), default=3072, show_default=True,
                     help="Cap on the global batch, in sequences."),
        click.option("--space", "space_name", type=click.Choice(list(SPACES)), default=DEFAULT_SPACE,
                     show_default=True, help="Named mapping space (see `mapsat spaces`)."),
        attention_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def datatype_option(func: Callable) -> Callable:
    """--datatype D."""
    return click.option("--datatype", type=click.Choice([d.value for d in Datatype]), default=Datatype.bfloat16.value,
                        show_default=True, help="Compute datatype; the system must list it.")(func)


def space_as_dict(space: Space) -> dict:
    """A space described for people and JSON: every dimension with domain, rule, meaning."""
    dims = [{"name": d.name, "domain": d.domain_text, "rule": d.rule_text, "meaning": d.meaning}
            for d in space.skeleton_dimensions()]
    dims += [{"name": d.name, "domain": d.domain_text(), "rule": d.rule_text(), "meaning": d.meaning}
             for d in space.flags]
    return {"name": space.name, "summary": space.summary, "tp_max": space.tp_max,
            "batch_is_dp_above_cap": space.batch_is_dp_above_cap, **space.kernels,
            "default": space.name == DEFAULT_SPACE, "dimensions": dims}


@click.command(name="spaces")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@user_errors
def command(as_json: bool) -> None:
    """List the named mapping spaces and what each dimension means.

    A mapping space says which ways of splitting a model over N GPUs exist; `count`,
    `brute` and `solve` all read the same declaration.

    \b
    Example:
      mapsat spaces
      mapsat spaces --json
    """
    described = [space_as_dict(space) for space in SPACES.values()]
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    console = wide_console()
    for space in described:
        default = " (default)" if space["default"] else ""
        table = Table(title=f"{space['name']}{default}: {space['summary']}", title_justify="left")
        for header in ("dimension", "domain", "free / rule", "meaning"):
            table.add_column(header)
        for dim in space["dimensions"]:
            table.add_row(dim["name"], dim["domain"], dim["rule"], dim["meaning"])
        console.print(table)
