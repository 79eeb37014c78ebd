"""The `mapsat` command line: parse, load, call the library, format. Nothing else.

Each command lives in its own module under solver/commands/ and registers itself on `cli`.
Errors the user caused (MapsatError) print one line and exit 1; usage errors exit 2 (click);
`mapsat --debug ...` shows the traceback instead.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import click

from costmodel.errors import MapsatError
from costmodel.load import load_model, load_system
from costmodel.model import Model
from costmodel.system import System


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


def _debugging() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().obj and ctx.find_root().obj.get("debug"))


def user_errors(func: Callable) -> Callable:
    """Turn the errors a user causes into a one-line message and exit status 1 (unless --debug):
    MapsatError (bad input, infeasible problem), and an OSError on a file the user named
    (a --csv or output path in a missing directory, a full disk, no permission)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except MapsatError as err:
            if _debugging():
                raise
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        except OSError as err:
            if _debugging() or err.filename is None:
                raise
            click.echo(f"error: {err.filename}: {err.strerror or err}", err=True)
            sys.exit(1)

    return wrapper


def system_override_options(func: Callable) -> Callable:
    """--hbm-gib, --offload-gib, --offload-gbps, --nvlink-size: the co-design knobs."""
    options = [
        click.option("--hbm-gib", type=float, help="Replace the HBM (tier-1) capacity per GPU, GiB."),
        click.option("--offload-gib", type=float,
                     help="Add or resize the offload (tier-2) memory per GPU, GiB; 0 removes it."),
        click.option("--offload-gbps", type=float,
                     help="Offload memory bandwidth per GPU per direction, GB/s (default when adding: as fast as HBM)."),
        click.option("--nvlink-size", type=int, help="Resize the first network (the NVLink domain), GPUs."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def problem_options(func: Callable) -> Callable:
    """--model FILE --system FILE and the system overrides."""
    func = system_override_options(func)
    func = click.option("--system", "system_path", required=True, type=click.Path(dir_okay=False),
                        help="System file (YAML): GPUs, memory tiers, networks.")(func)
    func = click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False),
                        help="Model file (YAML or JSON, Calculon field names).")(func)
    return func


def load_problem(model_path: str, system_path: str, hbm_gib: float | None, offload_gib: float | None,
                 offload_gbps: float | None, nvlink_size: int | None) -> tuple[Model, System]:
    model = load_model(model_path)
    system = load_system(system_path).with_overrides(
        hbm_gib=hbm_gib, offload_gib=offload_gib, offload_gbps=offload_gbps, nvlink_size=nvlink_size)
    return model, system


def _register_commands() -> None:
    import importlib
    import pkgutil

    import solver.commands as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"solver.commands.{info.name}")
        cli.add_command(module.command)


_register_commands()


def main() -> None:
    cli(obj={})
