"""Ctrl-C: CP-SAT stops at once, solve and brute return what they found so far (not
certified) and their commands exit 130 with one line; the other commands exit 130 too."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from ortools.sat.python import cp_model

import solver.search.brute as brute_module
import solver.search.cpsat.run as run_module
import solver.search.engine as engine_module
from costmodel.inputs.load import load_model, load_system
from solver.cli.app import cli
from solver.search.cpsat.run import interruptible_solve
from solver.search.solve import SolverConfig, solve

ROOT = Path(__file__).resolve().parents[1]
MODEL = load_model(ROOT / "problems/models/gpt3-13b.yaml")
SYSTEM = load_system(ROOT / "problems/systems/a100-80g-selene.yaml")
ARGS = ["--model", "problems/models/gpt3-13b.yaml", "--system", "problems/systems/a100-80g-selene.yaml",
        "--gpus", "64"]


class _Slow(cp_model.CpSolverSolutionCallback):
    """Takes a millisecond per solution: enumerating 2^20 of them would take many minutes."""

    def on_solution_callback(self) -> None:
        time.sleep(0.001)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler for the test (a CP-SAT solve elsewhere in the process that
    caught SIGINT itself leaves the default, process-ending action behind)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_cp_sat_at_once(python_sigint):
    """A search with minutes of work is stopped by SIGINT within seconds, as KeyboardInterrupt."""
    m = cp_model.CpModel()
    for i in range(20):
        m.NewBoolVar(f"b{i}")
    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.max_time_in_seconds = 600
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    started = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            interruptible_solve(m, solver, _Slow())
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 10


def test_interrupted_solve_returns_the_best_so_far(monkeypatch):
    """The warm start scores one block (a best exists), the first CP-SAT round is
    interrupted: solve returns that best, not certified."""
    def interrupt_first_round(m, solver, callback=None):
        interrupt_first_round.calls += 1
        raise KeyboardInterrupt

    interrupt_first_round.calls = 0
    monkeypatch.setattr(run_module, "checked_solve", interrupt_first_round)
    monkeypatch.setattr(engine_module, "WARM_START_BLOCKS", 1)   # leave work for the rounds
    result = solve(MODEL, SYSTEM, 64, config=SolverConfig(top_k=3))
    assert interrupt_first_round.calls == 1
    assert result.status == "interrupted" and not result.certified_optimal
    assert result.best is not None and result.best.feasible


def test_interrupted_commands_exit_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "checked_solve", interrupted)
    monkeypatch.setattr(engine_module, "WARM_START_BLOCKS", 0)
    result = CliRunner().invoke(cli, ["solve", *ARGS])
    assert result.exit_code == 130 and "interrupted (Ctrl-C)" in result.output
    monkeypatch.setattr(brute_module, "_evaluate_chunk", interrupted)
    result = CliRunner().invoke(cli, ["brute", *ARGS, "--workers", "1"])
    assert result.exit_code == 130 and "interrupted (Ctrl-C) after scoring 0 of" in result.output
    result = CliRunner().invoke(cli, ["count", *ARGS, "--feasible", "--workers", "1"])
    assert result.exit_code == 130 and result.output.strip().endswith("interrupted (Ctrl-C)")
