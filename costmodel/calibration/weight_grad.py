"""The weight-gradient GEMMs of FP8 block scaling on Hopper, from a published kernel table.

With 1×128 scales along the reduction on both operands (Xᵀ and dY, both per token), a weight
gradient dW[M, N] = Xᵀ[M, K]·dY[K, N] promotes every 128-deep partial product by two scale
vectors and accumulates into an FP32 result. DeepGEMM's kernel for it (pull request #95,
problems/measurements/h800-deepgemm/) runs at 878–1,092 TFLOP/s on the H800, where the per-tensor
FP8 GEMM model of the same GPU (measured on the H100, the same SM) gives 1,316–1,441 at those
shapes: one share of that model's efficiency, `weight_grad_efficiency`, times all of them.

The grouped kernel of the same pull request (its MoE table as quoted in DeepGEMM issue #107) is a
check the fit was not made on: the experts' weight gradients run as one grouped kernel of that
efficiency.

It is fitted here, and written by hand into the Hopper files' fp8-blockwise recipe
(problems/systems/calibration/*.base.yaml); tests/test_weight_grad_fit.py holds the files to this
fit and reports it out of sample (each point left out in turn). The check the fit was not made on:
the weight-gradient category of DeepSeek-V3's H800 trace (benchmarks/bench_moe_trace.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from costmodel.errors import InputError
from costmodel.inputs.kernel_fits import GemmTiming
from costmodel.inputs.units import tflops_to_flops_per_s
from costmodel.ops import ScalarOps
from costmodel.terms.kernel_time import gemm_time_s

@dataclass(frozen=True)
class WeightGradPoint:
    """One published weight-gradient GEMM dW[M, N] over a K-deep reduction, and its rate."""

    m: int
    n: int
    k: int
    tflops: float
    groups: int = 1
    """GEMMs of that shape in one grouped kernel (an MoE layer's experts)"""

    @property
    def measured_s(self) -> float:
        return 2.0 * self.groups * self.m * self.n * self.k / tflops_to_flops_per_s(self.tflops)


def load_weight_grad_points(path: Path) -> list[WeightGradPoint]:
    """The table's points (fields M, N, K, tflops, and groups where grouped; see
    problems/measurements/README.md)."""
    try:
        rows = json.loads(Path(path).read_text())
        return [WeightGradPoint(int(row["M"]), int(row["N"]), int(row["K"]), float(row["tflops"]),
                                int(row.get("groups", 1))) for row in rows]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path}: not a weight-gradient GEMM table ({error})") from None


@dataclass(frozen=True)
class WeightGradFit:
    """The GPU's GEMM model that the efficiency scales, with its peak and HBM bandwidth."""

    gemm: GemmTiming
    peak_flops_per_s: float
    hbm_bytes_per_s: float

    def time_s(self, point: WeightGradPoint, efficiency: float) -> float:
        """The model's time of the point at `efficiency` × the GEMM model's efficiency (FP8
        operands, the result counted once, as costmodel.terms.layer_time.weight_grad_s moves it)."""
        timing = replace(self.gemm, efficiency=self.gemm.efficiency * efficiency)
        num_bytes = point.groups * (point.m * point.k + point.n * point.k + point.m * point.n)
        return gemm_time_s(timing, ScalarOps, point.m, point.n, point.k, num_bytes, self.peak_flops_per_s,
                           self.hbm_bytes_per_s, point.groups)

    def efficiency(self, points: list[WeightGradPoint]) -> float:
        """The share of the GEMM model's efficiency that times `points`: each point's own (its
        main loop's time at full efficiency over the measured time less the launch), their median."""
        launch = self.gemm.launch_s
        return float(np.median([(self.time_s(p, 1.0) - launch) / (p.measured_s - launch) for p in points]))

    def held_out_errors(self, points: list[WeightGradPoint]) -> list[float]:
        """|relative error| of each point's time, the efficiency fitted on the others."""
        return [abs(self.time_s(p, self.efficiency(points[:i] + points[i + 1:])) / p.measured_s - 1.0)
                for i, p in enumerate(points)]
