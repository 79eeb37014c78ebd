"""Write XLA's published GEMM tables (B200 BF16 and FP8, H100 BF16) in this project's
measurement format, split in two halves, and derive the launch overhead their device timing
leaves out.

    python benchmarks/import_xla_gemm.py [--csv ../shared/validation/public-kernels/xla-gemm-b200-h100.csv]

The source: openxla/xla `xla/service/gpu/model/matmul_interpolator_data.h` (Apache-2.0), read
at ROCm/xla commit e97611c4: per GPU and datatype, 375 shapes (batch 1/2/4; M, N, K in
256..4096), each the median kernel time of XLA's profiler over 5 runs, given as TFLOP/s
(2·batch·M·N·K / time). Written to problems/measurements/b200-xla/gemm.json (B200: `bf16`,
and `fp8` for e4m3 × e4m3 → bf16, the operands Transformer Engine's FP8 forward GEMMs take) and
problems/measurements/h100-xla/gemm.json (H100 BF16, for the launch overhead below).

The split: a shape whose log2(batch) + log2(M) + log2(N) + log2(K) is even is `kind: fit`,
odd `kind: held_out` — a checkerboard, so both halves span every size.

The launch overhead: XLA's profiler times the kernel on the device; this project's
microbenchmark (benchmarks/measure_gpu.py, triton's do_bench) times it from the host, which
adds the launch. Both measured H100 BF16: the GEMM model fitted to XLA's H100 table at full
clock has a launch term `launch_us` smaller than the microbenchmark's fit
(problems/systems/h100-80g-nvl8.yaml); the difference is written to b200-xla/source.json and
added to the B200 fits (costmodel.calibration.fit.FullClock).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from costmodel.calibration import fit as fitting
from costmodel.calibration.measurements import load_gemm
from costmodel.inputs.load import load_system
from costmodel.inputs.system import Datatype

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT.parent / "shared" / "validation" / "public-kernels" / "xla-gemm-b200-h100.csv"
SOURCE = ("openxla/xla xla/service/gpu/model/matmul_interpolator_data.h (Apache-2.0), read at ROCm/xla commit "
          "e97611c4 (openxla PR #36518); B200 rows added in 1088d5ab, FP8 in 71feeddf: the median kernel time of "
          "XLA's profiler over 5 runs per shape")
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}
TABLES = {"B200": "b200-xla", "H100": "h100-xla"}


def kind_of(batch: int, m: int, n: int, k: int) -> str:
    """The checkerboard split: even sums of the log2 sizes are fitted, odd ones held out."""
    return "fit" if round(sum(math.log2(v) for v in (batch, m, n, k))) % 2 == 0 else "held_out"


def points(rows: list[dict], gpu: str) -> list[dict]:
    out = []
    for r in rows:
        if r["gpu"] != gpu or r["dtype"] not in DTYPES:
            continue
        batch, m, n, k = (int(r[f]) for f in ("batch", "m", "n", "k"))
        tflops = float(r["tflops"])
        out.append({"dtype": DTYPES[r["dtype"]], "kind": kind_of(batch, m, n, k), "batch": batch, "M": m, "N": n,
                    "K": k, "ms": 2.0 * batch * m * n * k / (tflops * 1e12) * 1e3, "tflops": tflops})
    return out


def launch_overhead_us(h100_table: Path) -> tuple[float, float, float]:
    """(overhead, the microbenchmark's launch, XLA's) for H100 BF16 GEMMs, µs."""
    system = load_system(ROOT / "problems" / "systems" / "h100-80g-nvl8.yaml")
    compute = system.compute_for(Datatype.bfloat16)
    f = fitting.fit_gemm(load_gemm(h100_table, "bf16", "fit"), load_gemm(h100_table, "bf16", "held_out"),
                         compute.matrix_flops_per_s, system.hbm.bandwidth_bytes_per_s, 2.0, "bf16",
                         ("fit", "held_out"), fitting.FullClock(0.0, 0.0))
    measured = compute.gemm.launch_us
    return measured - f.fields["launch_us"], measured, f.fields["launch_us"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = parser.parse_args()
    with open(args.csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for gpu, folder in TABLES.items():
        out = ROOT / "problems" / "measurements" / folder
        out.mkdir(parents=True, exist_ok=True)
        data = points(rows, gpu)
        lines = ",\n".join(json.dumps(point) for point in data)
        (out / "gemm.json").write_text(f"[\n{lines}\n]\n", encoding="utf-8")
        print(f"{out / 'gemm.json'}: {len(data)} points")
    overhead, measured, xla = launch_overhead_us(ROOT / "problems" / "measurements" / "h100-xla" / "gemm.json")
    print(f"H100 BF16 launch: microbenchmark fit {measured:g} µs, XLA table fit {xla:g} µs → overhead {overhead:.2f} µs")
    for gpu, folder in TABLES.items():
        source = {"gpu": f"NVIDIA {gpu}", "source": SOURCE, "at_full_clock": True,
                  "launch_overhead_us": round(overhead, 2),
                  "launch_overhead_source": f"H100 BF16: the microbenchmark's launch_us {measured:g} "
                                            f"(h100-80g-nvl8.yaml) less the XLA H100 table's fitted {xla:g} "
                                            "(benchmarks/import_xla_gemm.py)"}
        (ROOT / "problems" / "measurements" / folder / "source.json").write_text(
            json.dumps(source, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
