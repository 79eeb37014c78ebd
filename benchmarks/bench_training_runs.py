"""Benchmark: the cost model's whole training steps against measured ones.

    python benchmarks/bench_training_runs.py            # tables
    python benchmarks/bench_training_runs.py --json     # one JSON object

Megatron-Bridge's published pre-training rows (problems/runs/megatron-bridge-pretraining.json),
dense models only (mixture-of-experts rows belong to the MoE work and are counted, not
scored): the newest release of each configuration, per row the predicted and measured step
time and the signed error (negative: the model is too fast), then a summary — median
|error|, mean signed error — overall, by system and by precision. NVFP4 is reported (its own
precision line), not targeted: its FP4 GEMMs are not measured. Rows the model calls infeasible
or cannot take are listed with the reason; older releases of the same configurations are
reported separately. Each row family (model, system, precision) lists what the model cannot
express yet (costmodel.run_mapping). Then the single-H200 iterations
(problems/runs/h200-single-gpu-pytorch.json): step time and peak memory.

The computation is costmodel.run_scoring / costmodel.run_report; this script only selects
and prints, so a fit (`calibrate --runs`) and out-of-sample reports can score the same rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from costmodel.run_files import read_runs
from costmodel.run_report import RunsReport, gap_tags, validate_runs
from costmodel.run_scoring import ErrorSummary, RunInputs, RunScore, split_dense

ROOT = Path(__file__).resolve().parents[1]
BRIDGE_ROWS = ROOT / "problems" / "runs" / "megatron-bridge-pretraining.json"
SINGLE_GPU_ROWS = ROOT / "problems" / "runs" / "h200-single-gpu-pytorch.json"


def dense_bridge_report(inputs: RunInputs, path: Path = BRIDGE_ROWS) -> tuple[RunsReport, int]:
    """The dense rows' report and how many rows were left out as not dense."""
    dense, other = split_dense(read_runs(path), inputs)
    return validate_runs(dense, inputs, source=str(path.relative_to(ROOT))), len(other)


def gaps_by_family(scores: tuple[RunScore, ...]) -> dict[str, list[str]]:
    """What each (model, system, precision) family of rows cannot express, gap by gap."""
    families: dict[str, list[str]] = {}
    for s in scores:
        key = f"{s.run.model} on {s.system_name}, {s.run.precision.value}"
        seen = families.setdefault(key, [])
        for gap in s.not_expressible:
            if gap not in seen:
                seen.append(gap)
    return families


def _percent(value: float | None) -> str:
    return "      —" if value is None else f"{100 * value:+6.1f}%"


def _print_rows(title: str, scores: tuple[RunScore, ...]) -> None:
    print(f"\n{title}")
    print(f"  {'run':46} {'release':8} {'system':17} {'precision':15} {'measured s':>10} {'predicted s':>11} "
          f"{'error':>7}  status / not expressible")
    for s in scores:
        measured = "—" if s.run.step_time_s is None else f"{s.run.step_time_s:.3f}"
        predicted = "—" if s.predicted_step_s is None else f"{s.predicted_step_s:.3f}"
        print(f"  {s.run.name:46} {s.run.software or '':8} {s.system_name:17} {s.run.precision.value:15} "
              f"{measured:>10} {predicted:>11} {_percent(s.time_error)}  {s.status}: {gap_tags(s) or '—'}")


def _print_summary(title: str, summaries: tuple[ErrorSummary, ...]) -> None:
    for s in summaries:
        print(f"  {title:10} {s.group:18} {s.count:3} rows   median |error| {100 * s.median_abs_error:5.1f} %   "
              f"mean signed {100 * s.mean_signed_error:+6.1f} %   max |error| {100 * s.max_abs_error:5.1f} %")


def print_report(report: RunsReport, left_out: int, single_gpu: RunsReport) -> None:
    print(f"{report.source}: {len(report.newest) + len(report.older)} dense rows "
          f"({left_out} mixture-of-experts rows left out), {len(report.newest)} configurations")
    _print_rows("newest release of each configuration", report.newest)
    print("\nsummary, newest release of each configuration (NVFP4 only in its precision's line):")
    _print_summary("all", report.overall)
    _print_summary("system", report.by_system)
    _print_summary("precision", report.by_precision)
    unscored = [s for s in report.newest if s.status != "scored"]
    print(f"\nnot scored among the newest: {len(unscored) or 'none'}")
    for s in unscored:
        print(f"  {s.run.name}: {s.status}: {'; '.join(s.reasons) or 'no measured step time'}")
    _print_rows("older releases of the same configurations", report.older)
    print("\nsummary, older releases:")
    _print_summary("all", report.older_overall)
    print("\nnot expressible yet, by row family:")
    for family, gaps in gaps_by_family(report.newest + report.older).items():
        print(f"  {family}:")
        for gap in gaps or ["— (everything expressible)"]:
            print(f"    - {gap}")
    print(f"\n{single_gpu.source}: {len(single_gpu.newest)} single-GPU iterations")
    _print_summary("step time", single_gpu.overall)
    _print_summary("peak mem", single_gpu.memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args()
    inputs = RunInputs()
    report, left_out = dense_bridge_report(inputs)
    single_gpu = validate_runs(read_runs(SINGLE_GPU_ROWS), inputs, source=str(SINGLE_GPU_ROWS.relative_to(ROOT)))
    if args.json:
        print(json.dumps({"megatron_bridge_dense": report.to_dict(), "moe_rows_left_out": left_out,
                          "not_expressible_by_family": gaps_by_family(report.newest + report.older),
                          "single_gpu": single_gpu.to_dict()}, indent=2, sort_keys=True))
        return
    print_report(report, left_out, single_gpu)


if __name__ == "__main__":
    main()
