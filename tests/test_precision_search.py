"""Precision recipes through the search and the command line: the certified optimum equals brute
force under each recipe, every command takes --precision (and records it), batch files take it
as a key with a precision part in the problem id, and bad combinations are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import plain, solve_equals_brute_force

from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_system
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.space.declaration import get_space

ROOT = Path(__file__).resolve().parents[1]
H100_FILE = ROOT / "problems/systems/h100-80g-nvl8.yaml"
B200_FILE = ROOT / "problems/systems/b200-180g-nvl8.yaml"
H100, B200 = load_system(H100_FILE), load_system(B200_FILE)


def llama_like(blocks: int, hidden: int, heads: int, kv_heads: int, seq: int = 2048) -> Model:
    return Model(name=f"llama{blocks}", hidden=hidden, feedforward=8 * hidden // 3 // 128 * 128, seq_size=seq,
                 attn_heads=heads, attn_size=hidden // heads, num_blocks=blocks, kv_heads=kv_heads, mlp="swiglu",
                 norm="rmsnorm", position="rope", tied_embeddings=False, vocab_size=32000)


CASES = [
    # (id, model, system, gpus, max_batch, kernels)
    ("h100-fp8-tensorwise", llama_like(8, 4096, 32, 8), H100, 16, 64, Kernels(precision=Precision.fp8_tensorwise)),
    ("h100-fp8-delayed-tight-hbm", llama_like(16, 4096, 32, 8), H100.with_overrides(hbm_gib=12), 16, 32,
     Kernels(precision=Precision.fp8_delayed, optimizer_state="bf16")),
    ("h100-fp8-blockwise-bf16-gather", llama_like(8, 2048, 16, 4), H100, 8, 32,
     Kernels(precision=Precision.fp8_blockwise)),
    ("b200-mxfp8", llama_like(8, 4096, 32, 8), B200, 16, 64, Kernels(precision=Precision.mxfp8)),
    ("b200-nvfp4-bf16-ends", llama_like(8, 4096, 32, 8), B200, 16, 64,
     Kernels(precision=Precision.nvfp4, bf16_first_last_blocks=1)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_solve_equals_brute_force_under_each_recipe(case):
    _, model, system, gpus, max_batch, kernels = case
    space = plain(get_space("full"))         # as before cp_comm and hybrid sharding
    result, _ = solve_equals_brute_force(model, system, gpus, max_batch, space, Datatype.bfloat16, kernels, top_k=2)
    assert result.best.mapping.precision is kernels.precision and result.best.feasible


# ---------------------------------------------------------------- the command line

def mapsat(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="mapsat")
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


@pytest.fixture
def model_path(tmp_path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(llama_like(4, 2048, 16, 4).model_dump(mode="json")))
    return str(path)


SPACE = ["--gpus", "4", "--max-batch", "8"]


@pytest.mark.parametrize("command", ["solve", "brute", "explain", "count"])
def test_each_search_command_takes_the_recipe_and_names_it(model_path, command):
    extra = ["--feasible"] if command == "count" else []
    result = mapsat(command, "--model", model_path, "--system", H100_FILE, *SPACE, *extra,
                    "--precision", "fp8-tensorwise", "--optimizer-state", "bf16")
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())      # tables wrap long headers
    assert "fp8-tensorwise recipe (low-precision weight all-gather, bf16 Adam moments)" in words


def test_json_records_state_the_recipe(model_path):
    solved = json.loads(mapsat("solve", "--model", model_path, "--system", H100_FILE, *SPACE, "--precision",
                               "fp8-blockwise", "--json").output)
    assert solved["best"]["mapping"]["precision"] == "fp8-blockwise"
    brute = json.loads(mapsat("brute", "--model", model_path, "--system", H100_FILE, *SPACE, "--precision",
                              "fp8-blockwise", "--bf16-param-gather", "--json").output)
    assert (brute["precision"], brute["low_precision_param_gather"]) == ("fp8-blockwise", False)
    plain = json.loads(mapsat("brute", "--model", model_path, "--system", H100_FILE, *SPACE, "--json").output)
    assert "precision" not in plain and "precision" not in plain["best"]["mapping"]    # records read as before


def test_eval_reads_the_recipe_from_the_mapping_file(model_path, tmp_path):
    fields = dict(num_procs=2, tensor_par=2, pipeline_par=1, data_par=1, batch_size=1, microbatch_size=1,
                  tensor_par_comm_type="rs_ag", seq_par_ag_redo=True)
    times = {}
    for name in (None, "fp8-tensorwise"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**fields, **({"precision": name} if name else {})}))
        out = json.loads(mapsat("eval", "--model", model_path, "--system", H100_FILE, "--mapping", path, "--json").output)
        times[name] = out["iteration_time_s"]
        assert out["mapping"].get("precision") == name
    assert times["fp8-tensorwise"] != times[None]


def test_a_recipe_the_gpu_does_not_run_is_one_line_naming_it(model_path):
    for command in ("solve", "brute", "explain", "count"):
        result = mapsat(command, "--model", model_path, "--system", H100_FILE, *SPACE, "--precision", "mxfp8")
        assert result.exit_code == 1
        assert result.output.strip() == (
            "error: precision mxfp8: NVIDIA H100 SXM5 80GB (system 'h100-80g-nvl8') does not run it: Transformer "
            "Engine runs it from compute capability 10.0, this GPU is 9.0 (its precisions: bf16, fp8-delayed, "
            "fp8-tensorwise, fp8-blockwise)"), command


def test_a_recipe_with_another_datatype_is_one_line(model_path):
    result = mapsat("solve", "--model", model_path, "--system", H100_FILE, *SPACE, "--precision", "fp8-tensorwise",
                    "--datatype", "float8")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "datatype float8 cannot go with it (leave --datatype out)" in result.output


@pytest.mark.parametrize("args, message", [
    (["--bf16-first-last-blocks", "2"], "bf16_first_last_blocks needs an FP8 or FP4 precision recipe, not none"),
    (["--precision", "bf16", "--low-precision-param-gather"], "low_precision_param_gather needs an FP8 or FP4"),
    (["--precision", "fp9"], "Invalid value for '--precision'"),
    (["--optimizer-state", "fp16"], "Invalid value for '--optimizer-state'"),
])
def test_bad_recipe_options_are_one_usage_line(model_path, args, message):
    result = mapsat("solve", "--model", model_path, "--system", H100_FILE, *SPACE, *args)
    assert result.exit_code == 2 and message in result.output


def test_help_describes_the_recipe():
    text = mapsat("solve", "--help").output
    assert "--precision" in text and "fp8-tensorwise" in text and "--optimizer-state" in text


def test_batch_files_take_the_recipe_and_tag_the_id(model_path, tmp_path):
    batch = tmp_path / "batch.yaml"
    batch.write_text(yaml.safe_dump({"models": [model_path], "systems": [str(B200_FILE)], "gpus": [4],
                                     "max_batch": [8], "precision": ["mxfp8", "nvfp4"],
                                     "optimizer_state": ["fp32", "bf16"], "time_limit_s": 60}))
    result = mapsat("batch", batch, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"].split("__", 4)[4] for r in records) == [
        "mxfp8__b8", "mxfp8__bf16-moments__b8", "nvfp4__b8", "nvfp4__bf16-moments__b8"]
    assert {r["best"]["mapping"]["precision"] for r in records} == {"mxfp8", "nvfp4"}
    assert "precision" in (tmp_path / "out" / "results.csv").read_text().splitlines()[0].split(",")


def test_a_batch_recipe_the_gpu_does_not_run_is_one_error_line(model_path, tmp_path):
    batch = tmp_path / "batch.yaml"
    batch.write_text(yaml.safe_dump({"models": [model_path], "systems": [str(H100_FILE)], "gpus": [4],
                                     "precision": ["nvfp4"]}))
    result = mapsat("batch", batch, "--out", tmp_path / "out")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "precision nvfp4: NVIDIA H100 SXM5 80GB" in result.output
