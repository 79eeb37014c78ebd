"""`mapsat shape`: candidate model shapes near a parameter count, by the paper's rule, with
their mapping counts and (given a system) their solved MFU."""

from __future__ import annotations

import json

import click
from rich.table import Table

from costmodel.errors import InputError
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
import costmodel.inputs.limits as limits
from costmodel.inputs.limits import Bound
from solver.cli.options import (progress_line, quiet_option, given_headroom, BoundedFloat, BoundedInt, datatype_option, kernel_options, system_override_options,
                                user_errors, wide_console)
from solver.report.tables import mapping_summary
from solver.study.shape import (ASPECT_INTERCEPT, ASPECT_POINTS, ASPECT_SLOPE, BLOCKS_STEP, SEQ_SIZE, VOCAB_SIZE,
                          ShapeAssessment, aspect_ratio, assess_shapes, candidate_shapes, rule_shape, write_shapes)
from solver.space.declaration import SPACES
from solver.space.pins import default_batch_cap

SPREAD = Bound(0, 1024, "block counts listed either side of the rule's")


def _int_list(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of whole numbers") from None
    if not numbers or any(n <= 0 for n in numbers):
        raise click.BadParameter(f"{value!r}: give positive block counts, e.g. 254,256")
    return numbers


def _positive_params(ctx, param, values: tuple[float, ...]) -> tuple[float, ...]:
    for value in values:
        if not value > 0 or value != value or value == float("inf"):
            raise click.BadParameter(f"{value!r} must be a positive number of parameters, e.g. 1.1e12")
        if limits.PARAMS.problem(value):
            raise click.BadParameter(f"{value:g} is {limits.PARAMS.problem(value)}")
    return values


@click.command(name="shape")
@click.option("--params", "targets", required=True, multiple=True, type=float, callback=_positive_params,
              help="Target parameter count, e.g. 1.1e12 (repeatable).")
@click.option("--blocks", callback=_int_list, default=None,
              help="Block counts to compare, comma-separated (default: the rule's ± --spread and the nearest power of 2).")
@click.option("--heads", type=BoundedInt(limits.ATTN_HEADS), default=None, help="Attention heads (default: = blocks).")
@click.option("--spread", type=BoundedInt(SPREAD), default=4, show_default=True,
              help="Block counts this far either side of the rule's are listed.")
@click.option("--blocks-step", type=BoundedInt(limits.NUM_BLOCKS), default=BLOCKS_STEP, show_default=True,
              help="The rule rounds blocks to a multiple of this.")
@click.option("--rule-only", is_flag=True, help="List only the rule's shape for each target.")
@click.option("--seq-size", type=BoundedInt(limits.SEQ_SIZE), default=SEQ_SIZE, show_default=True, help="Sequence length.")
@click.option("--vocab-size", type=BoundedInt(limits.VOCAB_SIZE), default=VOCAB_SIZE, show_default=True, help="Vocabulary.")
@click.option("--gpus", "num_gpus", type=BoundedInt(limits.GPUS_COUNT), default=None,
              help="Count each shape's mappings on this many GPUs (and solve it when --system is given).")
@click.option("--system", "system_path", type=click.Path(dir_okay=False), default=None,
              help="System file: solve each shape on --gpus GPUs and show its MFU.")
@system_override_options
@click.option("--max-batch", type=BoundedInt(limits.MAX_BATCH_COUNT), default=None,
              help="Global batch cap, sequences (default: 3,072 in the paper spaces; else the largest power of two "
                   "within 2^24 tokens, at most 3,072, as every searching command).")
@click.option("--space", "space_name", type=click.Choice(list(SPACES)), default="calculon-2023", show_default=True,
              help="Mapping space for counts and solves (calculon-2023 reproduces the paper's counts).")
@kernel_options
@datatype_option
@click.option("--time-limit", "time_limit_s", type=BoundedFloat(limits.TIME_LIMIT_S, low_open=0), default=60.0,
              show_default=True, help="Solver time limit per shape, seconds.")
@click.option("--write", "write_dir", type=click.Path(file_okay=False), default=None,
              help="Write each listed shape as a model file <name>.yaml into this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@quiet_option
@user_errors
def command(targets: tuple[float, ...], blocks: list[int] | None, heads: int | None, spread: int, blocks_step: int,
            rule_only: bool, seq_size: int, vocab_size: int, num_gpus: int | None, system_path: str | None,
            hbm_gib: float | None, offload_gib: float | None, offload_gbps: float | None, nvlink_size: int | None,
            max_batch: int | None, space_name: str, kernels: Kernels, datatype: str, time_limit_s: float, write_dir: str | None,
            as_json: bool) -> None:
    """List model shapes near a parameter count by the paper's rule, with mapping counts.

    The rule: sequence 8192, feed-forward 4 × hidden, heads = blocks unless --heads is
    given, hidden in steps of 1024, and hidden/blocks from a log-linear fit of published
    models (solver/study/shape.py, docs/paper-reproduction.md). With --gpus each shape's
    mappings are counted; with --system too, each is solved for its best MFU — one table
    showing why block and head counts that are powers of two map better.

    \b
    Examples:
      mapsat shape --params 1.1e12 --gpus 4096
      mapsat shape --params 1.04e12 --blocks 254,256 --heads 256 --gpus 4096 \\
                   --system problems/systems/h100-80g-nvl8.yaml --datatype float8 \\
                   --offload-gib 256 --offload-gbps 100
      mapsat shape --params 1e12 --params 128e12 --rule-only --write problems/paper/models
    """
    if system_path is not None and num_gpus is None:
        raise click.UsageError("--system needs --gpus (how many GPUs to solve each shape on)")
    for option, value, bound in (("--gpus", num_gpus, limits.GPUS_SEARCH), ("--max-batch", max_batch,
                                                                            limits.MAX_BATCH_SEARCH)):
        if system_path is not None and value is not None and bound.problem(value):
            raise click.BadParameter(f"{value} is {bound.problem(value)} (--system solves each shape)",
                                     param_hint=f"'{option}'")
    if max_batch is None:
        max_batch = default_batch_cap(seq_size, space_name)
    system = None
    if system_path is not None:
        system = load_system(system_path).with_overrides(hbm_gib=hbm_gib, offload_gib=offload_gib,
                                                         offload_gbps=offload_gbps, nvlink_size=nvlink_size
                                                         ).with_headroom(given_headroom())
    elif any(v is not None for v in (hbm_gib, offload_gib, offload_gbps, nvlink_size, given_headroom())):
        raise InputError("--hbm-gib/--offload-gib/--offload-gbps/--nvlink-size/--hbm-headroom change a system: give "
                         "--system too")
    shapes = []
    for target in targets:
        if rule_only:
            shapes.append(rule_shape(target, heads=heads, blocks_step=blocks_step, seq_size=seq_size,
                                     vocab_size=vocab_size))
        else:
            shapes += candidate_shapes(target, blocks=blocks, heads=heads, spread=spread, blocks_step=blocks_step,
                                       seq_size=seq_size, vocab_size=vocab_size)
    with progress_line() as say:
        say(f"shape: {len(shapes)} shapes{', each solved' if system is not None else ''}")
        rows = assess_shapes(shapes, gpus=num_gpus, system=system, max_batch=max_batch, space=space_name,
                             kernels=kernels, datatype=datatype, time_limit_s=time_limit_s)
    written = write_shapes(shapes, write_dir) if write_dir else []
    if as_json:
        document = {"targets": list(targets), "aspect_fit": {"intercept": ASPECT_INTERCEPT, "slope_per_decade": ASPECT_SLOPE,
                                                             "points": [p.__dict__ for p in ASPECT_POINTS]},
                    "space": space_name, "attention": kernels.attention, "grad_datatype": kernels.grad_datatype,
                    **kernels.precision_record, "shapes": [r.to_dict() for r in rows],
                    "written": [str(p) for p in written]}
        click.echo(json.dumps(document, indent=2))
        return
    print_shapes(rows, targets, f"{system.name}, {kernels.label}" if system else None, space_name)
    for path in written:
        click.echo(f"wrote {path}")


def print_shapes(rows: list[ShapeAssessment], targets: tuple[float, ...], system_name: str | None, space: str) -> None:
    console = wide_console()
    fits = ", ".join(f"{t:.3g} → {aspect_ratio(t):.0f}" if aspect_ratio(t) > 0 else f"{t:.3g}: below the fit's range"
                     for t in targets)
    console.print(f"aspect ratio hidden/blocks = {ASPECT_INTERCEPT:.1f} + {ASPECT_SLOPE:.2f}·log10(params) "
                  f"(fit through {', '.join(p.name for p in ASPECT_POINTS)}): {fits}")
    counted = any(r.gpus is not None for r in rows)
    solved_any = any(r.solved is not None for r in rows)
    table = Table(title_justify="left", title="Candidate shapes (* = the rule's" + (f"; mappings in space {space}" if counted
                  else "") + (f"; MFU on {system_name}" if solved_any else "") + ")")
    headers = ["", "blocks", "hidden", "heads", "head size", "parameters", "vs target", "aspect"]
    headers += ["GPUs", "mappings"] if counted else []
    headers += ["MFU", "status", "best mapping"] if solved_any else []
    for header in headers:
        table.add_column(header, justify="left" if header in ("", "status", "best mapping") else "right")
    for row in rows:
        s, m = row.shape, row.shape.model
        head = f"{m.attn_size}" + ("" if s.heads_divide_hidden else "~")
        cells = ["*" if s.rule else "", str(m.num_blocks), f"{m.hidden:,}", str(m.attn_heads), head,
                 f"{s.params:.4g}", f"{s.params_error:+.1%}", f"{s.aspect:.0f}"]
        if counted:
            cells += [f"{row.gpus:,}", f"{row.mappings:,}"]
        if solved_any:
            solved = row.solved or {}
            cells += [f"{solved['mfu']:.1%}" if solved.get("mfu") is not None else "-", solved.get("status", ""),
                      mapping_summary(solved["mapping"]) if solved.get("mapping") else ""]
        table.add_row(*cells)
    console.print(table)
    if any(not r.shape.heads_divide_hidden for r in rows):
        console.print("~ heads do not divide hidden: the head size is rounded (heads × head size ≠ hidden).")
