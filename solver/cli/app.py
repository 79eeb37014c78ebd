"""The `mapsat` command line: parse, load, call the library, format. Nothing else.

Each command lives in its own module beside this one (solver/cli/<command>.py) and is
registered on `cli` here; the options they share are in solver/cli/options.py.
Errors the user caused (MapsatError) print one line and exit 1; usage errors exit 2 (click);
`mapsat --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import click

from solver.cli import batch, brute, count, eval, plot, shape, solve, spaces, validate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors instead of one line.")
@click.version_option(package_name="mapsat")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Find the fastest way to train a transformer on a GPU cluster.

    \b
    Example:
      mapsat solve --model problems/models/gpt-1t-256b.yaml \\
                   --system problems/systems/h100-80g-nvl8.yaml --gpus 4096 \\
                   --datatype float8 --offload-gib 1024 --offload-gbps 100
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


for _module in (batch, brute, count, eval, plot, shape, solve, spaces, validate):
    cli.add_command(_module.command)


def main() -> None:
    cli(obj={})
