"""Shared test fixtures: where the shipped problems live, small valid inputs to break on
purpose, and a helper that writes them to files."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml

from costmodel.space.choices import CPComm
from costmodel.encoding import code

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "problems"
MODELS_DIR = PROBLEMS / "models"
SYSTEMS_DIR = PROBLEMS / "systems"
MAPPINGS_DIR = PROBLEMS / "mappings"
A100_SYSTEM = SYSTEMS_DIR / "a100-80g-selene.yaml"
H100_SYSTEM = SYSTEMS_DIR / "h100-80g-nvl8.yaml"
# The measurements of the brief live in shared/, beside the clone (as in CI).

# A small valid model, system and mapping. Tests copy one and break a single field.
MODEL_DATA: dict[str, Any] = {
    "name": "tiny", "hidden": 1024, "feedforward": 4096, "seq_size": 2048,
    "attn_heads": 16, "attn_size": 64, "num_blocks": 24, "vocab_size": 51200,
}
SYSTEM_DATA: dict[str, Any] = {
    "name": "tiny-gpu",
    "compute": {
        "bfloat16": {"matrix_tflops": 100.0, "vector_tflops": 10.0,
                     "matrix_efficiency": [[0, 0.5], [1.0e9, 0.9]], "vector_efficiency": [[0, 0.8]]},
    },
    "hbm": {"capacity_gib": 80, "bandwidth_gbps": 2000, "efficiency": [[0, 0.5], [1.0e6, 0.9]]},
    "networks": [
        {"name": "nvlink", "size": 8, "bandwidth_gbps": 300, "efficiency": 0.8, "latency_us": 10,
         "processor_usage": 0.15},
        {"name": "infiniband", "size": 1024, "bandwidth_gbps": 25, "efficiency": 0.9, "latency_us": 20,
         "processor_usage": 0.05},
    ],
}
MAPPING_DATA: dict[str, Any] = {
    "num_procs": 16, "tensor_par": 2, "pipeline_par": 4, "data_par": 2,
    "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
    "batch_size": 16, "microbatch_size": 2, "datatype": "bfloat16",
}


def examples(default: int, slow: int):
    """Run a property test twice: with `default` examples in the default run, and with
    `slow` examples behind the slow marker (`python -m pytest -m slow`). The test takes an
    `examples` argument and hands it to the @settings of the @given function it runs."""
    return pytest.mark.parametrize("examples", [pytest.param(default, id=f"{default}-examples"),
                                                pytest.param(slow, id=f"{slow}-examples", marks=pytest.mark.slow)])


def cases(table, slow: dict[str, str] | None = None) -> list:
    """Parameters for a table of cases whose first element is the id; those named in `slow`
    (id: why) are marked slow and left out of the default run."""
    slow = slow or {}
    unknown = set(slow) - {case[0] for case in table}
    if unknown:
        raise ValueError(f"slow names cases the table does not hold: {sorted(unknown)}")
    return [pytest.param(case, id=case[0], marks=pytest.mark.slow if case[0] in slow else ()) for case in table]


@pytest.fixture
def model_data() -> dict[str, Any]:
    return copy.deepcopy(MODEL_DATA)


@pytest.fixture
def system_data() -> dict[str, Any]:
    return copy.deepcopy(SYSTEM_DATA)


@pytest.fixture
def mapping_data() -> dict[str, Any]:
    return copy.deepcopy(MAPPING_DATA)


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, Any], Path]:
    """write_file(name, content) -> path in tmp_path. Strings are written as they are; other
    content is dumped as JSON for *.json names and as YAML otherwise."""

    def write(name: str, content: Any) -> Path:
        path = tmp_path / name
        if isinstance(content, str):
            path.write_text(content)
        elif path.suffix == ".json":
            path.write_text(json.dumps(content, indent=2))
        else:
            path.write_text(yaml.safe_dump(content, sort_keys=False))
        return path

    return write


def ring_only(space):
    """`space` offering cp_comm = p2p only (the K/V ring), as it was before cp_comm: for tests
    about something else, whose cp > 1 mappings would otherwise come three times over;
    tests/test_cp_comm.py and test_space_count's declaration walk cover the other two."""
    return dataclasses.replace(space, offered=space.offered + (("cp_comm", (code("cp_comm", CPComm.p2p),)),))


def whole_group(space):
    """`space` offering shard = all only (ZeRO over the whole dp·cp group), as it was before
    hybrid sharding: for tests about something else, whose ZeRO >= 1 mappings would otherwise
    come once per shard group; tests/test_hybrid_sharding.py and the declaration walk cover it."""
    return dataclasses.replace(space, offered=space.offered + (("shard", (0,)),))


def plain(space):
    """`space` as it was before cp_comm and hybrid sharding: the K/V ring and the whole group."""
    return whole_group(ring_only(space))


def solve_equals_brute_force(model, system, gpus: int, max_batch: int, space, datatype, kernels, top_k: int = 1,
                             time_limit_s: float = 120):
    """Solve and brute-force one problem over `space` and assert they agree: the answer
    certified optimal, the best mapping the same, the top `top_k` times equal to 1e-9.
    Returns (the solve's result, brute force's) for the caller's own checks."""
    from solver.search.brute import scan
    from solver.search.solve import SolveStatus, SolverConfig, solve

    result = solve(model, system, gpus, max_batch=max_batch, datatype=datatype, space=space, kernels=kernels,
                   config=SolverConfig(top_k=top_k, time_limit_s=time_limit_s, workers=1))
    reference = scan(model, system, gpus, max_batch, space, datatype, kernels, top_k=top_k, workers=1)
    assert result.certified_optimal and result.status == SolveStatus.optimal and result.gap == 0.0
    assert reference.best is not None and result.best.mapping == reference.best.mapping
    assert [e.iteration_time_s for e in result.top] == pytest.approx([c.iteration_time_s for c in reference.top],
                                                                     rel=1e-9)
    return result, reference


def cp_sat_solution_count(model) -> int:
    """How many solutions a CP-SAT model has (enumerated by one worker, to the end)."""
    from ortools.sat.python import cp_model

    class Count(cp_model.CpSolverSolutionCallback):
        n = 0

        def on_solution_callback(self) -> None:
            self.n += 1

    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    solver.parameters.catch_sigint_signal = False   # CP-SAT would leave SIGINT at its default after
    counter = Count()
    status = solver.Solve(model, counter)
    assert status in (cp_model.OPTIMAL, cp_model.INFEASIBLE), solver.StatusName(status)
    return counter.n


def assert_block_floors_below_exact(model, system, gpus: int, max_batch: int, datatype, space=None) -> list:
    """Every block floor (the solver's per-block lower bound, which certifies and cuts
    blocks) sits at or below every feasible exact time of its block, rounding included, and
    no block's HBM or offload bytes vary with a time-only dimension (TIME_ONLY_DIMENSIONS:
    the engine checks capacity once for them all), nor its structural checks with a dimension
    they do not list (STRUCTURE_DIMENSIONS);
    returns the skeletons of the blocks checked (one entry per block with a feasible mapping).
    `space`: `full` unless given."""
    from costmodel.terms.context import Context
    from costmodel.evaluate import (STRUCTURE_DIMENSIONS, TIME_ONLY_DIMENSIONS, evaluate_arrays_in_context,
                                    structure_fits)
    from costmodel.ops import distinct_rows
    from solver.search.cpsat.constraints import Problem
    from solver.search.cpsat.surrogate import add_bounds
    from solver.search.cpsat.model import local_batches, structure_model
    from solver.search.engine import SEARCHED_FLAGS
    from solver.space.declaration import get_space
    from solver.space.enumerate import build_rows, plan

    space = space or get_space("full")
    c = Context.build(model, system, datatype)
    the_plan = plan(model, system, gpus, max_batch, space, chunk_rows=1 << 62)
    problem = Problem(model, system, gpus, max_batch, space)
    m, v = structure_model(problem, the_plan.skeletons, flags=SEARCHED_FLAGS)
    bounds = add_bounds(m, v, c, gpus, local_batches(problem, v), space, c.memory.hbm_capacity_bytes,
                        skeletons=the_plan.skeletons)
    checked = []
    for sk, table in zip(the_plan.skeletons, the_plan.flag_tables):
        for i, il in enumerate(sk.interleavings):
            for j, mb in enumerate(sk.microbatches):
                start = (i * len(sk.microbatches) + j) * len(table)
                rows = build_rows(space, sk, table, start, start + len(table))
                ev = evaluate_arrays_in_context(c, rows)
                # the engine decides memory once per combination of the other dimensions
                first, inverse, _ = distinct_rows([column for name, column in rows.columns.items()
                                                   if name not in TIME_ONLY_DIMENSIONS])
                for held in (ev.hbm_bytes, ev.offload_bytes):
                    assert np.array_equal(held, held[first][inverse]), "memory read a time-only dimension"
                # ... and the structural checks once per combination of what they read
                first, inverse, _ = distinct_rows([rows.columns[name] for name in STRUCTURE_DIMENSIONS])
                fits = structure_fits(c, rows)
                assert np.array_equal(fits, fits[first][inverse]), "a structural check read another dimension"
                if ev.feasible.any():
                    assert bounds.block_floors[(*sk.split, il, mb)] <= ev.iteration_time_s[ev.feasible].min()
                    checked.append(sk)
    return checked


@pytest.fixture(autouse=True)
def no_terminal_width(monkeypatch):
    """Commands write as they do to a pipe (tables 200 columns wide) whatever the shell's COLUMNS
    says: the tests read their lines whole (pytest-xdist's workers, which the default run uses,
    have COLUMNS=80); the tests of narrow output give COLUMNS themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(autouse=True)
def no_progress_lines(monkeypatch):
    """Commands run in-process say nothing of their progress (a slow machine would otherwise put
    `progress:` lines into the output the tests parse); the progress tests turn it back on,
    and commands run as subprocesses keep it."""
    import solver.cli.progress as progress

    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 1e6)
