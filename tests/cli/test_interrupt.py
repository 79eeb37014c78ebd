"""Ctrl-C: CP-SAT stops at once, solve and brute return what they found so far (not
certified) and their commands exit 130 with one line; the other commands exit 130 too."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
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
from solver.search.solve import SolveStatus, SolverConfig, solve

ROOT = Path(__file__).resolve().parents[2]
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
    assert result.status == SolveStatus.interrupted and not result.certified_optimal
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


# ---- Ctrl-C as a user sends it: SIGINT to the command's process

# (Python's own SIGINT handler, as in a terminal: a test run started in the background
# inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored)
MAIN = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); " \
       "from solver.cli.app import main; main()"


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)


def _interrupt_after(process: subprocess.Popen, fragment: str, timeout_s: float = 120) -> tuple[str, str]:
    """SIGINT once a progress line on stderr holds `fragment`; (stdout, stderr) at the end."""
    seen = []
    deadline = time.monotonic() + timeout_s
    for line in process.stderr:
        seen.append(line)
        if fragment in line or time.monotonic() > deadline:
            break
    process.send_signal(signal.SIGINT)
    out, rest = process.communicate(timeout=timeout_s)
    return out, "".join(seen) + rest


def test_ctrl_c_stops_the_whole_plan_and_prints_the_counts_done():
    process = _start("plan", *ARGS[:4], "--gpus", "8-2048:8", "--tokens", "1e9")
    out, err = _interrupt_after(process, " of 256)")     # (lines begin after 2 s, some counts in)
    assert process.returncode == 130, err
    assert "progress: " in err and "interrupted (Ctrl-C) at" in err and "partial plan" in err
    assert "partial: interrupted by Ctrl-C" in " ".join(out.split()) and "Traceback" not in err
    planned = int(re.search(r"(\d+) GPU counts planned", " ".join(out.split()))[1])
    assert 1 <= planned < 256
    assert "chosen (fastest)" in out         # the choice among the counts done


def test_ctrl_c_stops_explain_and_prints_the_values_proven():
    process = _start("explain", *ARGS, "--json")
    out, err = _interrupt_after(process, "(value ")
    assert process.returncode == 130, err
    document = json.loads(out)
    assert document["partial"] is True and document["certified"] is False
    assert document["winner"] is not None and 1 <= len(document["rows"])
    assert "interrupted (Ctrl-C): a partial explanation" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["solve", "plan", "explain", "codesign", "count", "shape"])
def test_progress_goes_to_stderr_when_piped_and_with_json_unless_quiet(monkeypatch, command):
    """Past PROGRESS_AFTER_S (0 here) a piped command says what it does on stderr, one plain
    line per step, and stdout stays the JSON alone; --quiet silences it."""
    import solver.cli.progress as progress

    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.0)
    tiny = ["--model", "problems/models/gpt-1.3b.yaml", "--system", "problems/systems/a100-80g-selene.yaml",
            "--gpus", "8"]
    extra = {"solve": [], "plan": ["--tokens", "1e9"], "explain": ["--dims", "pp"],
             "codesign": ["--vary", "hbm_gib=40,80", "--target-mfu", "0.01"],
             "count": ["--feasible", "--space", "calculon-2023"]}.get(command, [])
    if command == "shape":   # shapes near a parameter count, each solved on the system
        tiny = ["--params", "1e10", "--rule-only", "--system", "problems/systems/a100-80g-selene.yaml", "--gpus", "8",
                "--seq-size", "2048", "--max-batch", "64"]
    loud = CliRunner().invoke(cli, [command, *tiny, *extra, "--json"])
    assert loud.exit_code == 0, loud.output
    lines = loud.stderr.splitlines()
    assert lines and all(line.startswith("progress: ") for line in lines) and len(set(lines)) == len(lines)
    json.loads(loud.stdout)
    quiet = CliRunner().invoke(cli, [command, *tiny, *extra, "--json", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_brute_piped_says_how_many_mappings_it_scored(monkeypatch, tmp_path):
    import yaml

    import solver.cli.progress as progress

    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.0)
    model = tmp_path / "tiny.yaml"
    model.write_text(yaml.safe_dump({"hidden": 64, "feedforward": 256, "seq_size": 64, "attn_heads": 4,
                                     "attn_size": 16, "num_blocks": 2, "vocab_size": 1000}))
    args = ["brute", "--model", model, "--system", "problems/systems/a100-80g-selene.yaml", "--gpus", "2",
            "--max-batch", "8", "--workers", "1", "--json"]
    loud = CliRunner().invoke(cli, args)
    assert loud.exit_code == 0 and re.search(r"^progress: scored [0-9,]+ of [0-9,]+ mappings$", loud.stderr, re.M)
    json.loads(loud.stdout)
    assert CliRunner().invoke(cli, [*args, "--quiet"]).stderr == ""
