"""Benchmark: `mapsat explain` on the README's problem — the certified best time for every
value of every dimension of the 256-block ~1.1T model on 4,096 H100s (FP8, 1 TiB offload
at 100 GB/s, full space).

    python benchmarks/bench_explain.py [--space calculon-current]

Prints the total time, the number of (dimension, value) rows, whether every row is
certified, the blocks scored, and the slowest rows. Target (issue 23): <= 30 s on the
2-core development machine: met, 22.9 s for 117 rows, all certified (270.5 s once the CP
communication and hybrid sharding joined `full`, before the engine decided a block's memory
and network checks once per combination of what they read).
Issue 34 (target <= 15 s): main at 30564d6 23.0 s (23.9 s real, 21.1 s user) and branch perf
(flag tables by parent indices, deeper projection cache) 23.5 s (24.4 s real, 22.0 s user),
run back to back at load ~0.9: the same 117 rows and 351 blocks, no measurable gain; not met.
Later (docs/benchmarks.md): 03e6cf2 23.2 s and 22.8 s, branch perf 21.8 s and 21.5 s, run
alternately at load ~2.2; not met. Back to back at load ~3 (2026-11-28): main 1a79d91 30.9 s
(19.1 s user), branch perf 9289eda 28.4 s (19.1 s user): no measurable change; not met.
Alternately with its base at load ~0.8 (2026-11-28 evening): main 16.6 s and 16.1 s, base
f36001c 21.8 s and 20.6 s, every row identical; not met (docs/benchmarks.md).
Alternately with main, quiet (2026-11-29): capacity classes on the memory terms alone 14.8, 15.6,
14.7, 15.0, 14.2 s against 16.0, 15.4, 14.6, 15.2, 14.8 s, every row identical: met by the median
(14.8 s), not by every run.
On a slower machine (2026-11-29, quiet; `bench_solve.py --skip-brute` 0.39 s against 0.28 s): branch
perf a2bfbf6 24.6 s, main 9c1cf5c 25.2 s right after, every row identical: not met.
The next stop on that machine (2026-11-29, quiet): flag tables held as products, the engine timing
only the mappings that pass: f96a845 13.7, 15.0, 14.0, 14.2, 14.1 s, the previous stop's be8d7ff
24.3, 21.1, 22.0, 21.0 s alternately, every row identical: met (median 14.1 s).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.system import Datatype
from solver.search.explain import explain
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="full", help="named mapping space (default full)")
    args = parser.parse_args()
    model = load_model(ROOT / "problems/models/gpt-1t-256b.yaml")
    system = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml").with_overrides(offload_gib=1024,
                                                                                      offload_gbps=100)
    started = time.perf_counter()
    result = explain(model, system, 4096, max_batch=3072, datatype=Datatype.float8, space=get_space(args.space))
    seconds = time.perf_counter() - started
    print(f"explain ({args.space}): {seconds:.1f} s for {len(result.rows)} (dimension, value) rows; "
          f"every row certified: {result.certified}; {result.blocks_scored:,} blocks scored exactly")
    print(f"best: MFU {result.winner.mfu:.1%}; runner-up {result.runner_up.dimension} = {result.runner_up.label} "
          f"(+{result.runner_up.best.iteration_time_s / result.winner.iteration_time_s - 1:.2%})")
    for row in sorted(result.rows, key=lambda r: -r.seconds)[:5]:
        print(f"  slowest: {row.dimension} = {row.label}: {row.seconds:.2f} s")


if __name__ == "__main__":
    main()
