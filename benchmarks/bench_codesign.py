"""Benchmark: `mapsat codesign` against the sweep it replaces (`solve` at every grid point,
what `mapsat batch` runs), on the paper's questions (problems/paper/, the 2023 paper's
assumed H100, FP8, no runtime reserve and the `calculon-current` space, as in the paper's
batch files).

    python benchmarks/bench_codesign.py [QUESTION ...]     # default: all
    python benchmarks/bench_codesign.py --json out.json

Each question: a model, a GPU count, a grid of knob values, an order and a target. The
sweep is run once per (model, grid) and its answer read for each target; codesign runs
once per target. Prints both answers (they must be equal: the script exits 1 otherwise),
the best MFU, the systems codesign asked out of the grid, and both times.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.system import Datatype
from solver.search.codesign import Grid, Target, codesign, least_in_sweep, sweep
from solver.search.solve import SolverConfig
from solver.space.declaration import get_space
from solver.space.pins import batch_cap, pinned

ROOT = Path(__file__).resolve().parents[1]
SPACE = "calculon-current"
"""The space the paper batches run in (the former `full`, before ZeRO-2/3 and ZB-H1 joined it)."""
SYSTEM = load_system(ROOT / "problems/systems/h100-80g-nvl8-paper2023.yaml").with_overrides(runtime_reserve_gib=0)
SIZES = ("1t-128b", "2t-160b", "4t-160b", "8t-192b", "11t-224b", "18t-256b", "32t-288b", "64t-352b", "100t-384b",
         "128t-416b")
OFFLOAD = (0, 256, 512, 1024, 2048)

# name -> (models, gpus, base overrides, grid, minimize, targets, fixed batch)
QUESTIONS = {
    # Figure 4/5: the least offload capacity (then bandwidth) at >= 95 % of the grid's best MFU
    "offload": ([f"gpt-{s}" for s in SIZES], 4096, {},
                {"offload_gib": OFFLOAD, "offload_gbps": (50, 100, 200)}, ("offload_gib", "offload_gbps"),
                {"95% of best": Target("within", 0.05)}, None),
    # Figure 8: the least HBM (then offload) with which 100T and 128T train at all, and at 95 %
    "hbm": (["gpt-100t-384b", "gpt-128t-416b"], 4096, {"offload_gib": 2048, "offload_gbps": 100},
            {"hbm_gib": (80, 96, 120, 141, 192), "offload_gib": OFFLOAD}, ("hbm_gib", "offload_gib"),
            {"trains": Target("time", 1e6), "95% of best": Target("within", 0.05)}, None),
    # Figure 7: the NVLink domain 1T needs on 16,384 GPUs (no offload, or 512 GiB at 100 GB/s)
    "nvlink": (["gpt-1t-128b"], 16384, {"offload_gib": 512, "offload_gbps": 100},
               {"nvlink_size": (8, 16, 32, 64), "offload_gib": (0, 512)}, ("nvlink_size", "offload_gib"),
               {"95% of best": Target("within", 0.05)}, None),
    # The example: every knob varied (225 systems), MFU >= 70 % at a fixed batch of 3,072
    "full-grid": (["gpt-8t-192b"], 4096, {},
                  {"hbm_gib": (80, 96, 120, 141, 192), "offload_gib": OFFLOAD, "offload_gbps": (50, 100, 200),
                   "nvlink_size": (8, 16, 72)}, ("hbm_gib", "offload_gib"),
                  {"MFU 70%": Target("mfu", 0.70)}, 3072),
}


def _point(system: dict | None) -> str:
    return "none" if system is None else ", ".join(f"{k}={v:g}" for k, v in system.items())


def run(name: str) -> list[dict]:
    models, gpus, base, values, minimize, targets, batch = QUESTIONS[name]
    grid = Grid.build({k: tuple(float(x) for x in v) for k, v in values.items()}, minimize)
    system = SYSTEM.with_overrides(**base) if base else SYSTEM
    rows = []
    for model_name in models:
        model = load_model(ROOT / f"problems/paper/models/{model_name}.yaml")
        cap, pins = batch_cap(3072, batch, None, model.seq_size, False)
        args = dict(max_batch=cap, datatype=Datatype.float8, space=pinned(get_space(SPACE), pins),
                    config=SolverConfig(time_limit_s=120))
        started = time.perf_counter()
        swept = sweep(model, system, gpus, grid, **args)
        sweep_s = time.perf_counter() - started
        for label, target in targets.items():
            started = time.perf_counter()
            result = codesign(model, system, gpus, grid, target, **args)
            codesign_s = time.perf_counter() - started
            expected = least_in_sweep(grid, swept, target)
            best_swept = swept[grid.key(expected)] if expected else None
            same = result.system == expected and (
                expected is None or abs(result.best.iteration_time_s - best_swept.iteration_time_s)
                <= 1e-9 * best_swept.iteration_time_s)
            row = {"question": name, "model": model_name, "gpus": gpus, "target": label,
                   "codesign": result.system, "sweep": expected, "equal": same,
                   "mfu": result.best.mfu if result.best else None, "certified": result.certified_optimal,
                   "asked": result.questions, "grid": result.grid_size,
                   "codesign_s": codesign_s, "sweep_s": sweep_s}
            rows.append(row)
            print(f"{name:9} {model_name:14} {gpus:6} {label:12} codesign [{_point(result.system)}] "
                  f"sweep [{_point(expected)}] {'EQUAL' if same else 'DIFFERENT'}; MFU "
                  f"{'-' if row['mfu'] is None else format(row['mfu'], '.1%')}; asked {result.questions}/"
                  f"{result.grid_size}; {codesign_s:.1f} s vs {sweep_s:.1f} s ({sweep_s / codesign_s:.1f}x)",
                  flush=True)
    return rows


def main(argv: list[str]) -> int:
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    names = argv or list(QUESTIONS)
    rows = [row for name in names for row in run(name)]
    codesign_s = sum(r["codesign_s"] for r in rows)
    sweep_s = sum({(r["question"], r["model"]): r["sweep_s"] for r in rows}.values())
    print(f"total: codesign {codesign_s:.1f} s, sweep {sweep_s:.1f} s ({sweep_s / codesign_s:.1f}x); "
          f"{sum(r['equal'] for r in rows)}/{len(rows)} answers equal")
    if out:
        Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
