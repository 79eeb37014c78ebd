"""Benchmark: the whole-step sustained-clock term against the GEMMs measured back to back.

    python benchmarks/bench_sustained_clocks.py

The power window (costmodel.terms.step_terms, `step.power_window_ms`) makes every GEMM of a step pay
at least the drop of a GEMM lasting the window at full rate, F' = max(F, window · peak ·
efficiency), under the GEMM fit's `power_drop` and `power_flops`. The fit is made on the
`kind: grid` GEMMs (up to 2^42 FLOP); the `kind: block` GEMMs reach 3·10^13 FLOP, each running
~25 ms, back to back for 60 ms (gpu-microbench measure.py: triton's do_bench, rep 60 ms from 2
TFLOP), so at the limiter's steady clock. Per calibrated system and datatype, by decade of FLOP
(half decades), this prints the measured fraction of the matrix peak (median), the fit alone
over measured and the fit as a step runs it (the system file's window) over measured: what the
window charges beyond the microbenchmark (docs/training-runs.md, "What no shared term fits").

Uses the shipped measurements (problems/measurements/) and system files (problems/systems/);
the arithmetic is costmodel.terms.kernel_time.gemm_time_s, as the cost model and the fit call it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from costmodel.calibration.fit import gemm_predict
from costmodel.calibration.measurements import load_gemm
from costmodel.terms.kernel_time import gemm_time_s
from costmodel.inputs.load import load_system
from costmodel.ops import ArrayOps
from costmodel.terms.step_terms import gemm_in_step
from costmodel.inputs.system import Datatype, GemmFit

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = {"h100-80g-nvl8": "h100-sxm-80g", "h200-141g-nvl8": "h200-sxm-141g"}
DATATYPES = {"bf16": Datatype.bfloat16, "fp8": Datatype.float8}
SMALLEST_DECADE = 10.5


def decade_rows(system_name: str, dtype: str) -> list[tuple[str, float, int, float, float, float]]:
    """(kind, log10 FLOP rounded to a half, points, measured fraction of peak, fit / measured,
    step / measured) per kind and half decade, medians."""
    system = load_system(ROOT / "problems" / "systems" / f"{system_name}.yaml")
    compute = system.compute_for(DATATYPES[dtype])
    fit = compute.gemm.model_dump()
    peak = compute.matrix_flops_per_s
    window_s = system.step.power_window_s if system.step is not None else 0.0
    elem_bytes = float(DATATYPES[dtype].bytes)
    path = ROOT / "problems" / "measurements" / SYSTEMS[system_name] / "gemm.json"
    rows = []
    for kind in ("grid", "block"):
        data = load_gemm(path, dtype, kind)
        flops = 2.0 * data.rows * data.cols * data.depth
        alone = gemm_predict(fit, data, peak, system.hbm.bandwidth_bytes_per_s, elem_bytes)
        in_step = _in_step(fit, data, peak, system.hbm.bandwidth_bytes_per_s, elem_bytes, window_s)
        decade = np.round(np.log10(flops) * 2.0) / 2.0
        for value in sorted(set(decade.tolist())):
            if value < SMALLEST_DECADE:
                continue
            chosen = decade == value
            rows.append((kind, value, int(chosen.sum()), float(np.median(flops[chosen] / data.time_s[chosen] / peak)),
                         float(np.median(alone[chosen] / data.time_s[chosen])),
                         float(np.median(in_step[chosen] / data.time_s[chosen]))))
    return rows


def _in_step(fit: dict, data, peak: float, hbm: float, elem_bytes: float, window_s: float) -> np.ndarray:
    """The fit as a step runs it (costmodel.terms.step_terms.gemm_in_step, without the launch gap: the
    sustained clocks alone)."""
    timing = gemm_in_step(GemmFit(**fit).timing(), 0.0, window_s, peak)
    num_bytes = elem_bytes * (data.rows * data.depth + data.depth * data.cols + data.rows * data.cols)
    return gemm_time_s(timing, ArrayOps, data.rows, data.cols, data.depth, num_bytes, peak, hbm)


def main() -> None:
    for system_name in SYSTEMS:
        system = load_system(ROOT / "problems" / "systems" / f"{system_name}.yaml")
        window = system.step.power_window_ms if system.step is not None else 0.0
        for dtype in DATATYPES:
            print(f"\n{system_name} {dtype} (power window {window:g} ms)")
            print(f"  {'kind':6} {'FLOP':>8} {'points':>6} {'measured / peak':>16} {'fit / measured':>15} "
                  f"{'step / measured':>16}")
            for kind, value, count, fraction, alone, in_step in decade_rows(system_name, dtype):
                print(f"  {kind:6} {'1e' + format(value, 'g'):>8} {count:6d} {fraction:16.3f} {alone:15.3f} "
                      f"{in_step:16.3f}")
    print(f"\n(largest grid GEMM fitted: 2^42 = {2.0 ** 42:.3g} FLOP; log10 {math.log10(2.0 ** 42):.2f})")


if __name__ == "__main__":
    main()
