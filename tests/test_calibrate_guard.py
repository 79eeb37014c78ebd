"""`mapsat calibrate --runs` cannot ruin a system file (issue 37): it fits only the whole-step
terms its runs determine, refuses a fit outside a term's physical range or worse out of sample
than the terms it replaces (one line, exit 1, nothing written), `--force` writes anyway and says
so in the file, and runs nobody can fit from (none usable, too many) are refused too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from costmodel.calibration.step_fit import (LOCO_TOLERANCE, RELATIVE_SE_LIMIT, STEP_PARAMETERS, FittedStep,
                                           fit_step, relative_error)
from costmodel.calibration.step_render import common_medians, calibrate_runs, refusal
from costmodel.errors import InputError
from costmodel.inputs.load import load_system
from costmodel.calibration.step_fit import scores_with_step
from costmodel.measured.run_files import read_runs
from costmodel.measured.run_scoring import RunInputs
from costmodel.inputs.step import WholeStep
from solver.cli.app import cli

ROOT = Path(__file__).resolve().parents[1]
H100_FILE = ROOT / "problems" / "systems" / "h100-80g-nvl8.yaml"
HOSTILE = ROOT / "tests" / "data" / "hostile-two-runs.yaml"
EXAMPLE = ROOT / "problems" / "runs" / "example.yaml"
SINGLE = ROOT / "problems" / "runs" / "h200-single-gpu-pytorch.json"


def _calibrate(tmp_path: Path, *args: str) -> tuple[object, Path]:
    copy = tmp_path / H100_FILE.name
    shutil.copy(H100_FILE, copy)
    result = CliRunner().invoke(cli, ["calibrate", *args, "--system", str(copy)], prog_name="mapsat")
    return result, copy


@pytest.mark.parametrize("runs", [HOSTILE, EXAMPLE], ids=["user-two-runs", "example-alone"])
def test_two_runs_alone_fit_nothing_and_write_nothing(tmp_path, runs):
    result, copy = _calibrate(tmp_path, "--runs", str(runs), "--without-shipped-runs")
    assert result.exit_code == 1, result.output
    assert "fitted (shared by every system): none" in result.output
    assert "held at the replaced file's values" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: refused:") and "nothing written" in last
    assert copy.read_text() == H100_FILE.read_text()


def _solve_8b_s(system: Path) -> float:
    """`solve` of Llama 3 8B on 8 GPUs of `system` (sequence 8,192, batch 128): the best step, s."""
    args = ["solve", "--model", str(ROOT / "problems/models/llama-3.1-8b/config.json"), "--seq-size", "8192",
            "--batch", "128", "--system", str(system), "--gpus", "8", "--top-k", "1", "--json"]
    result = CliRunner().invoke(cli, args, prog_name="mapsat")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["best"]["iteration_time_s"]


def test_force_writes_and_the_header_says_so(tmp_path):
    result, copy = _calibrate(tmp_path, "--runs", str(HOSTILE), "--without-shipped-runs", "--force")
    assert result.exit_code == 0, result.output
    text = copy.read_text()
    assert "# Written with --force although refused: refused: the 2 usable runs determine none" in text
    # the terms the runs do not determine are the file's own: the 8B answer is unchanged
    assert load_system(copy).step == load_system(H100_FILE).step
    assert _solve_8b_s(copy) == pytest.approx(_solve_8b_s(H100_FILE), rel=0.10)
    again, _ = _calibrate(tmp_path, "--runs", str(HOSTILE), "--without-shipped-runs", "--force")
    assert again.exit_code == 0 and copy.read_text().count("# Written with --force") == 1


@pytest.mark.slow   # 1-2 min: fits the shipped runs and the user's, and leaves each configuration out
@pytest.mark.parametrize("runs", [HOSTILE, EXAMPLE], ids=["user-two-runs", "example"])
def test_user_runs_extend_the_shipped_ones(tmp_path, runs):
    result, copy = _calibrate(tmp_path, "--runs", str(runs))
    assert "megatron-bridge-pretraining.json, before" in result.output
    if result.exit_code == 0:
        assert "fitted (shared by every system): kernel_gap_us" in result.output
    else:
        assert result.output.strip().splitlines()[-1].startswith("error: refused:")
        assert copy.read_text() == H100_FILE.read_text()
    assert _solve_8b_s(copy) == pytest.approx(_solve_8b_s(H100_FILE), rel=0.10)


def test_a_term_outside_its_physical_range_is_refused():
    step = WholeStep(kernel_gap_us=78100, power_window_ms=1.7, allocator_fragmentation=0.0)
    fit = FittedStep(step, (), (), (), {"kernel_gap_us": 1.0, "power_window_ms": 0.1,
                                        "allocator_fragmentation": 0.001})
    reason = refusal(fit, ())
    assert "kernel_gap_us 78100 is outside its physical range 0..50" in reason


def test_ranges_are_physical():
    ranges = {p.name: (p.low, p.high) for p in STEP_PARAMETERS}
    assert ranges["kernel_gap_us"][1] <= 100                 # tens of µs, not tens of ms
    assert ranges["power_window_ms"] == (0.0, 10_000.0)      # milliseconds to seconds
    assert ranges["allocator_fragmentation"] == (0.0, 0.5)
    assert all(p.why for p in STEP_PARAMETERS)


def _run_file(tmp_path: Path, runs: list[dict]) -> Path:
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({"description": "made by a test", "runs": runs}))
    return path


def _hostile_rows() -> list[dict]:
    return yaml.safe_load(HOSTILE.read_text())["runs"]


def test_a_huge_run_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr("solver.cli.calibrate.MAX_RUN_FILE_BYTES", 1000)
    path = _run_file(tmp_path, [dict(_hostile_rows()[0], name=f"run-{i}") for i in range(20)])
    monkeypatch.setattr("solver.cli.calibrate.read_runs", lambda path: pytest.fail("parsed a file over the cap"))
    result, copy = _calibrate(tmp_path, "--runs", str(path), "--without-shipped-runs")
    assert result.exit_code == 1 and "MB; calibrate reads run files of at most" in result.output
    assert result.output.count("\n") == 1 and copy.read_text() == H100_FILE.read_text()


def test_a_fit_pool_over_the_cap_is_refused(monkeypatch):
    monkeypatch.setattr("costmodel.calibration.step_fit.MAX_RUNS", 1)
    with pytest.raises(InputError, match="2 runs to fit: at most 1"):
        fit_step(read_runs(HOSTILE))


def test_no_usable_run_is_refused(tmp_path):
    rows = _hostile_rows()
    rows[0]["step_time_s"] = 1e300
    rows[1]["step_time_s"] = 1e-6
    result, copy = _calibrate(tmp_path, "--runs", str(_run_file(tmp_path, rows)), "--without-shipped-runs")
    assert result.exit_code == 1
    assert result.output.startswith("error: no usable run to fit") and result.output.count("\n") == 1
    assert "nan" not in result.output and copy.read_text() == H100_FILE.read_text()


def test_too_many_runs_are_refused_before_fitting(tmp_path, monkeypatch):
    monkeypatch.setattr("solver.cli.calibrate.MAX_RUNS", 1)      # the cap, 10 × MAX_RUNS: 10 runs here
    row = _hostile_rows()[0]
    rows = [dict(row, name=f"run-{i}") for i in range(11)]
    result, copy = _calibrate(tmp_path, "--runs", str(_run_file(tmp_path, rows)), "--without-shipped-runs")
    assert result.exit_code == 1 and "more than 10 runs" in result.output
    assert result.output.count("\n") == 1 and copy.read_text() == H100_FILE.read_text()


# ---- the refusal rule, on random small run sets

_SINGLE = tuple(read_runs(SINGLE))[:8]          # single-GPU iterations: cheap to score
_OTHERS = tuple(read_runs(EXAMPLE)) + tuple(read_runs(HOSTILE))
OUTCOMES: set[str] = set()


def _made(chosen: list[int], gap_us: float, noise: list[float]) -> list:
    """The chosen single-GPU runs with the step times the model gives at a true gap of `gap_us`
    (the other terms the shipped file's), each off by its noise: runs that determine the gap,
    or a gap past its range, or no term at all."""
    runs = [_SINGLE[i] for i in chosen]
    truth = load_system(H100_FILE).step.model_copy(update={"kernel_gap_us": gap_us})
    scores = scores_with_step(runs, RunInputs(), truth)
    return [r.model_copy(update={"step_time_s": s.predicted_step_s * (1 + e)}) for r, s, e in zip(runs, scores, noise)]


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chosen=st.lists(st.integers(0, len(_SINGLE) - 1), min_size=1, max_size=5, unique=True),
       gap_us=st.sampled_from([3.0, 20.0, 400.0]), noise=st.lists(st.floats(-0.3, 0.3), min_size=5, max_size=5),
       others=st.lists(st.integers(0, len(_OTHERS) - 1), max_size=2, unique=True))
def test_what_is_written_obeys_the_refusal_rule(tmp_path_factory, chosen, gap_us, noise, others):
    """Whatever the runs: a fit is written only if every fitted term is determined and in its
    range and the fit is no worse left out than the replaced terms; otherwise nothing is written,
    and what is not determined keeps the replaced file's value."""
    runs = _made(chosen, gap_us, noise) + [_OTHERS[i] for i in others]
    copy = tmp_path_factory.mktemp("guard") / H100_FILE.name
    shutil.copy(H100_FILE, copy)
    try:
        result = calibrate_runs({"runs": runs}, [copy])
    except InputError as err:          # no usable run: refused before fitting
        assert "no usable run" in str(err)
        OUTCOMES.add("unusable")
        return
    fit = result.fit
    fitted = [p for p in STEP_PARAMETERS if p.name not in fit.held]
    for p in fitted:
        assert relative_error(p, getattr(fit.step, p.name), fit.standard_errors[p.name]) <= RELATIVE_SE_LIMIT
    before, after, count = common_medians(fit.before, [s for f in result.loco for s in f.scores])
    in_range = all(p.low <= getattr(fit.step, p.name) <= p.high for p in fitted)
    acceptable = bool(fitted) and in_range and count > 0 and after <= before + LOCO_TOLERANCE
    OUTCOMES.add("written" if acceptable else "refused")
    assert (result.refused is None) == acceptable
    assert bool(result.texts) == acceptable
    shipped = load_system(H100_FILE).step
    for name in fit.held:
        assert getattr(fit.step, name) == getattr(shipped, name)


def test_validate_runs_reports_the_terms_it_holds():
    result = CliRunner().invoke(cli, ["validate", "--runs", str(HOSTILE), "--json"], prog_name="mapsat")
    assert result.exit_code == 0, result.output
    terms = json.loads(result.output)["whole_step_terms"]
    assert terms["held"] == ["kernel_gap_us", "power_window_ms", "allocator_fragmentation"]
    assert terms["standard_errors"] == {} and terms["fitted"]["kernel_gap_us"] == load_system(H100_FILE).step.kernel_gap_us
