"""Error bands (costmodel/measured/error_bands.py): the band formula by hand, the class of a
prediction, what the answers print and carry, and the shipped bands file."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

from conftest import PROBLEMS, SYSTEMS_DIR
from costmodel.inputs.load import load_model, load_system
from costmodel.measured.error_bands import (BANDS_FILE, COVERAGE, PRIOR_RUNS, UNKNOWN, Band, band_of, error_class,
                                            load_bands, pooled_sd, t_quantile)
from solver.cli.app import cli

GPT13 = str(PROBLEMS / "models" / "gpt-1.3b.yaml")


def test_a_band_is_a_student_t_prediction_interval_with_a_pooled_spread():
    errors = [-0.10, -0.02, 0.04]
    prior = 0.05
    n, mean = 3, sum(errors) / 3
    own = sum((e - mean) ** 2 for e in errors)
    sd = math.sqrt((own + PRIOR_RUNS * prior ** 2) / (n - 1 + PRIOR_RUNS))
    half = t_quantile(0.9, n - 1 + PRIOR_RUNS) * sd * math.sqrt(1 + 1 / n)
    band = band_of("x", errors, prior)
    assert (band.low, band.high, band.runs) == (pytest.approx(mean - half), pytest.approx(mean + half), 3)
    assert band_of("x", [], prior) is None
    # the t quantile against its tabulated values (ν = 5: 1.476, ν = 30: 1.310)
    assert t_quantile(0.9, 5) == pytest.approx(1.476, abs=0.003) and t_quantile(0.9, 30) == pytest.approx(1.310, abs=0.002)
    assert COVERAGE == 0.80


def test_pooled_spread_ignores_single_run_classes():
    assert pooled_sd({"a": [0.0, 0.2], "b": [0.1]}) == pytest.approx(math.sqrt(0.02))


def test_a_band_turns_into_the_measured_time_it_allows():
    band = Band("c", 10, -0.1, 0.25, 0.0)
    assert band.time_range(100.0) == (pytest.approx(80.0), pytest.approx(100 / 0.9))


def test_the_class_of_a_prediction():
    h100 = load_system(SYSTEMS_DIR / "h100-80g-nvl8.yaml")
    gb200 = load_system(SYSTEMS_DIR / "gb200-186g-nvl72.yaml")
    a100 = load_system(SYSTEMS_DIR / "a100-80g-selene.yaml")
    dense = load_model(GPT13)
    moe = load_model(PROBLEMS / "models" / "mixtral-8x7b" / "config.json", seq_size=4096)
    assert error_class(h100, dense, "fp8-tensorwise", "bfloat16") == "hopper/fp8/dense"
    assert error_class(gb200, moe, "nvfp4", "bfloat16") == "blackwell/fp4/moe"
    assert error_class(gb200, dense, "mxfp8", "bfloat16") == "blackwell/fp8/dense"
    assert error_class(a100, dense, None, "float16") == "ampere/bf16/dense"
    assert error_class(h100, dense, None, "float8") == "hopper/fp8/dense"


def test_the_shipped_bands_cover_the_classes_of_the_shipped_runs():
    bands = load_bands()
    assert {"hopper/fp8/dense", "hopper/bf16/dense", "blackwell/fp8/dense", "blackwell/fp4/dense",
            "blackwell/fp8/moe"} <= set(bands)
    for band in bands.values():
        assert band.low < band.high and band.runs >= 1
    document = json.loads(BANDS_FILE.read_text())
    assert "calibrate --runs" in document["source"]


def test_solve_prints_the_band_and_json_carries_it():
    args = ["solve", "--model", GPT13, "--system", str(SYSTEMS_DIR / "h100-80g-nvl8.yaml"), "--gpus", "8"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    flat = re.sub(r"[│\s]+", " ", text.output)
    assert "measured would be (error band)" in flat and "hopper/bf16/dense" in flat
    document = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    band, best = document["error_band"], document["best"]["iteration_time_s"]
    shipped = load_bands()["hopper/bf16/dense"]
    assert (band["time_low_s"], band["time_high_s"]) == pytest.approx(shipped.time_range(best), rel=1e-12)


def test_a_class_with_no_measured_runs_says_its_error_is_unknown():
    args = ["solve", "--model", GPT13, "--system", str(SYSTEMS_DIR / "a100-80g-selene.yaml"), "--gpus", "8"]
    result = CliRunner().invoke(cli, args)
    flat = re.sub(r"[│\s]+", " ", result.output)          # the table wraps the cell
    assert result.exit_code == 0 and UNKNOWN in flat
    document = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert document["error_band"] == {"class": "ampere/bf16/dense", "runs": 0, "unknown": UNKNOWN}


def test_plan_gives_days_and_gpu_hours_as_ranges():
    args = ["plan", "--model", GPT13, "--system", str(SYSTEMS_DIR / "h100-80g-nvl8.yaml"), "--gpus", "8",
            "--tokens", "1e9", "--quiet"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "with its error band:" in text.output and "days" in text.output
    document = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    band = document["error_band"]
    chosen = [row for row in document["counts"] if row["num_gpus"] == document["chosen"]][0]
    low, high = band["wall_days_range"]
    assert low < chosen["wall_days"] < high
    assert band["gpu_hours_range"][0] < chosen["gpu_hours"] < band["gpu_hours_range"][1]


def test_solve_lists_the_mappings_the_models_error_cannot_tell_from_the_best():
    args = ["solve", "--model", GPT13, "--system", str(SYSTEMS_DIR / "h100-80g-nvl8.yaml"), "--gpus", "8",
            "--top-k", "8", "--json"]
    document = json.loads(CliRunner().invoke(cli, args).stdout)
    best, ceiling = document["best"]["iteration_time_s"], document["error_band"]["time_high_s"]
    top = [entry["iteration_time_s"] for entry in document["top"]]
    listed = document["indistinguishable"]
    # exactly the top's mappings after the best whose predicted time is within the best's band
    assert [row["rank"] for row in listed] == [i + 1 for i, t in enumerate(top) if i > 0 and t <= ceiling]
    assert best <= ceiling
    for row in listed:
        mine, theirs = document["best"]["mapping"], document["top"][row["rank"] - 1]["mapping"]
        assert row["differs_in"] == sorted(k for k in mine if mine[k] != theirs.get(k)) and row["differs_in"]
