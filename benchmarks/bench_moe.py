"""Benchmark: CP-SAT solve against brute force on mixture-of-experts problems.

    python benchmarks/bench_moe.py [--problems mixtral-8x7b-64 mixtral-8x22b-256] [--workers N] [--no-brute]

Problems: Mixtral 8x7B on 64 H100s and Mixtral 8x22B on 256 H100s (problems/models/*/config.json,
seq_size 4096, problems/systems/h100-80g-nvl8.yaml, bfloat16, max batch 3072, space `full`).
For each, the closed-form count, the solve's time and answer, brute force's time and answer,
their ratio and whether the optima agree (same time to 1e-9 and the same mapping). Prints
figures only; asserts nothing about wall time.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from costmodel.evaluate import evaluate
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.system import Datatype
from solver.search.brute import scan
from solver.search.solve import SolverConfig, solve
from solver.space.count import count_mappings
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = {
    "mixtral-8x7b-64": ("problems/models/mixtral-8x7b/config.json", 64),
    "mixtral-8x22b-256": ("problems/models/mixtral-8x22b/config.json", 256),
}


def _describe(best, model, system) -> str:
    """A best mapping (the solver's Evaluation or brute force's Candidate), re-evaluated for its
    all-to-all term."""
    m = best.mapping
    ep_comm = evaluate(model, system, m).time.ep_comm_s
    return (f"{best.iteration_time_s:.4f} s, MFU {best.mfu:.1%}, tp{m.tp} cp{m.cp} ep{m.ep} pp{m.pp} dp{m.dp} "
            f"mb{m.microbatch_size} il{m.pipeline_interleaving}, ep_comm {ep_comm:.4f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--system", default=str(ROOT / "problems/systems/h100-80g-nvl8.yaml"))
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--no-brute", action="store_true", help="time the solve only")
    args = parser.parse_args()
    system, space = load_system(args.system), get_space("full")
    disagreements = 0
    for name in args.problems:
        path, gpus = PROBLEMS[name]
        model = load_model(ROOT / path, seq_size=4096)
        start = time.perf_counter()
        count = count_mappings(model, system, gpus, 3072, space).mappings
        print(f"{name}: {model.name} on {gpus} x {system.name}, bfloat16, space full, max batch 3072: "
              f"{count:,} mappings (closed form, {1e3 * (time.perf_counter() - start):.0f} ms)")
        start = time.perf_counter()
        solved = solve(model, system, gpus, max_batch=3072, datatype=Datatype.bfloat16, space=space,
                       config=SolverConfig(top_k=1, time_limit_s=1200, workers=args.workers or 1))
        solve_s = time.perf_counter() - start
        print(f"  solve: {solve_s:.1f} s, {solved.status} (certified {solved.certified_optimal}): "
              f"{_describe(solved.best, model, system)}")
        if args.no_brute:
            continue
        start = time.perf_counter()
        brute = scan(model, system, gpus, 3072, space, Datatype.bfloat16, top_k=1, workers=args.workers)
        brute_s = time.perf_counter() - start
        same = (brute.best is not None and math.isclose(brute.best.iteration_time_s, solved.best.iteration_time_s,
                                                        rel_tol=1e-9) and brute.best.mapping == solved.best.mapping)
        disagreements += not same
        print(f"  brute: {brute_s:.1f} s over {brute.evaluated:,} mappings ({brute.workers} workers): "
              f"{_describe(brute.best, model, system)}")
        print(f"  brute / solve = {brute_s / solve_s:.1f}x; optima agree: {'yes' if same else 'NO'}")
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
