"""--grad-datatype: the gradient datatype reaches every search command (solve, brute, count
--feasible, explain, codesign, shape) beside --attention, changes the answer where memory is
tight, is named in the headers and recorded in the JSON; a bad value is one usage line.

The tight problem: a 4-block, hidden-2048 model on 4 H100s whose HBM is cut to a few GiB.
Brute force over its 10,296 mappings: at 3.5 GiB none fits with float32 main gradients
and 42 fit with 16-bit ones; at 4 GiB both fit and the certified best differs (float32:
tp4 dp1, 0.023 s; 16-bit gradients: tp2 dp2 with ZeRO-2, 0.0212 s)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from conftest import H100_SYSTEM
from solver.cli.app import cli

TIGHT = {"name": "tight", "hidden": 2048, "feedforward": 8192, "seq_size": 2048, "attn_heads": 32, "attn_size": 64,
         "num_blocks": 4}
SYSTEM = str(H100_SYSTEM)
# without context parallelism and hybrid sharding, as measured
SPACE = ["--gpus", "4", "--max-batch", "8", "--fix", "cp=1", "--fix", "shard=all"]


@pytest.fixture
def model_path(tmp_path) -> str:
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(TIGHT))
    return str(path)


def mapsat(*args: str):
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="mapsat")
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def problem(command: str, model_path: str, hbm_gib: float, *more: str) -> list[str]:
    return [command, "--model", model_path, "--system", SYSTEM, *SPACE, "--hbm-gib", str(hbm_gib), *more]


def grads(value: str) -> list[str]:
    """The option as a user writes it; the default is also given explicitly, so both paths run."""
    return ["--grad-datatype", value]


# ---------------------------------------------------------------- the answer changes
def test_solve_16bit_gradients_make_a_mapping_fit(model_path):
    fp32 = mapsat(*problem("solve", model_path, 3.5, "--json"), *grads("float32"))
    assert fp32.exit_code == 1 and "infeasible" in fp32.stderr
    half = mapsat(*problem("solve", model_path, 3.5, "--json"), *grads("16bit"))
    assert half.exit_code == 0, half.output
    best = json.loads(half.stdout)["best"]
    assert best["mapping"]["grad_datatype"] == "16bit" and best["mapping"]["fused_attention"] is True


def test_solve_16bit_gradients_change_the_optimum(model_path):
    answers = {}
    for value in ("float32", "16bit"):
        result = mapsat(*problem("solve", model_path, 4, "--json"), *grads(value))
        assert result.exit_code == 0, result.output
        answers[value] = json.loads(result.stdout)["best"]
    assert answers["16bit"]["iteration_time_s"] < answers["float32"]["iteration_time_s"]
    assert answers["16bit"]["mapping"]["grad_datatype"] == "16bit"
    assert answers["float32"]["mapping"]["grad_datatype"] == "float32"


def test_brute_counts_and_records_the_gradient_datatype(model_path):
    fp32 = mapsat(*problem("brute", model_path, 3.5, "--json", "--workers", "1"))   # the default
    assert fp32.exit_code == 1
    fp32_json = json.loads(fp32.stdout)
    assert (fp32_json["feasible"], fp32_json["grad_datatype"]) == (0, "float32")
    half = mapsat(*problem("brute", model_path, 3.5, "--json", "--workers", "1"), *grads("16bit"))
    assert half.exit_code == 0, half.output
    half_json = json.loads(half.stdout)
    assert (half_json["feasible"], half_json["grad_datatype"], half_json["attention"]) == (42, "16bit", "fused")
    assert half_json["best"]["mapping"]["grad_datatype"] == "16bit"


def test_count_feasible_counts_and_records_the_gradient_datatype(model_path):
    counted = {}
    for value in ("float32", "16bit"):
        result = mapsat(*problem("count", model_path, 3.5, "--feasible", "--workers", "1", "--json"), *grads(value))
        assert result.exit_code == 0, result.output
        counted[value] = json.loads(result.stdout)
    assert counted["float32"]["mappings"] == counted["16bit"]["mappings"] == 10_296   # the space is the same
    assert (counted["float32"]["feasible"], counted["16bit"]["feasible"]) == (0, 42)
    assert counted["16bit"]["grad_datatype"] == "16bit" and counted["float32"]["grad_datatype"] == "float32"


def test_explain_winner_changes(model_path):
    winners = {}
    for value in ("float32", "16bit"):
        result = mapsat(*problem("explain", model_path, 4, "--dims", "tp", "--json"), *grads(value))
        assert result.exit_code == 0, result.output
        winners[value] = json.loads(result.stdout)["winner"]
    assert winners["16bit"]["iteration_time_s"] < winners["float32"]["iteration_time_s"]
    assert winners["16bit"]["mapping"]["grad_datatype"] == "16bit"


def test_codesign_least_hbm_changes(model_path):
    least = {}
    for value in ("float32", "16bit"):
        result = mapsat("codesign", "--model", model_path, "--system", SYSTEM, *SPACE, "--target-time", "0.0285",
                        "--vary", "hbm_gib=3.5,4,5", "--json", *grads(value))
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        least[value] = answer["system"]["hbm_gib"]
        assert answer["best"]["mapping"]["grad_datatype"] == value
    assert least == {"float32": 5, "16bit": 4}


def test_shape_solved_mfu_changes_and_is_recorded():
    mfu = {}
    for value in ("float32", "16bit"):
        result = mapsat("shape", "--params", "1e10", "--rule-only", "--seq-size", "2048", "--gpus", "8",
                        "--system", SYSTEM, "--hbm-gib", "24", "--max-batch", "8", "--json", *grads(value))
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["grad_datatype"] == value
        solved = document["shapes"][0]["solved"]
        assert solved["status"] == "optimal" and solved["mapping"]["grad_datatype"] == value
        mfu[value] = solved["mfu"]
    assert mfu["16bit"] > mfu["float32"]


# ---------------------------------------------------------------- headers
HEADER_RUNS = {
    "solve": lambda m: problem("solve", m, 4),
    "brute": lambda m: problem("brute", m, 4, "--workers", "1", "--top-k", "1"),
    "count": lambda m: problem("count", m, 4, "--feasible", "--workers", "1"),
    "explain": lambda m: problem("explain", m, 4, "--dims", "tp"),
    "codesign": lambda m: ["codesign", "--model", m, "--system", SYSTEM, *SPACE, "--within", "5%",
                           "--vary", "hbm_gib=4,5"],
}


@pytest.mark.parametrize("command", HEADER_RUNS)
def test_header_names_16bit_gradients_only_when_given(model_path, command):
    default = mapsat(*HEADER_RUNS[command](model_path))
    assert default.exit_code == 0, default.output
    first = default.stdout.splitlines()[0]
    assert "fused attention" in first and "gradients" not in first, first
    half = mapsat(*HEADER_RUNS[command](model_path), "--attention", "unfused", *grads("16bit"))
    assert half.exit_code == 0, half.output
    assert "unfused attention, 16-bit gradients" in half.stdout.splitlines()[0], half.stdout


def test_shape_header_names_16bit_gradients():
    result = mapsat("shape", "--params", "1e10", "--rule-only", "--seq-size", "2048", "--gpus", "8",
                    "--system", SYSTEM, "--hbm-gib", "24", "--max-batch", "8", *grads("16bit"))
    assert result.exit_code == 0, result.output
    assert "MFU on h100-80g-nvl8, fused attention, 16-bit gradients" in result.stdout


# ---------------------------------------------------------------- bad input
BAD_RUNS = {
    "solve": lambda m: ["solve", "--model", m, "--system", SYSTEM, *SPACE],
    "brute": lambda m: ["brute", "--model", m, "--system", SYSTEM, *SPACE],
    "count": lambda m: ["count", "--model", m, "--system", SYSTEM, *SPACE, "--feasible"],
    "explain": lambda m: ["explain", "--model", m, "--system", SYSTEM, *SPACE],
    "codesign": lambda m: ["codesign", "--model", m, "--system", SYSTEM, *SPACE, "--within", "5%",
                           "--vary", "hbm_gib=4"],
    "shape": lambda m: ["shape", "--params", "1e12"],
}


@pytest.mark.parametrize("command", BAD_RUNS)
@pytest.mark.parametrize("value", ["fp8", "16", ""])
def test_bad_grad_datatype_is_one_usage_line(model_path, command, value):
    result = mapsat(*BAD_RUNS[command](model_path), "--grad-datatype", value)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    assert "'--grad-datatype'" in errors[0] and f"'{value}' is not one of 'float32', '16bit'" in errors[0]


def test_help_describes_the_option():
    help_text = " ".join(mapsat("solve", "--help").stdout.split())
    assert "--grad-datatype [float32|16bit]" in help_text
    assert "float32 main gradients (Megatron-LM)" in help_text and "not searched" in help_text


def test_batch_file_with_a_bad_grad_datatype_is_one_error_line(model_path, tmp_path):
    batch = tmp_path / "batch.yaml"
    batch.write_text(yaml.safe_dump({"models": [TIGHT], "systems": SYSTEM, "gpus": 4, "grad_datatype": "fp16"}))
    result = mapsat("batch", str(batch), "--out", str(tmp_path / "out"), "--quiet")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: {batch}: field 'grad_datatype.0' 'fp16': Input should be "
                                          f"'float32' or '16bit'"]
