"""Benchmark: how long `mapsat` takes to start, as a user runs it.

    python benchmarks/bench_startup.py

Wall time (best of 5, fresh processes) of `mapsat --help`, `mapsat count` on the brief's
256-block model and a 2^63 - 1 GPU count, and `mapsat eval` on a Selene point. Commands load
their modules when they run, and only `solve`, `explain` and `batch` load OR-Tools (which
brings pandas). Target (issue 15): `--help` < 0.3 s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPSAT = shutil.which("mapsat") or f"{sys.executable} -m solver.cli.app"
CASES = {
    "--help": ["--help"],
    "count (256 blocks, 4096 GPUs)": ["count", "--model", "problems/models/gpt-1t-256b.yaml", "--system",
                                      "problems/systems/h100-80g-nvl8.yaml", "--gpus", "4096", "--json"],
    "count (2^63 - 1 GPUs)": ["count", "--model", "problems/models/gpt-1t-256b.yaml", "--system",
                              "problems/systems/h100-80g-nvl8.yaml", "--gpus", str(2**63 - 1), "--json"],
    "eval (Selene point)": ["eval", "--model", "problems/models/megatron-22b.yaml", "--system",
                            "problems/systems/a100-80g-selene.yaml", "--mapping",
                            "problems/mappings/megatron-22b-seqsel.json", "--json"],
}


def main() -> None:
    for name, args in CASES.items():
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            subprocess.run([*MAPSAT.split(), *args], cwd=ROOT, check=True, capture_output=True)
            best = min(best, time.perf_counter() - started)
        print(f"mapsat {name}: {best:.2f} s (best of 5)")


if __name__ == "__main__":
    main()
