"""The fit behind problems/systems/a100-80g-selene.yaml's calibrated constants.

    python benchmarks/calibrate_selene.py

Grid search over the constants no public specification gives — the A100 GEMM efficiency
at 1e10, 1e11 and 1e12 FLOP, the NVLink efficiency and latency, and the HBM efficiency of
large passes — minimising the mean |error| of the modelled iteration time over the 8
measured points of Korthikanti et al. 2022, Table 5 (costmodel/data/selene-2022.json).
One calibration for all points: nothing is tuned per point. Prints the best settings with
their per-point errors; the shipped file uses the best one.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import yaml

from costmodel.evaluate import evaluate
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from costmodel.measured.validation import load_selene_data, selene_mapping

ROOT = Path(__file__).resolve().parents[1]
GRID = {
    "gemm_1e10": [0.6, 0.65, 0.7],
    "gemm_1e11": [0.7, 0.72, 0.75],
    "gemm_1e12": [0.75, 0.78, 0.8],
    "nvlink_efficiency": [0.65, 0.7, 0.75],
    "nvlink_latency_us": [5, 10],
    "hbm_large_efficiency": [0.7, 0.85],
}


def system_with(base: dict, s: dict) -> System:
    doc = copy.deepcopy(base)
    curve = [[0, 0.25], [1e9, 0.45], [1e10, s["gemm_1e10"]], [1e11, s["gemm_1e11"]], [1e12, s["gemm_1e12"]]]
    for dtype in ("float16", "bfloat16"):
        doc["compute"][dtype] = {**doc["compute"][dtype], "matrix_efficiency": curve}
    doc["networks"][0] = {**doc["networks"][0], "efficiency": s["nvlink_efficiency"],
                          "latency_us": s["nvlink_latency_us"]}
    doc["hbm"] = {**doc["hbm"], "efficiency": [[0, 0.5], [1e6, 0.7], [1e8, s["hbm_large_efficiency"]]]}
    return System.model_validate(doc)


def main() -> None:
    data = load_selene_data()
    base = yaml.safe_load((ROOT / "problems/systems/a100-80g-selene.yaml").read_text())
    points = [(Model.model_validate(data["models"][name]), selene_mapping(data, name, strategy), measured)
              for name, times in data["iteration_time_s"].items() for strategy, measured in times.items()]
    results = []
    for values in itertools.product(*GRID.values()):
        settings = dict(zip(GRID, values))
        system = system_with(base, settings)
        errors = [(evaluate(model, system, mapping).iteration_time_s - measured) / measured
                  for model, mapping, measured in points]
        results.append((sum(map(abs, errors)) / len(errors), max(map(abs, errors)), settings, errors))
    results.sort(key=lambda r: (r[0], r[1]))
    for mean, worst, settings, errors in results[:5]:
        print(f"mean {100 * mean:.2f} %  max {100 * worst:.2f} %  {settings}")
        print("   per point: " + " ".join(f"{100 * e:+.2f}" for e in errors))


if __name__ == "__main__":
    main()
