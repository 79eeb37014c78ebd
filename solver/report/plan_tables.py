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


COUNT_COLUMNS = ("", "GPUs", "days", "GPU-hours", "cost", "energy MWh", "goodput", "MTBF h", "interrupts", "MFU",
                 "certified")
DROPPED_FIRST = ("energy MWh", "MTBF h", "interrupts", "goodput", "certified", "cost")
"""The columns a narrow terminal loses, first to last; GPUs, days, GPU-hours and MFU stay."""


def _count_cells(row: CountPlan, chosen: CountPlan | None) -> list[str]:
    mark = "*" if chosen is not None and row.num_gpus == chosen.num_gpus else ""
    if not row.feasible:
        return [mark, f"{row.num_gpus:,}", "no answer" if row.unanswered else "infeasible", *["-"] * 8]
    c, f = row.cost, row.failures
    certified = all(p.result.certified_optimal for p in row.phases)
    return [mark, f"{row.num_gpus:,}", f"{c.wall_days:,.1f}", gpu_hours_text(c.gpu_hours), _money(c.cost_usd),
            _mwh(c.energy_j), f"{f.goodput:.1%}", "inf" if math.isinf(f.mtbf_s) else f"{f.mtbf_s / SECONDS_PER_HOUR:.2f}",
            f"{c.interruptions:,.0f}", f"{row.mfu:.1%}", "yes" if certified else "NO"]


def gpu_hours_text(gpu_hours: float) -> str:
    """GPU-hours as people write them: 27,100 below a million, 1.23M above."""
    return f"{gpu_hours / 1e6:,.2f}M" if gpu_hours >= 1e6 else f"{gpu_hours:,.0f}"


def counts_table(result: PlanResult, width: int | None = None) -> tuple[Table, list[str]]:
    """A row per GPU count, the chosen one marked with *; columns no count fills ("-") left out,
    and to fit `width` (None: all) the columns of DROPPED_FIRST in turn. The table and the
    headers left out for width."""
    rows = [_count_cells(row, result.choice.plan) for row in result.counts]
    kept = [i for i, header in enumerate(COUNT_COLUMNS)
            if header in ("", "GPUs", "days") or any(r[i] != "-" for r in rows)]
    dropped: list[str] = []

    def build() -> Table:
        table = Table(title="Per GPU count (days and GPU-hours include failures and checkpoints)",
                      title_justify="left", box=box.SIMPLE_HEAD)
        for i in kept:
            table.add_column(COUNT_COLUMNS[i], justify="right", no_wrap=True)
        for r in rows:
            table.add_row(*(r[i] for i in kept))
        return table

    table = build()
    for header in DROPPED_FIRST:
        if width is None or _table_width(table) <= width:
            break
        if COUNT_COLUMNS.index(header) in kept:
            kept.remove(COUNT_COLUMNS.index(header))
            dropped.append(header)
            table = build()
    peaks = {f"{p.result.best.throughput.peak_name} {p.result.best.throughput.peak_tflops:,.0f} TFLOP/s"
             for row in result.counts if row.feasible for p in row.phases if p.result.best.throughput is not None}
    if peaks:
        table.caption = f"MFU of the {'; '.join(sorted(peaks))}"
        table.caption_justify = "left"
    return table, dropped


def _table_width(table: Table) -> int:
    """The columns `table` takes at its natural width."""
    console = Console(width=10_000)
    return console.measure(table).maximum


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


NEAREST = "; nearest batches that work: "


def reasons_once(rows: list[CountPlan]) -> list[tuple[str, str]]:
    """Each infeasible count's reason once, with the counts it applies to ("24, 40 GPUs"); the
    nearest batches, which differ by count, after it by count."""
    by_reason: dict[str, list[tuple[int, str]]] = {}
    for row in rows:
        if not row.feasible:
            said = (row.reason or "no feasible mapping").replace(f" of {row.num_gpus:,} GPUs", "")
            reason, _, nearest = said.partition(NEAREST)
            by_reason.setdefault(reason, []).append((row.num_gpus, nearest))
    out = []
    for reason, counts in by_reason.items():
        nearest = "; ".join(f"{n:,} GPUs {batches}" for n, batches in counts if batches)
        out.append((", ".join(f"{n:,}" for n, _ in counts) + " GPUs",
                    reason + (f" (nearest batches that work: {nearest})" if nearest else "")))
    return out


def print_plan(result: PlanResult, title: str, out: Console, wide: bool = False, band: str | None = None) -> None:
    partial = ("" if result.interrupted_at is None else
               f" (partial: interrupted by Ctrl-C at {result.interrupted_at:,} GPUs)")
    out.print(f"{title}: {len(result.counts)} GPU counts planned in {result.seconds:.1f} s{partial}")
    table, dropped = counts_table(result, None if wide else out.width)
    out.print(table)
    if dropped:
        out.print(f"  (left out at {out.width} columns: {', '.join(dropped)}; --wide shows them)")
    for counts, reason in reasons_once(result.counts):
        out.print(f"  {counts}: {reason}")
    choice = result.choice
    if choice.plan is None:
        out.print(f"chosen: none ({choice.rule})")
        return
    row = choice.plan
    c = row.cost
    money = "" if c.cost_usd is None else f", {_money(c.cost_usd)}"
    out.print(f"chosen ({choice.rule}): {row.num_gpus:,} GPUs, {c.wall_days:.1f} days, "
              f"{gpu_hours_text(c.gpu_hours)} GPU-hours{money}, {c.interruptions:.0f} expected interruptions")
    if band is not None:
        out.print(f"  {band}")
    out.print(phases_table(row))
    for p in row.phases:
        best = p.result.best
        lead = throughput_lead(best.throughput.to_dict() if best.throughput else None, best.mfu)
        out.print(f"  {p.phase.name}: {lead}")
        out.print(f"    {mapping_summary(best.mapping.model_dump(mode='json'))}")
    for line in failure_lines(row, result.state_bytes, result.settings.async_checkpoint):
        out.print(line)
