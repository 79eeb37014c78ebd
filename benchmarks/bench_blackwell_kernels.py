"""Benchmark: B200 GEMM time per shape, modelled against XLA's published table.

    python benchmarks/bench_blackwell_kernels.py [--all-shapes]

Two B200 GEMM models against problems/measurements/b200-xla/gemm.json (XLA's table:
benchmarks/import_xla_gemm.py), on the held-out half of its shapes of >= 1 GFLOP (the
`kind: held_out` checkerboard half; the fit saw only `kind: fit`):

* the shipped file (problems/systems/b200-180g-nvl8.yaml, which `mapsat calibrate` writes from
  the table's fitted half), timed as the table was: at full clock, without the host launch
  overhead;
* the H100's fit as fractions of the B200's peaks (what the file carried before), each GEMM
  timed alone.

Past 4,096 per dimension the fit extrapolates by its form; the published long runs
(problems/measurements/b200-xla/long_runs.json, which the file's sustained clocks are fitted
on) are printed beside the file's GEMM at its sustained clock.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from costmodel.calibration.fit import _gemm_bytes
from costmodel.calibration.measurements import GemmData, load_gemm
from costmodel.inputs.load import load_system
from costmodel.ops import ArrayOps
from costmodel.inputs.system import Datatype, GemmFit, System
from costmodel.terms.kernel_time import gemm_time_s

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "problems" / "measurements" / "b200-xla"
H100 = ROOT / "problems" / "systems" / "h100-80g-nvl8.yaml"
DATATYPES = {"bf16": (Datatype.bfloat16, 2.0), "fp8": (Datatype.float8, 1.0)}


def _times(fields: dict, d: GemmData, system: System, datatype: Datatype, elem_bytes: float,
           launch_less_us: float = 0.0, sustained: bool = False) -> np.ndarray:
    fit = {**fields, "launch_us": max(0.0, fields["launch_us"] - launch_less_us)}
    timing = GemmFit(**fit).timing()
    if sustained:
        timing = replace(timing, sustained_flops=1e30)
    compute = system.compute_for(datatype)
    return gemm_time_s(timing, ArrayOps, d.rows, d.cols, d.depth, _gemm_bytes(d, elem_bytes),
                       compute.matrix_flops_per_s, system.hbm.bandwidth_bytes_per_s, d.batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-shapes", action="store_true", help="print every held-out shape, not a sample")
    args = parser.parse_args()
    fitted = load_system(ROOT / "problems" / "systems" / "b200-180g-nvl8.yaml")
    h100 = load_system(H100)
    overhead = yaml.safe_load((TABLE / "source.json").read_text())["launch_overhead_us"]
    for dtype, (datatype, elem_bytes) in DATATYPES.items():
        d = load_gemm(TABLE / "gemm.json", dtype, "held_out")
        flops = 2.0 * d.batch * d.rows * d.cols * d.depth
        keep = flops >= 1e9
        d = GemmData(d.rows[keep], d.cols[keep], d.depth[keep], d.time_s[keep], d.batch[keep])
        xla = _times({**fitted.compute_for(datatype).gemm.model_dump(), "power_drop": 0.0}, d, fitted, datatype,
                     elem_bytes, overhead)
        old = _times(_carried_over(h100, fitted, datatype), d, fitted, datatype, elem_bytes)
        print(f"\nB200 {dtype}: {len(d.time_s)} held-out shapes of >= 1 GFLOP (XLA table)")
        print(f"  {'batch':>5} {'M':>5} {'N':>5} {'K':>5} {'table µs':>9} {'file µs':>10} {'err':>7} "
              f"{'H100 fit µs':>11} {'err':>7}")
        rows = range(len(d.time_s)) if args.all_shapes else range(0, len(d.time_s), max(1, len(d.time_s) // 20))
        for i in rows:
            print(f"  {d.batch[i]:5.0f} {d.rows[i]:5.0f} {d.cols[i]:5.0f} {d.depth[i]:5.0f} {d.time_s[i] * 1e6:9.1f} "
                  f"{xla[i] * 1e6:10.1f} {100 * (xla[i] / d.time_s[i] - 1):+6.1f}% {old[i] * 1e6:10.1f} "
                  f"{100 * (old[i] / d.time_s[i] - 1):+6.1f}%")
        for label, model in (("file (fitted on the other half)", xla), ("H100's fit carried over", old)):
            err = np.abs(model / d.time_s - 1)
            print(f"  {label:36s} median |error| {100 * np.median(err):5.1f} %   p90 {100 * np.percentile(err, 90):5.1f} %")
    print("\nPast the table: published long runs against the file's GEMM at its sustained clock")
    for dtype, (datatype, elem_bytes) in DATATYPES.items():
        d = load_gemm(TABLE / "long_runs.json", dtype, "long_run")
        t = _times(fitted.compute_for(datatype).gemm.model_dump(), d, fitted, datatype, elem_bytes, 0.0, True)
        for i in range(len(d.time_s)):
            flops = 2 * d.rows[i] * d.cols[i] * d.depth[i]
            print(f"  {dtype:4s} {d.rows[i]:.0f}×{d.cols[i]:.0f}×{d.depth[i]:.0f}: modelled {flops / t[i] / 1e12:6.0f} "
                  f"TFLOP/s, published {flops / d.time_s[i] / 1e12:6.0f}")


def _carried_over(h100: System, b200: System, datatype: Datatype) -> dict:
    """The H100's measured fit as fractions of the B200's peak (`power_flops` scaled by the
    ratio of peaks), as the B200 file carried it before XLA's table."""
    fit = h100.compute_for(datatype).gemm.model_dump()
    ratio = b200.compute_for(datatype).matrix_tflops / h100.compute_for(datatype).matrix_tflops
    return {**fit, "power_flops": fit["power_flops"] * ratio}

if __name__ == "__main__":
    main()
