"""Every shipped system file against the precision recipes its GPU generation runs
(costmodel.inputs.precision.MIN_COMPUTE_CAPABILITY: Transformer Engine's checks in
pytorch/quantization.py): each file states its compute capability and lists exactly the
recipes that capability runs; a recipe a GPU cannot run is refused with the reason."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import SYSTEMS_DIR
from costmodel.inputs.load import load_system
from costmodel.inputs.precision import Precision, recipes_for_capability
from solver.cli.app import cli

SYSTEM_FILES = sorted(p.name for p in SYSTEMS_DIR.glob("*.yaml"))
# Compute capabilities by GPU (NVIDIA's CUDA GPU table): A100 8.0, H100/H200/H800 9.0,
# B200 10.0, B300 (Blackwell Ultra) 10.3.
CAPABILITY = {"a100": 8.0, "h100": 9.0, "h200": 9.0, "h800": 9.0, "b200": 10.0, "gb200": 10.0, "b300": 10.3,
              "gb300": 10.3}


@pytest.mark.parametrize("name", SYSTEM_FILES)
def test_each_file_lists_the_recipes_its_generation_runs(name):
    system = load_system(SYSTEMS_DIR / name)
    assert system.precision is not None, f"{name} states no precision recipes"
    assert system.precision.compute_capability == CAPABILITY[name.split("-")[0]], name
    assert set(system.precision.recipes) == set(recipes_for_capability(system.precision.compute_capability)), name


def test_a_file_listing_a_recipe_its_gpu_cannot_run_is_refused(tmp_path):
    text = (SYSTEMS_DIR / "a100-80g-selene.yaml").read_text()
    path = tmp_path / "a100.yaml"
    path.write_text(text.replace("    bf16: {gemm: bfloat16}", "    bf16: {gemm: bfloat16}\n    mxfp8: {gemm: bfloat16}", 1))
    result = CliRunner().invoke(cli, ["count", "--model", "problems/models/gpt-1.3b.yaml", "--system", str(path),
                                      "--gpus", "8"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "mxfp8: needs compute capability 10.0" in result.output, result.output


def test_fp8_on_an_a100_is_refused_with_the_reason():
    result = CliRunner().invoke(cli, ["solve", "--model", "problems/models/gpt-1.3b.yaml",
                                      "--system", "problems/systems/a100-80g-selene.yaml", "--gpus", "8",
                                      "--precision", "fp8-tensorwise"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "from compute capability 8.9, this GPU is 8.0" in result.output, result.output


@pytest.mark.parametrize("system", ["b300-288g-nvl8", "gb300-288g-nvl72"])
@pytest.mark.parametrize("precision", [Precision.mxfp8, Precision.nvfp4])
def test_blackwell_ultra_runs_mxfp8_and_nvfp4(system, precision):
    result = CliRunner().invoke(cli, ["solve", "--model", "problems/models/gpt-1.3b.yaml",
                                      "--system", f"problems/systems/{system}.yaml", "--gpus", "8",
                                      "--precision", precision.value, "--json"])
    assert result.exit_code == 0, result.output
    assert '"iteration_time_s"' in result.output
