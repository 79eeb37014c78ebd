"""Benchmark: B200 GEMM time per shape, modelled against XLA's published table.

    python benchmarks/bench_blackwell_kernels.py [--all-shapes]

Two B200 GEMM models against problems/measurements/b200-xla/gemm.json (XLA's table:
benchmarks/import_xla_gemm.py), on the held-out half of its shapes of >= 1 GFLOP (the
`kind: held_out` checkerboard half; the fit saw only `kind: fit`):

* the XLA fit: problems/systems/calibration/b200-180g-nvl8-xla.base.yaml calibrated on the
  table's fitted half (`mapsat calibrate`), timed as the table was, at full clock and without
  the host launch overhead;
* the shipped file (problems/systems/b200-180g-nvl8.yaml): the H100's fit as fractions of
  peak, each GEMM timed alone.

Past 4,096 per dimension the XLA fit extrapolates by its form; the single published B200 points
of ../shared/validation/public-kernels/points.yaml (long runs: sustained clocks) are printed
beside its prediction at the sustained clock (the whole drop).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from costmodel.calibration import calibrate_system
from costmodel.calibration.fit import _gemm_bytes
from costmodel.calibration.measurements import GemmData, load_gemm
from costmodel.inputs.load import load_system
from costmodel.ops import ArrayOps
from costmodel.system import Datatype, GemmFit, System
from costmodel.terms.kernel_time import gemm_time_s

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "problems" / "measurements" / "b200-xla"
BASE = ROOT / "problems" / "systems" / "calibration" / "b200-180g-nvl8-xla.base.yaml"
DATATYPES = {"bf16": (Datatype.bfloat16, 2.0), "fp8": (Datatype.float8, 1.0)}
# (dtype, M, N, K, published TFLOP/s range, source) — points.yaml, each a long run on a B200.
SINGLE_POINTS = (("bf16", 8192, 8192, 8192, (1410, 1450), "pytorch/ao PR #2427 (torch.mm)"),
                 ("bf16", 16384, 4096, 4096, (1513, 1513), "vllm-project/vllm PR #19566"),
                 ("fp8", 16384, 4096, 4096, (2225, 2545), "vllm-project/vllm PR #19566 (per-tensor)"))


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
    calibration = calibrate_system(BASE, TABLE)
    fitted = System.model_validate(yaml.safe_load(calibration.text))
    shipped = load_system(ROOT / "problems" / "systems" / "b200-180g-nvl8.yaml")
    overhead = yaml.safe_load((TABLE / "source.json").read_text())["launch_overhead_us"]
    for dtype, (datatype, elem_bytes) in DATATYPES.items():
        d = load_gemm(TABLE / "gemm.json", dtype, "held_out")
        flops = 2.0 * d.batch * d.rows * d.cols * d.depth
        keep = flops >= 1e9
        d = GemmData(d.rows[keep], d.cols[keep], d.depth[keep], d.time_s[keep], d.batch[keep])
        xla = _times(fitted.compute_for(datatype).gemm.model_dump(), d, fitted, datatype, elem_bytes, overhead)
        old = _times(shipped.compute_for(datatype).gemm.model_dump(), d, shipped, datatype, elem_bytes)
        print(f"\nB200 {dtype}: {len(d.time_s)} held-out shapes of >= 1 GFLOP (XLA table)")
        print(f"  {'batch':>5} {'M':>5} {'N':>5} {'K':>5} {'table µs':>9} {'XLA fit µs':>10} {'err':>7} "
              f"{'shipped µs':>10} {'err':>7}")
        rows = range(len(d.time_s)) if args.all_shapes else range(0, len(d.time_s), max(1, len(d.time_s) // 20))
        for i in rows:
            print(f"  {d.batch[i]:5.0f} {d.rows[i]:5.0f} {d.cols[i]:5.0f} {d.depth[i]:5.0f} {d.time_s[i] * 1e6:9.1f} "
                  f"{xla[i] * 1e6:10.1f} {100 * (xla[i] / d.time_s[i] - 1):+6.1f}% {old[i] * 1e6:10.1f} "
                  f"{100 * (old[i] / d.time_s[i] - 1):+6.1f}%")
        for label, model in (("XLA fit (fitted on the other half)", xla), ("shipped file", old)):
            err = np.abs(model / d.time_s - 1)
            print(f"  {label:36s} median |error| {100 * np.median(err):5.1f} %   p90 {100 * np.percentile(err, 90):5.1f} %")
    print("\nPast the table (long runs, sustained clock): XLA fit at the whole clock drop against published points")
    for dtype, m, n, k, (low, high), source in SINGLE_POINTS:
        datatype, elem_bytes = DATATYPES[dtype]
        d = GemmData(np.array([m], float), np.array([n], float), np.array([k], float), np.array([1.0]))
        t = _times(fitted.compute_for(datatype).gemm.model_dump(), d, fitted, datatype, elem_bytes, overhead, True)
        print(f"  {dtype:4s} {m}×{n}×{k}: modelled {2 * m * n * k / t[0] / 1e12:6.0f} TFLOP/s, "
              f"published {low:g}-{high:g} ({source})")


if __name__ == "__main__":
    main()
