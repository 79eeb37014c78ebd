"""Benchmark: `mapsat plan` over 8 GPU counts against the 8 separate `mapsat solve` runs a
user would otherwise make, on Llama 3.1 70B (seq 8,192, a 16M-token batch) on the shipped
H100 file.

    python benchmarks/bench_plan.py [--repeat R]

Prints four times: the 8 `mapsat solve` processes one after another (what a user runs:
each pays the start-up), the 8 library `solve()` calls in one process (the search alone),
the same calls sharing one CountShare (the search `mapsat plan` runs), and one `mapsat
plan` process over the 8 counts; and the
ratios, the first against the target: one `mapsat plan` over N counts in at most
TARGET_RATIO of the time of N separate `mapsat solve` runs. Exits 1 if any count's plan
time differs from its `solve` time. `--repeat R`: each time the best of R runs (a shared
machine's load comes and goes).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "problems/models/llama-3.1-70b/config.json"
SYSTEM = ROOT / "problems/systems/h100-80g-nvl8.yaml"
COUNTS = [256, 512, 768, 1024, 1536, 2048, 3072, 4096]
BATCH_TOKENS = 16777216
MAPSAT = shutil.which("mapsat") or "mapsat"
TARGET_RATIO = 0.2
PROBLEM = ["--model", str(MODEL), "--seq-size", "8192", "--system", str(SYSTEM), "--batch-tokens", str(BATCH_TOKENS)]


def mapsat(*args: str, repeat: int = 1) -> tuple[float, str]:
    """The best wall time of `repeat` runs of one `mapsat` process, and its output."""
    best = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        out = subprocess.run([MAPSAT, *args], capture_output=True, text=True, cwd=ROOT, check=False)
        best = min(best, time.perf_counter() - started)
    return best, out.stdout


def main() -> int:
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    solve_times, solve_best = 0.0, {}
    for n in COUNTS:
        seconds, out = mapsat("solve", *PROBLEM, "--gpus", str(n), "--top-k", "1", "--json", repeat=repeat)
        solve_times += seconds
        doc = json.loads(out) if out.strip() else {}
        solve_best[n] = doc["best"]["iteration_time_s"] if doc.get("best") else None
    from costmodel.inputs.load import load_model, load_system
    from solver.search.engine import CountShare
    from solver.search.solve import SolverConfig, solve
    from solver.space.declaration import get_space
    from solver.space.pins import pinned

    model, system = load_model(MODEL, seq_size=8192), load_system(SYSTEM)
    space = pinned(get_space("full"), (("batch", (BATCH_TOKENS // 8192,)),))
    library_s = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        for n in COUNTS:
            solve(model, system, n, max_batch=BATCH_TOKENS // 8192, space=space, config=SolverConfig(top_k=1))
        library_s = min(library_s, time.perf_counter() - started)
    shared_s = math.inf
    for _ in range(repeat):
        share, started = CountShare(), time.perf_counter()
        for n in COUNTS:
            solve(model, system, n, max_batch=BATCH_TOKENS // 8192, space=space, config=SolverConfig(top_k=1),
                  share=share)
        shared_s = min(shared_s, time.perf_counter() - started)
    plan_s, out = mapsat("plan", *PROBLEM, "--gpus", ",".join(map(str, COUNTS)), "--tokens", "15e12", "--json",
                         repeat=repeat)
    doc = json.loads(out)
    plan_best = {c["num_gpus"]: (c["phases"][0]["iteration_time_s"] if c["phases"] else None) for c in doc["counts"]}
    print(f"{len(COUNTS)} counts {COUNTS} of {MODEL.parent.name} on {SYSTEM.stem}")
    print(f"  {len(COUNTS)} `mapsat solve` processes: {solve_times:.1f} s")
    print(f"  {len(COUNTS)} library solve() calls:    {library_s:.1f} s (one process, imports paid before)")
    print(f"  the same calls sharing one CountShare: {shared_s:.1f} s (what plan's search takes)")
    print(f"  one `mapsat plan` process:       {plan_s:.1f} s")
    ratio = plan_s / solve_times
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"  plan / solve processes = {ratio:.2f} (target <= {TARGET_RATIO:.2f}: {verdict}); "
          f"plan / library calls = {plan_s / library_s:.2f}")
    wrong = [n for n in COUNTS if plan_best[n] != solve_best[n]]
    if wrong:
        print(f"  DIFFERENT best times at {wrong}: plan {[plan_best[n] for n in wrong]}, "
              f"solve {[solve_best[n] for n in wrong]}")
        return 1
    print("  every count's best time equal to `mapsat solve`'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
