"""Run the paper's experiments (problems/paper/*.yaml), draw their plots and print the tables
docs/paper-reproduction.md quotes.

    python benchmarks/run_paper.py                       # every figure, into runs/paper/
    python benchmarks/run_paper.py fig2 fig7 --jobs 2 --time-limit 60
    python benchmarks/run_paper.py --tables-only         # tables from results already there
    python benchmarks/run_paper.py fig2 fig4 --system problems/systems/h100-80g-nvl8.yaml \
        --out runs/paper-calibrated                       # the same questions on another system

Long (hundreds of solves of 1T-128T models on 4k-16k GPUs); not part of the tests. Each
figure's batch resumes like `mapsat batch`: rerun to continue after an interruption. The
tables go to stdout and to runs/paper/tables.md.
"""

from __future__ import annotations

import argparse
import sys

import yaml
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from solver.study.batch import load_batch  # noqa: E402
from solver.study.runner import run_batch  # noqa: E402
from solver.report.plots import make_plots  # noqa: E402
from solver.study.store import read_results  # noqa: E402

FIGURES = ["fig2-mappability", "fig4-offload", "fig5-offload-capacity", "fig7-strong-scaling", "fig8-128T"]


def mfu(record: dict) -> str:
    best = record.get("best") or {}
    if best.get("mfu") is not None:
        star = "" if record.get("certified_optimal") else f" (gap {record.get('gap') or 0:.0%})"
        return f"{best['mfu']:.1%}{star}"
    return {"infeasible": "does not fit", "error": "error"}.get(record["status"], record["status"])


def model_label(record: dict) -> str:
    model = record["problem"]["model"]
    return f"{model['name']} ({model['params'] / 1e12:.3g}T)"


def offload_label(system: dict) -> str:
    if not system.get("offload_gib"):
        return "no offload"
    gbps = "unbounded" if system.get("offload_unbounded") else f"{system['offload_gbps']:g} GB/s"
    return f"{system['offload_gib']:g} GiB @ {gbps}"


def pivot(records: list[dict], row, column, title: str) -> str:
    """A markdown table: one row per `row(record)`, one column per `column(record)`, MFU inside."""
    cells: dict[str, dict[str, str]] = defaultdict(dict)
    columns: list[str] = []
    for r in records:
        col = column(r)
        if col not in columns:
            columns.append(col)
        cells[row(r)][col] = mfu(r)
    lines = [f"**{title}**", "", "| | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, values in cells.items():
        lines.append(f"| {name} | " + " | ".join(values.get(c, "") for c in columns) + " |")
    return "\n".join(lines) + "\n"


def fig2_table(records: list[dict]) -> str:
    lines = ["**Figure 2: mappability (4,096 H100, FP8)**", "",
             "| model | space | attention | offload | mappings | MFU | iteration s "
             "| best mapping (tp, pp, dp, mb, il, recompute) |",
             "|---|---|---|---|---|---|---|---|"]
    by_setting: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for r in records:
        best, problem = r.get("best") or {}, r["problem"]
        m = best.get("mapping") or {}
        shape = (f"{m.get('tensor_par')}, {m.get('pipeline_par')}, {m.get('data_par')}, {m.get('microbatch_size')}, "
                 f"{m.get('pipeline_interleaving')}, {m.get('activation_recompute')}") if m else ""
        seconds = f"{best['iteration_time_s']:.2f}" if best.get("iteration_time_s") else ""
        offload = offload_label(problem["system"])
        attention = problem.get("attention", "fused")
        lines.append(f"| {model_label(r)} | {problem['space']} | {attention} | {offload} | {r.get('mappings') or 0:,} "
                     f"| {mfu(r)} | {seconds} | {shape} |")
        if best.get("mfu"):
            by_setting[(problem["space"], attention, offload)][problem["model"]["num_blocks"]] = best["mfu"]
    lines.append("")
    for (space, attention, offload), values in by_setting.items():
        if 256 in values and 254 in values:
            lines.append(f"- {space}, {attention} attention, {offload}: MFU 256 blocks / 254 blocks = "
                         f"{values[256]:.1%} / {values[254]:.1%} = {values[256] / values[254]:.2f}×")
    lines.append("- paper (its reference system: 512 GiB of offload per GPU): 75% / 54% = 1.39×")
    return "\n".join(lines) + "\n"


def fig7_table(records: list[dict]) -> str:
    def setting(r: dict) -> str:
        system = r["problem"]["system"]
        return f"NVLink {system['nvlink_size']}, {offload_label(system)}"

    table = pivot(records, lambda r: f"{r['problem']['gpus']:,} GPUs", setting,
                  "Figure 7: strong scaling of the 1T model (MFU)")
    settings = list(dict.fromkeys(setting(r) for r in records))
    # Throughput (sequences/s), not iteration time: the global batch is the largest multiple
    # of dp under the cap, so it changes with the GPU count (2,560 on 10,240 GPUs with dp 640).
    lines = ["", "Speed-up in sequences/s over 4,096 GPUs (ideal = GPUs / 4,096):", "",
             "| GPUs | ideal | " + " | ".join(settings) + " |", "|---" * (len(settings) + 2) + "|"]
    rates = {(r["problem"]["gpus"], setting(r)): (r.get("best") or {}).get("sample_rate") for r in records}
    for gpus in sorted({g for g, _ in rates}):
        row = [f"{gpus:,}", f"{gpus / 4096:.2f}"]
        for name in settings:
            base, here = rates.get((4096, name)), rates.get((gpus, name))
            row.append(f"{here / base:.2f}" if base and here else "")
        lines.append("| " + " | ".join(row) + " |")
    return table + "\n".join(lines) + "\n"


TABLES = {
    "fig2-mappability": fig2_table,
    "fig4-offload": lambda rs: pivot(rs, model_label, lambda r: offload_label(r["problem"]["system"]),
                                     "Figure 4: MFU on 4,096 H100 (FP8) by offload memory"),
    "fig5-offload-capacity": lambda rs: pivot(
        rs, lambda r: f"{model_label(r)}, {r['problem']['gpus']:,} GPUs", lambda r: offload_label(r["problem"]["system"]),
        "Figure 5: MFU by offload capacity and bandwidth"),
    "fig7-strong-scaling": fig7_table,
    "fig8-128T": lambda rs: pivot(
        rs, model_label, lambda r: f"HBM {r['problem']['system']['hbm_gib']:g}, {offload_label(r['problem']['system'])}",
        "Figure 8: MFU on 4,096 H100 (FP8) by HBM and offload capacity (100 GB/s)"),
}


def batch_on_system(batch: Path, system: Path, out: Path) -> Path:
    """A copy of a paper batch file that runs on `system` instead of the papers' assumed H100:
    the same models, GPU counts and overrides (paths made absolute), written into `out`."""
    data = yaml.safe_load(batch.read_text())

    def absolute(paths):
        return [str((batch.parent / p).resolve()) for p in (paths if isinstance(paths, list) else [paths])]

    for grid in [data, *data.get("grids", [])]:
        if "models" in grid:
            grid["models"] = absolute(grid["models"])
        if "systems" in grid:
            grid["systems"] = [str(system.resolve())]
    out.mkdir(parents=True, exist_ok=True)
    copy = out / batch.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figures", nargs="*", help="fig2, fig4, fig5, fig7, fig8 (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "paper")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--solver-workers", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=None, help="seconds per problem (default: the files')")
    parser.add_argument("--retry-errors", action="store_true", help="solve again the problems recorded as errors")
    parser.add_argument("--tables-only", action="store_true", help="do not solve; tables and plots from results")
    parser.add_argument("--system", type=Path, default=None,
                        help="run every batch on this system file instead of the papers' assumed H100")
    args = parser.parse_args()
    chosen = [f for f in FIGURES if not args.figures or f.split("-")[0] in args.figures]
    tables = []
    for name in chosen:
        out = args.out / name
        batch = REPO / "problems" / "paper" / f"{name}.yaml"
        if args.system is not None:
            batch = batch_on_system(batch, args.system, args.out / "batches")
        problems = load_batch(batch, time_limit_s=args.time_limit)
        if not args.tables_only:
            print(f"== {name}: {len(problems)} problems -> {out}", flush=True)
            summary = run_batch(problems, out, jobs=args.jobs, solver_workers=args.solver_workers,
                                retry_errors=args.retry_errors)
            print(f"   {summary.by_status} in {summary.seconds:.0f} s", flush=True)
            if summary.interrupted:
                break
        if not (out / "results.jsonl").exists():
            continue
        order = {p.id: i for i, p in enumerate(problems)}
        records = sorted((r for r in read_results(out) if r["id"] in order), key=lambda r: order[r["id"]])
        if records:
            make_plots(records, out / "plots")
            missing = len(problems) - len(records)
            note = f"\n({missing} of {len(problems)} problems not run yet)\n" if missing else ""
            tables.append(TABLES[name](records) + note)
    text = "\n".join(tables)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tables.md").write_text(text)


if __name__ == "__main__":
    main()
