"""Benchmark: how fast the exact cost model evaluates mappings.

    python benchmarks/bench_costmodel.py

Prints the scalar evaluator's time per mapping (the explained path, with and without
building the problem's constants) and the vectorized evaluator's mappings per second on one
core, over the first mappings of the brief's 1.1T problem. Targets (issue 2): scalar
<= 200 µs; vectorized >= 1,000,000 mappings/s.
"""

from __future__ import annotations

import time
from pathlib import Path

from costmodel.terms.context import Context
from costmodel.evaluate import evaluate, evaluate_arrays_in_context, evaluate_in_context
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.system import Datatype
from solver.space.enumerate import plan
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    model = load_model(ROOT / "problems/models/gpt-1t-256b.yaml")
    system = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml").with_overrides(offload_gib=1024,
                                                                                      offload_gbps=100)
    the_plan = plan(model, system, 4096, 3072, get_space("full"), chunk_rows=1 << 16)
    chunks = [the_plan.build(chunk) for chunk in the_plan.chunks[:40]]
    rows = sum(len(c) for c in chunks)
    c = Context.build(model, system, Datatype.float8)
    mappings = [chunks[0].to_mapping(i, Datatype.float8) for i in range(0, len(chunks[0]), 97)]

    started = time.perf_counter()
    for mapping in mappings:
        evaluate(model, system, mapping)
    full = (time.perf_counter() - started) / len(mappings)
    started = time.perf_counter()
    for mapping in mappings:
        evaluate_in_context(c, mapping)
    in_context = (time.perf_counter() - started) / len(mappings)
    print(f"scalar: {full * 1e6:.0f} µs per mapping with input checks and constants, "
          f"{in_context * 1e6:.0f} µs with constants built once ({len(mappings)} mappings)")

    best = 0.0
    for _ in range(3):
        started = time.perf_counter()
        for chunk in chunks:
            evaluate_arrays_in_context(c, chunk)
        best = max(best, rows / (time.perf_counter() - started))
    print(f"vectorized: {best:,.0f} mappings/s on one core ({rows:,} mappings in chunks of {len(chunks[0]):,}, best of 3)")


if __name__ == "__main__":
    main()
