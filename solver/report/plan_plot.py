"""The picture of `mapsat plan --plot`: days against GPU count, and days against cost
(GPU-hours without a price), the chosen count marked, the deadline and budget drawn."""

from __future__ import annotations

from pathlib import Path

from solver.report.figure import pyplot, save
from solver.search.plan import PlanResult


def plot_plan(result: PlanResult, path: str | Path, title: str) -> Path:
    plt = pyplot()
    rows = [r for r in result.counts if r.feasible]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    priced = result.settings.gpu_hour_price_usd is not None
    gpus = [r.num_gpus for r in rows]
    days = [r.cost.wall_days for r in rows]
    spend = [r.cost.cost_usd / 1e6 if priced else r.cost.gpu_hours / 1e6 for r in rows]
    left.plot(gpus, days, marker="o")
    right.plot(spend, days, linestyle="none", marker="o")
    front = _pareto(list(zip(spend, days)))
    if front:
        right.plot(*zip(*front), color="tab:blue", linewidth=0.8)
    chosen = result.choice.plan
    if chosen is not None:
        spent = chosen.cost.cost_usd / 1e6 if priced else chosen.cost.gpu_hours / 1e6
        left.plot([chosen.num_gpus], [chosen.cost.wall_days], marker="*", markersize=16, color="tab:orange",
                  label=f"chosen: {chosen.num_gpus:,} GPUs ({result.choice.rule})")
        right.plot([spent], [chosen.cost.wall_days], marker="*", markersize=16, color="tab:orange")
        left.legend(fontsize=7)
    if result.target.deadline_days is not None:
        for ax in (left, right):
            ax.axhline(result.target.deadline_days, color="grey", linestyle="--", linewidth=0.8)
    if result.target.budget_usd is not None:
        right.axvline(result.target.budget_usd / 1e6, color="grey", linestyle=":", linewidth=0.8)
    left.set_xlabel("GPUs")
    right.set_xlabel("cost (M USD)" if priced else "GPU-hours (millions)")
    for ax in (left, right):
        ax.set_ylabel("days (with failures)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}\n(dashed: deadline; dotted: budget; line: Pareto front)", fontsize=9)
    return save(fig, Path(path))


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats in both cost and days, by cost."""
    front, best_days = [], float("inf")
    for cost, days in sorted(points):
        if days < best_days:
            front.append((cost, days))
            best_days = days
    return front
