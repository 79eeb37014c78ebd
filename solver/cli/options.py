"""What every command shares: the one-line error handling (`user_errors`), the problem
options (--model, --system and the co-design overrides), the space options (--gpus,
--max-batch, --space, --attention), --datatype, and the wide console for tables."""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Callable, Iterator

import click
from rich.console import Console

from costmodel.errors import MapsatError
from costmodel.hf import UnmodelledFieldWarning
from costmodel.kernels import ATTENTION_KERNELS
from costmodel.load import load_model, load_system
from costmodel.model import Model
from costmodel.system import Datatype, System
from solver.space.declaration import DEFAULT_SPACE, SPACES, Space, get_space
from solver.space.pins import batch_cap, parse_pins, pinned


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
    """--model FILE --system FILE [--seq-size S] and the system overrides."""
    func = system_override_options(func)
    func = click.option("--seq-size", type=click.IntRange(min=1),
                        help="Training sequence length, tokens: required with a Hugging Face config.json "
                             "(which states only the context limit); replaces a model file's seq_size.")(func)
    func = click.option("--system", "system_path", required=True, type=click.Path(dir_okay=False),
                        help="System file (YAML): GPUs, memory tiers, networks.")(func)
    func = click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False),
                        help="Model file: YAML or JSON with Calculon's field names, or a Hugging Face "
                             "config.json (model_type llama, mistral, qwen2, gpt2, gpt_neox, nemotron).")(func)
    return func


@contextlib.contextmanager
def model_warnings_on_stderr() -> Iterator[None]:
    """Print each UnmodelledFieldWarning raised inside as one line on stderr ("warning: ...");
    other warnings go on as they would."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                if issubclass(w.category, UnmodelledFieldWarning):
                    click.echo(f"warning: {w.message}", err=True)
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def load_problem(model_path: str, system_path: str, hbm_gib: float | None, offload_gib: float | None,
                 offload_gbps: float | None, nvlink_size: int | None, *,
                 seq_size: int | None = None) -> tuple[Model, System]:
    with model_warnings_on_stderr():
        model = load_model(model_path, seq_size=seq_size)
    system = load_system(system_path).with_overrides(
        hbm_gib=hbm_gib, offload_gib=offload_gib, offload_gbps=offload_gbps, nvlink_size=nvlink_size)
    return model, system


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
    """--gpus N [--max-batch B | --batch B | --batch-tokens T] [--space NAME] [--fix DIM=V,...]
    [--attention fused|unfused]."""
    options = [
        click.option("--gpus", "num_gpus", required=True, type=click.IntRange(min=1),
                     help="Number of GPUs, N (tp·pp·dp = N)."),
        click.option("--max-batch", type=click.IntRange(min=1), default=3072, show_default=True,
                     help="Cap on the global batch, in sequences: each split takes the largest multiple of dp "
                          "under it."),
        click.option("--batch", type=click.IntRange(min=1), default=None,
                     help="Fix the global batch, in sequences (only splits whose dp divides it remain)."),
        click.option("--batch-tokens", type=click.IntRange(min=1), default=None,
                     help="Fix the global batch in tokens (a whole number of sequences, e.g. 16777216)."),
        click.option("--space", "space_name", type=click.Choice(list(SPACES)), default=DEFAULT_SPACE,
                     show_default=True, help="Named mapping space (see `mapsat spaces`)."),
        click.option("--fix", "fix", multiple=True, metavar="DIM=VALUE[,VALUE...]",
                     help="Keep only mappings whose dimension DIM takes one of these values, e.g. --fix tp=8 "
                          "--fix recompute=full,none (repeatable; dimensions: `mapsat spaces`)."),
        attention_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def space_and_cap(space_name: str, fix: tuple[str, ...], max_batch: int, batch: int | None,
                  batch_tokens: int | None, model: Model) -> tuple[Space, int]:
    """The named space with the --fix pins and a fixed batch applied, and the batch cap."""
    given = click.get_current_context().get_parameter_source("max_batch") is not click.core.ParameterSource.DEFAULT
    cap, batch_pins = batch_cap(max_batch, batch, batch_tokens, model.seq_size, given)
    return pinned(get_space(space_name), parse_pins(fix) + batch_pins), cap


def datatype_option(func: Callable) -> Callable:
    """--datatype D."""
    return click.option("--datatype", type=click.Choice([d.value for d in Datatype]), default=Datatype.bfloat16.value,
                        show_default=True, help="Compute datatype; the system must list it.")(func)
