"""What every command shares: the one-line error handling (`user_errors`), the problem
options (--model, --system and the co-design overrides), the space options (--gpus,
--max-batch, --space), the kernel options (--attention, --grad-datatype, --capacity-factor and
the precision recipe's), --datatype, and the wide console for tables."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from typing import TYPE_CHECKING, Callable, Iterator

import click

import costmodel.inputs.limits as limits
from costmodel.inputs.advice import datatype_hint, model_warnings, override_warnings
from costmodel.errors import MapsatError
from costmodel.inputs.headroom import Headroom
from costmodel.inputs.hf import UnmodelledFieldWarning
from costmodel.inputs.kernels import ATTENTION_KERNELS, CUDA_GRAPHS, GRAD_DATATYPES, Kernels
from costmodel.inputs.limits import Bound
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.model import Model
from costmodel.inputs.precision import OPTIMIZER_STATES, Precision
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB
from solver.cli.errors import debugging, one_line_errors
from solver.cli.progress import progress_line, quiet  # noqa: F401 (the commands import progress_line from here)
from solver.space.declaration import DEFAULT_SPACE, SPACES, Space, get_space
from solver.space.pins import batch_cap, batch_text, check_pins, default_batch_cap, parse_pins, pinned

if TYPE_CHECKING:
    from rich.console import Console


def user_errors(func: Callable) -> Callable:
    """Turn the errors a user causes into a one-line message and exit status 1 (unless --debug):
    solver.cli.errors.one_line_errors around one command (the group wraps every command in it
    too, so an error raised by an option's wrapper is caught as well)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with one_line_errors():
            return func(*args, **kwargs)

    return wrapper


class BoundedInt(click.IntRange):
    """A whole number at least `bound.low`; above `bound.high` the error names the bound and why."""

    def __init__(self, bound: Bound):
        super().__init__(min=int(bound.low))
        self.bound = bound

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        problem = self.bound.problem(number)
        if problem is not None:
            self.fail(f"{number} is {problem}", param, ctx)
        return number


class BoundedFloat(click.FloatRange):
    """A finite number > `low_open` (when given) within `bound`, the error naming the bound and why."""

    def __init__(self, bound: Bound, low_open: float | None = None):
        super().__init__(min=low_open, min_open=low_open is not None)
        self.bound = bound

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number", param, ctx)
        problem = self.bound.problem(number)
        if problem is not None:
            self.fail(f"{number:g} is {problem}", param, ctx)
        return number

    def _describe_range(self) -> str:
        """The range --help shows: the bound's, "1<=x<=1e+18" (click's own would read x<=None)."""
        high = limits.shown(self.bound.high)
        if self.min is not None and self.min >= self.bound.low:
            return f"{self.min:g}<x<={high}"
        return f"{limits.shown(self.bound.low)}<=x<={high}"


def _remember_headroom(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--hbm-headroom, parsed, kept for load_problem and shape (ctx.meta["mapsat.hbm_headroom"])."""
    if value is None:
        return
    try:
        ctx.meta["mapsat.hbm_headroom"] = Headroom.parse(value)
    except MapsatError as err:
        raise click.BadParameter(str(err).removeprefix("--hbm-headroom: ")) from None


def given_headroom() -> Headroom | None:
    """The --hbm-headroom of the running command, or None."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get("mapsat.hbm_headroom")


def system_override_options(func: Callable) -> Callable:
    """--hbm-gib, --offload-gib, --offload-gbps, --nvlink-size: the co-design knobs; --hbm-headroom
    (kept in ctx.meta, applied by load_problem)."""
    options = [
        click.option("--hbm-gib", type=float, help="Replace the HBM (tier-1) capacity per GPU, GiB."),
        click.option("--offload-gib", type=float,
                     help="Add or resize the offload (tier-2) memory per GPU, GiB; 0 removes it."),
        click.option("--offload-gbps", type=float,
                     help="Offload memory bandwidth per GPU per direction, GB/s (default when adding: as fast as HBM)."),
        click.option("--nvlink-size", type=int, help="Resize the first network (the NVLink domain), GPUs."),
        click.option("--hbm-headroom", expose_value=False, callback=_remember_headroom, metavar="GIB|PERCENT%",
                     help="HBM each GPU must leave free beyond the runtime reserve and the fitted allocator term, "
                          "e.g. 4 or 4GiB, or 5% of the HBM capacity (default 0): the memory check allows "
                          "capacity less headroom; headers state it."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def given_once(ctx: click.Context, param: click.Parameter, values: tuple):
    """Callback of an option declared multiple=True that must be given once: click would
    otherwise keep the last of two silently."""
    if len(values) > 1:
        raise click.BadParameter(f"given {len(values)} times ({', '.join(map(str, values))}): give it once")
    return values[0] if values else None


def _remember_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta["mapsat.quiet"] = bool(value)
    return value


quiet_option = click.option("--quiet", is_flag=True, expose_value=False, callback=_remember_quiet,
                            help="No warnings about inputs that are legal but probably a mistake, and no progress "
                                 "lines on stderr.")


def warn(*messages: str) -> None:
    """Each message as one line `warning: ...` on stderr, unless the command got --quiet."""
    if quiet():
        return
    for message in messages:
        click.echo(f"warning: {message}", err=True)


def problem_options(func: Callable) -> Callable:
    """--model FILE --system FILE [--seq-size S], the system overrides and --quiet."""
    func = quiet_option(func)
    func = system_override_options(func)
    func = click.option("--seq-size", type=BoundedInt(limits.SEQ_SIZE),
                        help="Training sequence length, tokens: required with a Hugging Face config.json "
                             "(which states only the context limit); replaces a model file's seq_size.")(func)
    func = click.option("--system", "system_path", required=True, multiple=True, callback=given_once,
                        type=click.Path(dir_okay=False), help="System file (YAML): GPUs, memory tiers, networks.")(func)
    func = click.option("--model", "model_path", required=True, multiple=True, callback=given_once,
                        type=click.Path(dir_okay=False),
                        help="Model file: YAML or JSON with Calculon's field names, or a Hugging Face "
                             "config.json (model_type llama, mistral, qwen2, qwen3, gpt2, gpt_neox, nemotron, mixtral, "
                             "qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss).")(func)
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
                    warn(str(w.message))
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def load_problem(model_path: str, system_path: str, hbm_gib: float | None, offload_gib: float | None,
                 offload_gbps: float | None, nvlink_size: int | None, *,
                 seq_size: int | None = None) -> tuple[Model, System]:
    with model_warnings_on_stderr():
        model = load_model(model_path, seq_size=seq_size)
    system = load_system(system_path).with_overrides(
        hbm_gib=hbm_gib, offload_gib=offload_gib, offload_gbps=offload_gbps, nvlink_size=nvlink_size
    ).with_headroom(given_headroom())
    warn(*model_warnings(model, str(model_path)), *override_warnings(offload_gib, offload_gbps))
    return model, system


def system_label(system: System, hbm_gib: float | None = None, offload_gib: float | None = None,
                 offload_gbps: float | None = None, nvlink_size: int | None = None) -> str:
    """The system's name and, when the command line changed it, what it changed:
    "h100-80g-nvl8 (hbm 40 GiB, offload 1024 GiB @ 100 GB/s, nvlink 16)"."""
    changed = []
    if hbm_gib is not None:
        changed.append(f"hbm {hbm_gib:g} GiB")
    if offload_gib is not None or offload_gbps is not None:
        changed.append("no offload" if system.offload is None else
                       f"offload {system.offload.capacity_gib:g} GiB @ {system.offload.bandwidth_gbps:g} GB/s")
    if nvlink_size is not None:
        changed.append(f"{system.networks[0].name} {nvlink_size}")
    headroom = headroom_text(system)
    if headroom:
        changed.append(headroom)
    return system.name + (f" ({', '.join(changed)})" if changed else "")


def headroom_text(system: System) -> str:
    """"HBM headroom 4 GiB: 76 of 80 GiB usable" when the system keeps HBM free, else ""."""
    if system.hbm_headroom_bytes <= 0:
        return ""
    return (f"HBM headroom {system.hbm_headroom_bytes / GiB:.3g} GiB: {system.usable_hbm_bytes / GiB:.3g} of "
            f"{system.hbm.capacity_gib:g} GiB usable")


WIDE_COLUMNS = 200
"""Columns of a table written to a file or pipe when COLUMNS does not say (rich would otherwise
squeeze tables into 80), and of every table under --wide."""


wide_option = click.option("--wide", is_flag=True,
                           help=f"Tables at {WIDE_COLUMNS} columns, every column shown (default: the terminal's "
                                f"width, or COLUMNS).")


def wide_console(wide: bool = False) -> "Console":
    """A console for tables: COLUMNS when set (a terminal's own width otherwise), or
    WIDE_COLUMNS when writing to a file or pipe, or always with `wide` (--wide)."""
    import os

    from rich.console import Console

    if wide:
        return Console(soft_wrap=False, width=WIDE_COLUMNS)
    console = Console(soft_wrap=False)
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return Console(soft_wrap=False, width=WIDE_COLUMNS)


def kernel_options(func: Callable) -> Callable:
    """--attention fused|unfused, --grad-datatype float32|16bit, --capacity-factor F, --cuda-graphs, --pp-comm-overlap and the precision
    recipe (--precision, --optimizer-state, --low-precision-param-gather/--bf16-param-gather,
    --bf16-first-last-blocks): the settings of the problem that are not searched, handed to the command as one
    `kernels: Kernels`."""

    @functools.wraps(func)
    def with_kernels(*args, attention: str, grad_datatype: str, capacity_factor: float, cuda_graphs: str,
                     pp_comm_overlap: bool, precision: str | None, optimizer_state: str, low_precision_param_gather: bool | None,
                     bf16_first_last_blocks: int, **kwargs):
        try:
            kernels = Kernels.with_attention(attention, grad_datatype, capacity_factor, cuda_graphs,
                                             pp_comm_overlap=pp_comm_overlap, precision=precision,
                                             optimizer_state=optimizer_state,
                                             low_precision_param_gather=low_precision_param_gather,
                                             bf16_first_last_blocks=bf16_first_last_blocks)
        except MapsatError as err:           # options that cannot go together: a usage error, one line
            if debugging():
                raise                        # --debug: the error with its traceback
            raise click.UsageError(str(err)) from None
        return func(*args, kernels=kernels, **kwargs)

    with_kernels = click.option(
        "--cuda-graphs", type=click.Choice(CUDA_GRAPHS), default="none", show_default=True,
        help="CUDA graphs as the framework captures them: none, per-layer (each block's forward and backward) or "
             "full-iteration. Graphed kernels run without the whole-step launch gap (`step.kernel_gap_us` of the "
             "system file). A setting of the problem, not searched.",
    )(with_kernels)

    with_kernels = click.option(
        "--pp-comm-overlap/--no-pp-comm-overlap", default=False, show_default=True,
        help="Interleaved pipelines: the stage-boundary sends run beside the chunks' compute (Megatron-LM's "
             "overlap_p2p_comm, on in Megatron-Bridge whenever vp > 1). A setting of the problem, not searched.",
    )(with_kernels)
    with_kernels = click.option(
        "--bf16-first-last-blocks", type=BoundedInt(limits.NUM_BLOCKS_OR_NONE), default=0, show_default=True,
        help="With an FP8/FP4 --precision: blocks at each end of the model kept in BF16 (Megatron-LM's "
             "--first-last-layers-bf16; Megatron-Bridge's performance scripts keep none).",
    )(with_kernels)
    with_kernels = click.option(
        "--low-precision-param-gather/--bf16-param-gather", default=None,
        help="With an FP8/FP4 --precision: weights kept and all-gathered in the recipe's format beside the fp32 "
             "main copy (Megatron's --fp8-param-gather), or in BF16. Default: as Megatron-Bridge's recipe of that "
             "name (on for fp8-delayed, fp8-tensorwise, mxfp8 and nvfp4; off for fp8-blockwise).",
    )(with_kernels)
    with_kernels = click.option(
        "--optimizer-state", type=click.Choice(OPTIMIZER_STATES), default="fp32", show_default=True,
        help="Adam's two moments in fp32 or bf16 (DeepSeek-V3 trained with bf16 moments); the fp32 master "
             "weights stay. A setting of the problem, not searched.",
    )(with_kernels)
    with_kernels = click.option(
        "--precision", type=click.Choice([p.value for p in Precision]), default=None,
        help="Precision recipe as Transformer Engine runs it (Megatron-LM's --fp8-recipe / --fp4-recipe names): "
             "only the blocks' GEMM operands are quantized, by amax, cast and transpose passes; norms, attention, "
             "residuals and the output layer stay BF16. The GPU must run it (its system file's precision). "
             "Without it, --datatype alone decides every byte (float8: Calculon's all-FP8). Not searched.",
    )(with_kernels)

    with_kernels = click.option(
        "--capacity-factor", type=BoundedFloat(limits.CAPACITY_FACTOR), default=1.0, show_default=True,
        help="Mixture-of-experts models: the tokens the busiest expert receives over the mean (the capacity "
             "factor of GShard and Switch Transformer, Fedus et al. 2022 §2.2); it sets the expert GEMMs and the "
             "all-to-all volume. 1.0 is perfect balance, Megatron-LM's dropless best case; 1.25 is Switch "
             "Transformer's usual setting. A setting of the problem, not searched; dense models ignore it.",
    )(with_kernels)
    with_kernels = click.option(
        "--grad-datatype", type=click.Choice(GRAD_DATATYPES), default="float32", show_default=True,
        help="How gradients are kept: float32 main gradients (Megatron-LM) or 16bit, in the compute type "
             "(DeepSpeed, the ZeRO paper). A setting of the problem, not searched: it changes what training "
             "computes, not only how fast.",
    )(with_kernels)
    return click.option(
        "--attention", type=click.Choice(ATTENTION_KERNELS), default="fused", show_default=True,
        help="Attention core: one FlashAttention kernel (fused), or four kernels passing the s×s scores "
             "through HBM (unfused: Megatron-LM 2022, Calculon).")(with_kernels)


def space_options(func: Callable | None = None, *, counting: bool = False) -> Callable:
    """--gpus N [--max-batch B | --batch B | --batch-tokens T] [--space NAME] [--fix DIM=V,...]
    [--attention fused|unfused] [--grad-datatype float32|16bit] (these two as one `kernels`).
    Counting (closed form) takes any 64-bit N and B; searching commands (solve, brute,
    explain) stop at the search bounds."""
    if func is None:
        return functools.partial(space_options, counting=counting)
    gpus = limits.GPUS_COUNT if counting else limits.GPUS_SEARCH
    max_batch = limits.MAX_BATCH_COUNT if counting else limits.MAX_BATCH_SEARCH
    options = [
        click.option("--gpus", "num_gpus", required=True, type=BoundedInt(gpus),
                     help="Number of GPUs, N (tp·cp·pp·dp = N; ep divides dp·cp)."),
        click.option("--max-batch", type=BoundedInt(max_batch), default=None,
                     help="Cap on the global batch, in sequences: each split takes the largest multiple of dp "
                          "under it. Default: the largest power of two of sequences within 2^24 = 16.8M tokens "
                          "(the Llama 3 paper's batch), at most 3,072 (2,048 at 8K tokens, 128 at 131K); "
                          "3,072 in the paper spaces (calculon-2023, calculon-current)."),
        click.option("--batch", type=BoundedInt(max_batch), default=None,
                     help="Fix the global batch, in sequences (only splits whose dp divides it remain)."),
        click.option("--batch-tokens", type=BoundedInt(limits.GPUS_COUNT), default=None,
                     help="Fix the global batch in tokens (a whole number of sequences, e.g. 16777216)."),
        click.option("--space", "space_name", type=click.Choice(list(SPACES)), default=DEFAULT_SPACE,
                     show_default=True, help="Named mapping space (see `mapsat spaces`)."),
        click.option("--fix", "fix", multiple=True, metavar="DIM=VALUE[,VALUE...]",
                     help="Keep only mappings whose dimension DIM takes one of these values, e.g. --fix tp=8 "
                          "--fix recompute=full,none (repeatable; dimensions: `mapsat spaces`)."),
    ]
    func = kernel_options(func)
    for option in reversed(options):
        func = option(func)
    return func


def space_and_cap(space_name: str, fix: tuple[str, ...], max_batch: int, batch: int | None,
                  batch_tokens: int | None, model: Model, system: System, num_gpus: int) -> tuple[Space, int]:
    """The named space with the --fix pins and a fixed batch applied, and the batch cap; a pin
    no mapping of the problem can take is refused here, before any search."""
    ctx = click.get_current_context()
    given = max_batch is not None
    ctx.meta["mapsat.batch_source"] = "given" if given else "default"
    if not given:
        max_batch = default_batch_cap(model.seq_size, space_name)
    batch_type = next(param.type for param in ctx.command.params if param.name == "batch")
    cap, batch_pins = batch_cap(max_batch, batch, batch_tokens, model.seq_size, given, batch_type.bound)
    space = get_space(space_name)
    pins = parse_pins(fix)
    check_pins(pins, model, system, num_gpus, space)
    return pinned(space, pins + batch_pins), cap


def batch_header(space: Space, cap: int, model: Model) -> str:
    """The global batch as a header states it (solver.space.pins.batch_text), after space_and_cap."""
    ctx = click.get_current_context()
    return batch_text(cap, model.seq_size, space, ctx.meta.get("mapsat.batch_source", "given"))


class DatatypeChoice(click.Choice):
    """--datatype's choice: a short name (fp8, bf16) is refused with the option that means it."""

    def convert(self, value, param, ctx):
        hint = datatype_hint(value, "--datatype", "--precision")
        if hint is not None and value not in self.choices:
            self.fail(f"unknown datatype {value!r}: {hint}", param, ctx)
        return super().convert(value, param, ctx)


def datatype_option(func: Callable) -> Callable:
    """--datatype D."""
    return click.option("--datatype", type=DatatypeChoice([d.value for d in Datatype]), default=Datatype.bfloat16.value,
                        show_default=True, help="Compute datatype; the system must list it. With --precision, "
                                                "leave it at bfloat16: the recipe decides what is quantized.")(func)
