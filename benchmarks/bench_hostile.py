"""Benchmark: the wall times issue 17 and issue 10 ask about, through the real command line.

    python benchmarks/bench_hostile.py [--repeat N]

1. `mapsat count --gpus 9223372036854775807` (2^63 - 1) on the 1.3B model: must answer in
   < 1 s (the divisors of a 64-bit GPU count come from its factorisation). Reported twice:
   the whole process (imports included) and the count itself (its JSON `seconds`).
2. `mapsat solve --time-limit 0.001` on the 1.3B model, 8 H100s: must return within 0.5 s
   of solving with a consistent status (not certified; a bound and a gap, or no incumbent).
   Reported: the solve's own `seconds`, the process wall time, and the status.
3. The fuzz test (tests/test_fuzz.py): examples per command and the total time.

Each figure is the best of --repeat runs (processes on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "problems/models/gpt-1.3b.yaml"
SYSTEM = "problems/systems/h100-80g-nvl8.yaml"


def mapsat(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", "from solver.cli.app import main; main()", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    return time.perf_counter() - started, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-fuzz", action="store_true")
    args = parser.parse_args()

    for space in ("full", "calculon-2023"):   # full: dp > the batch cap, no mapping; calculon-2023: batch = dp
        walls, inner = [], []
        for _ in range(args.repeat):
            wall, run = mapsat("count", "--model", MODEL, "--system", SYSTEM, "--gpus", str(2**63 - 1),
                               "--space", space, "--json")
            assert run.returncode == 0, run.stderr
            walls.append(wall)
            inner.append(json.loads(run.stdout)["seconds"])
        print(f"count --gpus 2^63-1 --space {space}: {json.loads(run.stdout)['mappings']:,} mappings; "
              f"count {min(inner) * 1e3:.1f} ms, process {min(walls):.2f} s (imports included)")

    walls, inner = [], []
    for _ in range(args.repeat):
        wall, run = mapsat("solve", "--model", MODEL, "--system", SYSTEM, "--gpus", "8", "--time-limit", "0.001",
                           "--json")
        answer = json.loads(run.stdout)
        walls.append(wall)
        inner.append(answer["seconds"])
    print(f"solve --time-limit 0.001: status {answer['status']}, certified {answer['certified_optimal']}, "
          f"gap {answer['gap']}, exit {run.returncode}; solve {min(inner):.3f} s, process {min(walls):.2f} s")

    if not args.skip_fuzz:
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow",
                              "tests/test_fuzz.py"],
                             capture_output=True, text=True, cwd=ROOT, timeout=900, env=os.environ)
        examples = os.environ.get("FUZZ_EXAMPLES", "500")
        verdict = "all passed" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
        print(f"fuzz: {examples} examples per command, 8 commands, {time.perf_counter() - started:.1f} s "
              f"(pytest process included): {verdict}")


if __name__ == "__main__":
    main()
