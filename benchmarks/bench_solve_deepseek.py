"""Benchmark: `mapsat solve` on DeepSeek-V3 (its Hugging Face config.json) on 2,048 H100s,
4,096-token sequences, a global batch of 15,360 sequences (the technical report's), space
`full`, certified. Runs the command itself in a child process and prints its wall time, its
CPU time and its peak resident memory (the child's maximum RSS).

    python benchmarks/bench_solve_deepseek.py

The command it times:

    mapsat solve --model problems/models/deepseek-v3/config.json --seq-size 4096 \\
                 --system problems/systems/h100-80g-nvl8.yaml --gpus 2048 --batch 15360 --quiet

Target (issue 34): certified in <= 20 s (54.9 s and 1.75 GB reported when the issue was
filed). Measured on the 2-core development machine shared with other sessions (branch perf,
before the flag-table and distinct-row changes): 58.0 s wall, 37.8 s user CPU, 2.51 GB peak
RSS at load ~2, best 26.7300 s (tp2 cp2 ep8 etp1 pp1 dp512, mb 15), certified, 833,712 of
8,491,891,584 mappings scored in 17 blocks. Most of that time builds the block tables
(solver.search.cpsat.block_tables: the block's terms over the (tp, cp, ep, etp, microbatch)
grid, costmodel/terms), not the search: the target is not met. After them (commit f778bb8
and the next), load ~1: 43.6 s wall, 43.7 s CPU, 2.52 GB, the same answer. Back to back at load ~0.9: main (30564d6) 52.0 s wall and CPU,
2.51 GB; branch perf 46.6 s, 2.52 GB: within this machine's run-to-run noise (~10 %).
Since the MoE kernel inventory (267 billion mappings, 6.9 GB): 79.5 s CPU at 03e6cf2, 60.0 s
on branch perf (block-table minima, one dict conversion, the stage tables' later layouts on
their own rows), the same answer; every figure in docs/benchmarks.md. Not met.
Since the per-kind floors (75 blocks scored, 8.76 GB), back to back at load ~3: main 1a79d91
88.6 s CPU (90.5 s wall), branch perf 9289eda 75.7 s CPU (76.4 s wall; table views, bulk
reads of the floors' rows), the same answer. Not met.
Quiet, 2026-11-28 evening: main b42258b 36.7 s wall, 33.5 s user, 2.56 GB against base f36001c
88.0 s wall, 66.3 s user, 8.76 GB (block grid without offload switches where no tier exists, the
MTP block once per distinct block, the stage grids in chunks), the same answer. Not met.
Quiet, 2026-11-29, back to back: main f01211b (capacity classes on the memory terms alone) 34.9 s
wall, 35.0 s CPU, 2.56 GB against 2154168 35.2 s: the same answer (certified in 33.95 s). Not met.
Quiet, 2026-11-29, alternately: the block floors computed as the ranking reaches them (340 of 11,975
skeletons) 24.9 and 25.5 s wall, 2.33 GB, against main 2aca109's 34.4 and 35.0 s, 2.56 GB: the same
answer. Not met.
Quiet, 2026-11-29 (a slower machine: main 9c1cf5c 38.1 s), alternately: the stage grid's offload
switches off only without a tier, keyed tables read by position, the AG redo gridded only where
free, the mean block's read fields alone, no offload traffic where no switch is on: 18.9 and
19.0 s wall, 0.81 GB, the same answer. Met.
Quiet, 2026-11-29, the same machine, alternately: f96a845 (flag tables as products, the engine timing
only the mappings that pass) 19.2, 18.3 and 18.4 s wall, 0.77 GB; be8d7ff 18.3, 18.2 and 19.7 s,
0.81 GB: the same answer. Met.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["solve", "--model", "problems/models/deepseek-v3/config.json", "--seq-size", "4096",
           "--system", "problems/systems/h100-80g-nvl8.yaml", "--gpus", "2048", "--batch", "15360", "--quiet"]


def main() -> int:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from solver.cli.app import main; main()", *COMMAND], cwd=ROOT,
                          capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    header = done.stdout.splitlines()[:2]
    print("\n".join(header))
    print(f"mapsat solve (DeepSeek-V3, 2,048 H100s): {wall_s:.1f} s wall, {usage.ru_utime + usage.ru_stime:.1f} s CPU, "
          f"peak RSS {usage.ru_maxrss / 1e6:.2f} GB (exit {done.returncode})")
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
