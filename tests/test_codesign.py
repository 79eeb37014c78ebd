"""`mapsat codesign`: the least system equals what a full sweep of the same grid (`solve` at
every point) gives, for lexicographic and cost orders and every kind of target; every
smaller candidate's proof agrees with the sweep; capacities never change a mapping's time;
bad input is one line."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import cases
from costmodel.evaluate import Evaluation, evaluate
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.cli.app import cli
from solver.search.codesign import Grid, Target, codesign, least_in_sweep, reaches, sweep, system_at
from solver.search.solve import SolverConfig, solve
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]
A100 = load_system(ROOT / "problems/systems/a100-80g-selene.yaml").with_overrides(runtime_reserve_gib=0)
H100 = load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml").with_overrides(runtime_reserve_gib=0)
MODEL = Model(name="m", hidden=2048, feedforward=8192, seq_size=2048, attn_heads=16, attn_size=128, num_blocks=16)
# `full` without context parallelism: the questions here are about capacities, and cp
# (which multiplies the space several times at 16-32 GPUs) would only slow the sweeps
# every answer is checked against; codesign reads the space like any other dimension.
FULL = dataclasses.replace(get_space("full"), cp_max=1)

GRID_4 = {"hbm_gib": (2, 4, 8, 16), "offload_gib": (0, 8, 64), "offload_gbps": (10, 50), "nvlink_size": (4, 8)}
GRID_2 = {"hbm_gib": (2, 8), "offload_gib": (0, 64), "offload_gbps": (10, 50), "nvlink_size": (4, 8)}
CASES = [  # (id, system, gpus, cap, values, minimize, cost, target)
    ("hbm-first-5pct", A100, 16, 64, GRID_4, ("hbm_gib",), None, Target("within", 0.05)),
    ("offload-first-8pct", A100, 16, 64, GRID_4, ("offload_gib", "hbm_gib"), None, Target("within", 0.08)),
    ("nvlink-first-time", A100, 16, 64, GRID_4, ("nvlink_size",), None, Target("time", 0.26)),
    ("cost-weights", A100, 16, 64, GRID_4, (), {"hbm_gib": 10.0, "offload_gib": 1.0}, Target("within", 0.1)),
    ("h100-mfu", H100, 32, 128, {"hbm_gib": (1, 2, 3, 6), "offload_gib": (0, 4, 32)}, (), None, Target("mfu", 0.3)),
    ("unreachable", A100, 16, 64, {"hbm_gib": (2, 4), "offload_gib": (0, 8)}, (), None, Target("time", 1e-6)),
    # the lexicographic, cost and MFU questions again, of fewer systems: what the default run asks
    ("hbm-first-5pct-16-systems", A100, 16, 64, GRID_2, ("hbm_gib",), None, Target("within", 0.05)),
    ("cost-weights-16-systems", A100, 16, 64, GRID_2, (), {"hbm_gib": 10.0, "offload_gib": 1.0}, Target("within", 0.1)),
    ("h100-mfu-6-systems", H100, 32, 128, {"hbm_gib": (1, 2, 6), "offload_gib": (0, 4)}, (), None, Target("mfu", 0.3)),
    ("hbm-first-25pct-4-systems", A100, 16, 64, {"hbm_gib": (2, 4), "offload_gib": (0, 8)}, ("hbm_gib",), None,
     Target("within", 0.25)),
]
SLOW = {  # the sweep each answer is checked against solves every system of the grid (~0.6 s each)
    "hbm-first-5pct": "48 systems", "offload-first-8pct": "48 systems", "nvlink-first-time": "48 systems",
    "cost-weights": "48 systems", "h100-mfu": "12 systems of 32 GPUs"}


@functools.cache
def sweep_by_point(system_name: str, gpus: int, cap: int, values: tuple) -> dict[frozenset, Evaluation | None]:
    """`sweep` over the grid of `values`, by grid point: made once, shared by the cases that ask
    about the same systems in another order (four A100 cases sweep the same 48 systems, two the
    same 16, two the same 4)."""
    system = {A100.name: A100, H100.name: H100}[system_name]
    grid = Grid.build(dict(values))
    swept = sweep(MODEL, system, gpus, grid, max_batch=cap, datatype=Datatype.bfloat16, space=FULL)
    return {frozenset(point.items()): swept[grid.key(point)] for point in grid.candidates()}


def swept_by_key(system: System, gpus: int, cap: int, grid: Grid) -> dict[tuple, Evaluation | None]:
    """What `sweep(MODEL, system, gpus, grid, ...)` returns: the best at every point, by `grid.key`."""
    by_point = sweep_by_point(system.name, gpus, cap, tuple(sorted(grid.values.items())))
    return {grid.key(point): by_point[frozenset(point.items())] for point in grid.candidates()}


@pytest.mark.parametrize("case", cases(CASES, slow=SLOW))
def test_codesign_equals_the_sweep(case):
    _, system, gpus, cap, values, minimize, cost, target = case
    grid = Grid.build(values, minimize, cost)
    kwargs = dict(max_batch=cap, datatype=Datatype.bfloat16, space=FULL)
    result = codesign(MODEL, system, gpus, grid, target, **kwargs)
    swept = swept_by_key(system, gpus, cap, grid)
    answer = least_in_sweep(grid, swept, target)
    times = {key: ev.iteration_time_s if ev is not None else None for key, ev in swept.items()}
    assert result.certified_optimal
    assert result.system == answer
    smaller = [p for p in grid.candidates() if answer is None or grid.key(p) < grid.key(answer)]
    assert [v.system for v in result.proof] == smaller       # every smaller candidate, least first
    for verdict in result.proof:
        swept = times[grid.key(verdict.system)]
        if verdict.dominated_by is None:                      # asked: the sweep's certified best time
            assert (swept is None) == (verdict.best_time_s is None), verdict
            if swept is not None:
                assert math.isclose(swept, verdict.best_time_s, rel_tol=1e-9), verdict
        else:                                                 # by dominance: a true lower bound
            assert grid.dominates(verdict.dominated_by, verdict.system)
            assert swept is None or (verdict.best_time_s is not None and swept >= verdict.best_time_s * (1 - 1e-9))
        assert swept is None or swept > result.target_time_s * (1 + 1e-9)
    if answer is not None:
        assert math.isclose(result.best.iteration_time_s, times[grid.key(answer)], rel_tol=1e-9)
        assert result.best.feasible
        assert reaches(result.best, result.target_time_s)
        assert result.questions < result.grid_size             # structure, not a sweep


def test_lexicographic_order_and_ties_are_deterministic():
    grid = Grid.build({"offload_gib": (0, 8), "hbm_gib": (2, 4)}, ("hbm_gib",))
    assert grid.order == ("hbm_gib", "offload_gib")
    assert [(p["hbm_gib"], p["offload_gib"]) for p in grid.candidates()] == [(2, 0), (2, 8), (4, 0), (4, 8)]
    weighted = Grid.build({"hbm_gib": (2, 4), "offload_gib": (0, 8)}, (), {"hbm_gib": 4.0})
    # cost ties (hbm 2 with either offload) fall back to the lexicographic order
    assert [(p["hbm_gib"], p["offload_gib"]) for p in weighted.candidates()] == [(2, 0), (2, 8), (4, 0), (4, 8)]


@pytest.mark.parametrize("hbm_small,hbm_big,offload_small,offload_big", [(4, 80, 0, 64), (8, 16, 8, 2048)])
def test_capacity_enters_only_feasibility(hbm_small, hbm_big, offload_small, offload_big):
    """The monotonicity co-design rests on: a mapping's time and footprint do not depend on
    the capacities, so more capacity only adds feasible mappings."""
    base = A100.with_overrides(offload_gib=64, offload_gbps=50)
    best = solve(MODEL, base, 16, max_batch=64, space=FULL).top
    small = system_at(base, {"hbm_gib": hbm_small, "offload_gib": offload_small})
    big = system_at(base, {"hbm_gib": hbm_big, "offload_gib": offload_big})
    for ev in best:
        mapping = ev.mapping
        if (mapping.weight_offload or mapping.activations_offload or mapping.optimizer_offload) and offload_small == 0:
            continue      # not a mapping of a system without offload memory
        a, b = evaluate(MODEL, small, mapping), evaluate(MODEL, big, mapping)
        assert a.iteration_time_s == b.iteration_time_s and a.hbm_bytes == b.hbm_bytes
        assert not a.feasible or b.feasible


def test_more_offload_bandwidth_is_never_slower():
    """The monotonicity that prunes offload bandwidth: for mappings that offload everything,
    the time at 10 GB/s is at least that at 100 GB/s, feasibility the same."""
    base = A100.with_overrides(offload_gib=64, offload_gbps=50)
    best = solve(MODEL, base, 16, max_batch=64, space=FULL, config=SolverConfig(top_k=5)).top
    slow, fast = (system_at(base, {"offload_gbps": g}) for g in (10, 100))
    offloading = 0
    for ev in best:
        for flags in ({}, {"weight_offload": True, "activations_offload": True, "optimizer_offload": True}):
            mapping = ev.mapping.model_copy(update=flags)
            a, b = evaluate(MODEL, slow, mapping), evaluate(MODEL, fast, mapping)
            assert a.iteration_time_s >= b.iteration_time_s and a.feasible == b.feasible
            offloading += a.iteration_time_s > b.iteration_time_s
    assert offloading      # the bandwidth did matter somewhere


ARGS = ["codesign", "--model", str(ROOT / "problems/models/gpt-1.3b.yaml"),
        "--system", str(ROOT / "problems/systems/h100-80g-nvl8.yaml"), "--gpus", "8"]


def test_cli_json_has_system_best_certificate_and_proof():
    result = CliRunner().invoke(cli, [*ARGS, "--max-batch", "64", "--within", "5%", "--vary", "hbm_gib=3,4,8,80",
                                      "--vary", "offload_gib=0,64", "--minimize", "hbm_gib", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out["system"]) == {"hbm_gib", "offload_gib"}
    assert out["certified_optimal"] is True
    assert out["best"]["iteration_time_s"] <= out["target_time_s"] * (1 + 1e-9)
    for entry in out["proof"]:
        assert entry["verdict"] in ("infeasible", "slower")
        assert entry["system"]["hbm_gib"] < out["system"]["hbm_gib"] or (
            entry["system"]["hbm_gib"] == out["system"]["hbm_gib"]
            and entry["system"]["offload_gib"] < out["system"]["offload_gib"])


@pytest.mark.parametrize("extra,needle", [
    (["--within", "5%", "--vary", "dram_gib=1,2"], "--vary: 'dram_gib' is not a knob"),
    (["--within", "5%", "--vary", "hbm_gib=8,4"], "--vary hbm_gib=8,4: values must be ascending"),
    (["--within", "5%", "--vary", "hbm_gib=-1,4"], "values must be positive"),
    (["--within", "5%", "--vary", "hbm_gib=2,4"], "--vary hbm_gib=2: 2.0 GiB leaves nothing beside"),
    (["--within", "5%", "--vary", "nvlink_size=4.5,8"], "--vary nvlink_size=4.5: not a whole number"),
    (["--within", "5%", "--vary", "hbm_gib=a,b"], "--vary hbm_gib=a,b: the values must be numbers"),
    (["--target-mfu", "70", "--vary", "hbm_gib=4,8"], "--target-mfu: 70 is not a fraction in (0, 1)"),
    (["--target-mfu", "0.7", "--target-time", "3", "--vary", "hbm_gib=4,8"], "give exactly one of"),
    (["--within", "five", "--vary", "hbm_gib=4,8"], "--within: 'five' is not a fraction"),
    (["--within", "5%", "--vary", "hbm_gib=4,8", "--minimize", "nvlink_size"],
     "--minimize: 'nvlink_size' is not a varied"),
    (["--within", "5%", "--vary", "hbm_gib=4,8", "--cost", "hbm_gib=x"], "--cost hbm_gib=x"),
])
def test_cli_bad_input_is_one_line(extra, needle):
    result = CliRunner().invoke(cli, [*ARGS, *extra])
    assert result.exit_code == 1, result.output
    assert needle in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_unreachable_target_exits_1_after_the_proof():
    result = CliRunner().invoke(cli, [*ARGS, "--target-time", "1e-6", "--vary", "hbm_gib=4,8", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.output[: result.output.rindex("}") + 1])
    assert out["system"] is None and len(out["proof"]) == 2
    assert "no system of the grid reaches the target" in result.output


def test_cli_mfu_target_needs_one_global_batch():
    """With a batch cap that dp=4 and dp=2 round differently (4 and 6 sequences), MFU is not
    one function of time: a one-line error suggesting --batch."""
    result = CliRunner().invoke(cli, [*ARGS, "--max-batch", "6", "--target-mfu", "0.3", "--vary", "hbm_gib=4,8"])
    assert result.exit_code == 1, result.output
    assert "--target-mfu: the space's splits train different global batches (4, 6)" in result.output
    fixed = CliRunner().invoke(cli, [*ARGS, "--batch", "4", "--target-mfu", "0.01", "--vary", "hbm_gib=4,8"])
    assert fixed.exit_code == 0, fixed.output


CP_SAT_ALONE = [case for case in CASES if case[0] in ("hbm-first-25pct-4-systems", "hbm-first-5pct-16-systems",
                                                      "hbm-first-5pct", "cost-weights")]


@pytest.mark.parametrize("case", cases(CP_SAT_ALONE, slow={"hbm-first-5pct-16-systems": "~7 s: 6 CP-SAT questions",
                                                           "hbm-first-5pct": "~15 s: 10 CP-SAT questions",
                                                           "cost-weights": "~50 s: 19 CP-SAT questions"}))
def test_the_cp_sat_path_alone_equals_the_sweep(case, monkeypatch):
    """With no warm start and every block floor 0 (still a lower bound), no question can end at
    the closing check: each runs CP-SAT under its capacity assumption. Same answer, same proof."""
    import solver.search.codesign as codesign_module
    import solver.search.engine as engine_module

    monkeypatch.setattr(engine_module, "WARM_START_BLOCKS", 0)
    real_floors = codesign_module.block_lower_bounds
    monkeypatch.setattr(codesign_module, "block_lower_bounds",
                        lambda *a: {k: 0.0 for k in real_floors(*a)})
    rounds = []
    real_search = engine_module.Engine.search

    def search(self, question):
        found = real_search(self, question)
        rounds.append(found.rounds)
        return found

    monkeypatch.setattr(engine_module.Engine, "search", search)
    _, system, gpus, cap, values, minimize, cost, target = case
    grid = Grid.build(values, minimize, cost)
    kwargs = dict(max_batch=cap, datatype=Datatype.bfloat16, space=FULL)
    result = codesign(MODEL, system, gpus, grid, target, **kwargs)
    asked = list(rounds)
    swept = swept_by_key(system, gpus, cap, grid)
    assert len(asked) == result.questions and all(r >= 1 for r in asked) and result.certified_optimal
    assert result.system == least_in_sweep(grid, swept, target)
    assert math.isclose(result.best.iteration_time_s, swept[grid.key(result.system)].iteration_time_s, rel_tol=1e-9)
    for verdict in result.proof:
        if verdict.dominated_by is None:
            ev = swept[grid.key(verdict.system)]
            assert (ev is None) == (verdict.best_time_s is None)
            assert ev is None or math.isclose(ev.iteration_time_s, verdict.best_time_s, rel_tol=1e-9)


def test_cli_pareto_asks_every_system_and_draws(tmp_path):
    png = tmp_path / "front.png"
    result = CliRunner().invoke(cli, [*ARGS, "--max-batch", "64", "--within", "5%", "--vary", "hbm_gib=3,4,8",
                                      "--vary", "offload_gib=0,64", "--pareto", str(png), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["questions"] == 6          # the whole grid, for the front
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
