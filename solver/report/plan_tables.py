"""What `mapsat plan` prints: a row per GPU count (days, GPU-hours, cost, goodput,
interruptions, MFU), the chosen count's phases and failure terms, and the JSON document.
Units convert here: days, hours, MWh, GB, minutes."""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.table import Table

from costmodel.terms.training_cost import SECONDS_PER_DAY, SECONDS_PER_HOUR
from solver.report.tables import mapping_summary, throughput_lead
from solver.search.plan import CountPlan, PlanResult

JOULES_PER_MWH = 3.6e9


def _money(usd: float | None) -> str:
    if usd is None:
        return "-"
    return f"${usd / 1e6:,.2f}M" if usd >= 1e6 else f"${usd:,.0f}"


def _mwh(joules: float | None) -> str:
    return "-" if joules is None else f"{joules / JOULES_PER_MWH:,.0f}"


def counts_table(result: PlanResult) -> Table:
    """A row per GPU count; the chosen one marked with *. At most 120 columns wide."""
    table = Table(title="Per GPU count (days and GPU-hours include failures and checkpoints)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for header in ("", "GPUs", "days", "GPU-hours", "cost", "energy MWh", "goodput", "MTBF h", "interrupts",
                   "MFU", "certified"):
        table.add_column(header, justify="right")
    chosen = result.choice.plan
    for row in result.counts:
        mark = "*" if chosen is not None and row.num_gpus == chosen.num_gpus else ""
        if not row.feasible:
            table.add_row(mark, f"{row.num_gpus:,}", "infeasible", *["-"] * 8)
            continue
        c, f = row.cost, row.failures
        certified = all(p.result.certified_optimal for p in row.phases)
        table.add_row(mark, f"{row.num_gpus:,}", f"{c.wall_days:,.1f}", f"{c.gpu_hours / 1e6:,.3f}M",
                      _money(c.cost_usd), _mwh(c.energy_j), f"{f.goodput:.1%}",
                      "inf" if math.isinf(f.mtbf_s) else f"{f.mtbf_s / SECONDS_PER_HOUR:.2f}",
                      f"{c.interruptions:,.0f}", f"{row.mfu:.1%}", "yes" if certified else "NO")
    peaks = {f"{p.result.best.throughput.peak_name} {p.result.best.throughput.peak_tflops:,.0f} TFLOP/s"
             for row in result.counts if row.feasible for p in row.phases if p.result.best.throughput is not None}
    if peaks:
        table.caption = f"MFU of the {'; '.join(sorted(peaks))}"
        table.caption_justify = "left"
    return table


def phases_table(row: CountPlan) -> Table:
    table = Table(title=f"Phases at {row.num_gpus:,} GPUs (days without failures)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for header in ("phase", "tokens", "seq", "batch", "steps", "iteration s", "days", "MFU"):
        table.add_column(header, justify="left" if header == "phase" else "right")
    for p in row.phases:
        best = p.result.best
        if best is None:
            table.add_row(p.phase.name, f"{p.phase.tokens:.4g}", f"{p.phase.seq_size:,}", "-", "-", "-", "-", "-")
            continue
        table.add_row(p.phase.name, f"{p.phase.tokens:.4g}", f"{p.phase.seq_size:,}", f"{best.mapping.batch_size:,}",
                      f"{p.steps:,.0f}", f"{best.iteration_time_s:.3f}", f"{p.compute_s / SECONDS_PER_DAY:.2f}",
                      f"{best.mfu:.1%}")
    return table


def failure_lines(row: CountPlan, state_bytes: float, async_checkpoint: bool) -> list[str]:
    f = row.failures
    how = ("asynchronous: stall = the snapshot to host memory; the write runs in the background"
           if async_checkpoint else "synchronous: stall = the write to storage")
    return [(f"checkpoint: {state_bytes / 1e12:.2f} TB (weights + fp32 master and Adam moments), write "
            f"{f.checkpoint_write_s:.1f} s, stall {f.checkpoint_stall_s:.2f} s ({how})"),
            (f"failures: {f.failure_rate_per_gpu_hour:.3g} per GPU-hour -> job MTBF {f.mtbf_s / SECONDS_PER_HOUR:.2f} h; "
            f"Young interval {f.interval_s / 60:.1f} min; restart {f.restart_s / 60:g} min; lost "
            f"{f.lost_fraction:.2%} -> goodput {f.goodput:.2%}")]


def print_plan(result: PlanResult, title: str, out: Console) -> None:
    out.print(f"{title}: {len(result.counts)} GPU counts planned in {result.seconds:.1f} s")
    out.print(counts_table(result))
    for row in result.counts:
        if not row.feasible:
            out.print(f"  {row.num_gpus:,} GPUs: {row.reason}")
    choice = result.choice
    if choice.plan is None:
        out.print(f"chosen: none ({choice.rule})")
        return
    row = choice.plan
    c = row.cost
    out.print(f"chosen ({choice.rule}): {row.num_gpus:,} GPUs, {c.wall_days:.1f} days, "
              f"{c.gpu_hours / 1e6:.3f}M GPU-hours, {_money(c.cost_usd)}, {c.interruptions:.0f} expected interruptions")
    out.print(phases_table(row))
    for p in row.phases:
        best = p.result.best
        lead = throughput_lead(best.throughput.to_dict() if best.throughput else None, best.mfu)
        out.print(f"  {p.phase.name}: {lead}")
        out.print(f"    {mapping_summary(best.mapping.model_dump(mode='json'))}")
    for line in failure_lines(row, result.state_bytes, result.settings.async_checkpoint):
        out.print(line)
