"""mapsat plan: how many GPUs and how long to train a model on T tokens, with failures and cost."""

from __future__ import annotations

import dataclasses
import sys

import click

import costmodel.inputs.limits as limits
from costmodel.errors import InputError, MapsatError
from costmodel.inputs.system import Datatype
from costmodel.terms.training_cost import (DEFAULT_CHECKPOINT_GBPS, DEFAULT_PUE, DEFAULT_RESTART_MINUTES,
                                     DEFAULT_SNAPSHOT_GBPS, LLAMA3_FAILURE_RATE_PER_GPU_HOUR)
from solver.cli.options import (BoundedFloat, BoundedInt, datatype_option, kernel_options, load_problem,
                                problem_options, progress_line, system_label, user_errors, wide_console,
                                wide_option)
from solver.cli.emit import echo_plan_emitted, emit_options
from solver.report.bands import plan_band, plan_band_line
from solver.report.documents import dumps, plan_document
from solver.search.nearest import smallest_fitting_count
from solver.search.plan import (TOKENS, Phase, Settings, Target, check_buyable, load_phases, parse_counts, plan,
                                plan_count)
from solver.search.solve import SolverConfig
from solver.space.declaration import DEFAULT_SPACE, SPACES, get_space
from solver.space.pins import parse_pins

POSITIVE = limits.Bound(1e-12, 1e18, "a positive amount")
RATE = limits.Bound(0.0, 1.0, "failures per GPU-hour: 0 (none) to one an hour per GPU")


def _phases(phases_path, tokens, seq_size, batch, batch_tokens, model_seq) -> list[Phase]:
    """The phases file's phases, or one phase of --tokens at the model's sequence and --batch."""
    if phases_path is not None:
        if batch is not None or batch_tokens is not None:
            raise InputError("--phases: each phase states its batch; leave out --batch and --batch-tokens")
        phases = load_phases(phases_path)
        total = sum(p.tokens for p in phases)
        if tokens is not None and abs(total - tokens) > 1e-9 * tokens:
            raise InputError(f"--tokens {tokens:g}: the phases of {phases_path} sum to {total:g} tokens; "
                             f"give one of them, or make them agree")
        return phases
    if tokens is None:
        raise InputError("--tokens: required without --phases (the tokens to train, e.g. 15.6e12)")
    try:
        return [Phase(name="all", tokens=tokens, seq_size=seq_size or model_seq, batch=batch,
                      batch_tokens=batch_tokens)]
    except ValueError as err:
        raise InputError(f"--batch/--batch-tokens: {err.errors()[0]['msg']}") from None


@click.command("plan")
@problem_options
@click.option("--gpus", "gpus_text", default=None, metavar="N|N,N,...|LOW-HIGH[:STEP]",
              help="GPU counts to plan for: one, a list, or a range (STEP default: the NVLink domain). "
                   "Without it: --min-gpus to --max-gpus every --gpu-step.")
@click.option("--min-gpus", type=BoundedInt(limits.GPUS_SEARCH), default=None,
              help="Without --gpus: the smallest count (default: one NVLink domain).")
@click.option("--max-gpus", type=BoundedInt(limits.GPUS_SEARCH), default=None,
              help="Without --gpus: the largest count.")
@click.option("--gpu-step", type=BoundedInt(limits.GPUS_SEARCH), default=None,
              help="Without --gpus: the step between counts (default: one NVLink domain).")
@click.option("--tokens", type=BoundedFloat(TOKENS), default=None, help="Tokens to train (e.g. 15.6e12).")
@click.option("--phases", "phases_path", type=click.Path(dir_okay=False), default=None,
              help="YAML/JSON file of training phases (tokens, seq_size, batch or batch_tokens; docs/plan.md).")
@click.option("--max-batch", type=BoundedInt(limits.MAX_BATCH_SEARCH), default=3072, show_default=True,
              help="Without a fixed batch: cap on the global batch, sequences.")
@click.option("--batch", type=BoundedInt(limits.MAX_BATCH_SEARCH), default=None,
              help="Fix the global batch, sequences (without --phases).")
@click.option("--batch-tokens", type=BoundedInt(limits.GPUS_COUNT), default=None,
              help="Fix the global batch, tokens (without --phases).")
@click.option("--space", "space_name", type=click.Choice(list(SPACES)), default=DEFAULT_SPACE, show_default=True,
              help="Named mapping space (see `mapsat spaces`).")
@click.option("--fix", "fix", multiple=True, metavar="DIM=VALUE[,VALUE...]",
              help="Keep only mappings whose dimension DIM takes one of these values (repeatable).")
@kernel_options
@datatype_option
@click.option("--days", "deadline_days", type=BoundedFloat(POSITIVE), default=None,
              help="Deadline, days: choose the cheapest count that meets it.")
@click.option("--budget", "budget_usd", type=BoundedFloat(POSITIVE), default=None,
              help="Budget, USD (needs --gpu-hour-price): choose the fastest count within it.")
@click.option("--gpu-hour-price", type=BoundedFloat(POSITIVE), default=None, help="Price of one GPU-hour, USD.")
@click.option("--failure-rate", type=BoundedFloat(RATE), default=LLAMA3_FAILURE_RATE_PER_GPU_HOUR,
              show_default="1.97e-5: Llama 3's 419 unexpected interruptions / (54 d · 24 h · 16,384 GPUs)",
              help="Unexpected interruptions per GPU-hour.")
@click.option("--checkpoint-gbps", type=BoundedFloat(limits.BANDWIDTH_GBPS), default=DEFAULT_CHECKPOINT_GBPS,
              show_default="2000: Llama 3's storage, 2 TB/s sustained", help="Aggregate checkpoint write bandwidth, GB/s.")
@click.option("--async-checkpoint", is_flag=True,
              help="Training stalls only for each GPU's snapshot to host memory; the write runs in the background.")
@click.option("--snapshot-gbps", type=BoundedFloat(limits.BANDWIDTH_GBPS), default=DEFAULT_SNAPSHOT_GBPS,
              show_default=True, help="With --async-checkpoint: per-GPU copy bandwidth to host memory, GB/s.")
@click.option("--restart-minutes", type=BoundedFloat(limits.Bound(0.0, 1e6, "minutes")),
              default=DEFAULT_RESTART_MINUTES, show_default="10 (an assumption)",
              help="Time from an interruption to training again, minutes.")
@click.option("--gpu-power-w", type=BoundedFloat(limits.Bound(1.0, 1e5, "watts per GPU")), default=None,
              help="Power per GPU, W, for energy (system files state none; an H100 SXM's TDP is 700 W).")
@click.option("--pue", type=BoundedFloat(limits.Bound(1.0, 10.0, "facility power over IT power")),
              default=DEFAULT_PUE, show_default=True, help="Facility power usage effectiveness (1.0: GPUs alone).")
@click.option("--time-limit", "time_limit_s", type=BoundedFloat(limits.TIME_LIMIT_S, low_open=0), default=120.0,
              show_default=True, help="Wall-clock limit per (count, phase) solve, s.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw days against GPUs and against cost (GPU-hours without a price), the chosen point marked.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of tables.")
@wide_option
@emit_options
@user_errors
def command(model_path, system_path, seq_size, hbm_gib, offload_gib, offload_gbps, nvlink_size, gpus_text, min_gpus,
            max_gpus, gpu_step, tokens, phases_path, max_batch, batch, batch_tokens, space_name, fix, kernels,
            datatype, deadline_days, budget_usd, gpu_hour_price, failure_rate, checkpoint_gbps, async_checkpoint,
            snapshot_gbps, restart_minutes, gpu_power_w, pue, time_limit_s, plot_path, as_json, wide, emit,
            lossy):
    """Plan a whole training run: GPUs, days, GPU-hours, failures and cost.

    For every GPU count (whole NVLink domains) and every training phase, the certified best
    mapping (as `mapsat solve`), its steps, wall-clock days with failures and checkpoints
    (Young's interval), GPU-hours, expected interruptions, energy and cost; then the count a
    deadline (--days: cheapest meeting it) or a budget (--budget: fastest within it) picks.
    Every count is solved: time against GPUs is jagged (docs/plan.md).

    \b
    Example:
      mapsat plan --model problems/models/llama-3.1-70b/config.json --seq-size 8192 \\
                  --system problems/systems/h100-80g-nvl8.yaml --tokens 15e12 \\
                  --batch-tokens 16777216 --gpus 1024-4096:1024 --days 90
    """
    if budget_usd is not None and gpu_hour_price is None:
        raise InputError("--budget: give --gpu-hour-price too (the price of one GPU-hour, USD)")
    if plot_path is not None:
        from solver.report.figure import image_path

        plot_path = image_path(plot_path, "--plot")
    first_seq = seq_size
    if first_seq is None and phases_path is not None:
        first_seq = load_phases(phases_path)[0].seq_size
    model, system = load_problem(model_path, system_path, hbm_gib, offload_gib, offload_gbps, nvlink_size,
                                 seq_size=first_seq)
    phases = _phases(phases_path, tokens, seq_size, batch, batch_tokens, model.seq_size)
    domain, domain_name = system.networks[0].size, system.networks[0].name
    if gpus_text is not None:
        if min_gpus is not None or max_gpus is not None or gpu_step is not None:
            raise InputError("--gpus: give the counts or --min-gpus/--max-gpus/--gpu-step, not both")
        counts = parse_counts(gpus_text, domain)
    elif max_gpus is None:
        raise InputError("--gpus or --max-gpus: say which GPU counts to plan for")
    else:
        low = min_gpus or domain
        counts = parse_counts(f"{low}-{max_gpus}:{gpu_step or domain}", domain, option="--max-gpus")
    if not counts:
        raise InputError(f"--min-gpus {min_gpus} --max-gpus {max_gpus}: no count between them")
    check_buyable(counts, domain, domain_name)
    settings = Settings(failure_rate, checkpoint_gbps, async_checkpoint, snapshot_gbps, restart_minutes,
                        gpu_power_w, pue, gpu_hour_price)
    target = Target(deadline_days, budget_usd)
    solve_args = dict(max_batch=max_batch, space=get_space(space_name), pins=parse_pins(fix),
                      datatype=Datatype(datatype), kernels=kernels, config=SolverConfig(time_limit_s=time_limit_s, top_k=1))
    with progress_line() as say:
        result = plan(model, system, counts, phases, settings, target, progress=say, **solve_args)
        fitting = None
        if result.interrupted_at is None and not any(row.feasible for row in result.counts):
            say("finding the smallest GPU count that fits")
            fitting = _smallest_fitting(model, system, result, phases, settings, time_limit_s, solve_args)
    label = system_label(system, hbm_gib, offload_gib, offload_gbps, nvlink_size)
    title = f"{model.name} on {label}, {datatype}, {kernels.label}, {sum(p.tokens for p in phases):.4g} tokens"
    if plot_path is not None:
        from solver.report.plan_plot import plot_plan

        plot_plan(result, plot_path, title)
    if emit:
        echo_plan_emitted(result, model, system, emit, lossy)
    elif as_json:
        click.echo(dumps({**plan_document(result), "error_band": plan_band(model, system, result)}))
    else:
        from solver.report.plan_tables import print_plan     # (rich: only for tables)

        print_plan(result, title, wide_console(wide), wide, plan_band_line(plan_band(model, system, result)))
    if result.interrupted_at is not None:
        click.echo(f"interrupted (Ctrl-C) at {result.interrupted_at:,} GPUs: a partial plan of the "
                   f"{len(result.counts)} of {len(counts)} counts planned before it", err=True)
        sys.exit(130)
    if result.choice.plan is None:
        domain = system.networks[0]
        fits = ("" if fitting is None else f"; the smallest GPU count that fits, in whole {domain.name} domains of "
                                           f"{domain.size} or a part of one: {fitting:,} (--gpus {fitting})")
        raise MapsatError(result.choice.message + fits)


def _smallest_fitting(model, system, result, phases, settings, time_limit_s: float, solve_args: dict) -> int | None:
    """Above the largest count planned, the smallest buyable one whose every phase fits
    (solver.search.nearest), when memory is what rules the largest out."""
    largest = result.counts[-1]
    reasons = [reason for p in largest.phases for reason in p.result.infeasible_reasons]

    def fits(count: int, left_s: float) -> bool:
        args = {**solve_args, "config": dataclasses.replace(solve_args["config"], time_limit_s=left_s)}
        return plan_count(model, system, count, phases, result.state_bytes, settings, **args).feasible

    return smallest_fitting_count(largest.num_gpus, reasons, system.networks[0].size, fits, time_limit_s)
