"""MFU against the peak of the GEMM datatype a precision recipe runs (issue 37): FP8 for the
fp8-* recipes and MXFP8, FP4 for NVFP4, BF16 for bf16; the peak named in every header and JSON.
The peaks are the system files' recipe lines (`gemm` / `gemm_tflops`) and NVIDIA's datasheets:
H100 SXM 989 (BF16) and 1,979 (FP8) TFLOP/s dense; GB200 2,500 (BF16), 5,000 (FP8), 10,000 (FP4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.terms.context import Context
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import Datatype
from solver.cli.app import cli
from solver.report.tables import throughput_lead

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "problems/systems/h100-80g-nvl8.yaml"
GB200 = ROOT / "problems/systems/gb200-186g-nvl72.yaml"
LLAMA_8B = ROOT / "problems/models/llama-3.1-8b/config.json"

PEAKS = {  # recipe → (datatype named, H100 TFLOP/s, GB200 TFLOP/s)
    Precision.bf16: ("bfloat16", 989, 2500),
    Precision.fp8_delayed: ("float8", 1979, 5000),
    Precision.fp8_tensorwise: ("float8", 1979, 5000),
    Precision.fp8_blockwise: ("float8", 1979, 5000),
    Precision.mxfp8: ("float8", None, 5000),
    Precision.nvfp4: ("float4", None, 10000),
}


@pytest.mark.parametrize("precision", list(Precision), ids=lambda p: p.value)
def test_each_recipe_divides_by_its_gemm_datatypes_peak(precision):
    name, h100_tflops, gb200_tflops = PEAKS[precision]
    model = load_model(LLAMA_8B, seq_size=8192)
    for path, tflops in ((H100, h100_tflops), (GB200, gb200_tflops)):
        if tflops is None:                       # Hopper runs neither MXFP8 nor NVFP4
            continue
        c = Context.build(model, load_system(path), Datatype.bfloat16, Kernels(precision=precision))
        assert c.compute.matrix_peak_name == f"{name} dense matrix peak ({precision.value} recipe)"
        assert c.compute.matrix_flops_per_s / 1e12 == pytest.approx(tflops)


def _solve(system: Path, precision: str) -> tuple[dict, str]:
    args = ["solve", "--model", str(LLAMA_8B), "--seq-size", "8192", "--batch", "128", "--system", str(system),
            "--gpus", "8", "--top-k", "1", "--precision", precision]
    runner = CliRunner()
    text = runner.invoke(cli, args, prog_name="mapsat", env={"COLUMNS": "300"})
    data = runner.invoke(cli, [*args, "--json"], prog_name="mapsat")
    assert text.exit_code == 0 and data.exit_code == 0, text.output
    return json.loads(data.output)["best"], text.output


@pytest.mark.parametrize("system, precision, named", [
    (H100, "fp8-tensorwise", "float8 dense matrix peak (fp8-tensorwise recipe) 1,979 TFLOP/s"),
    (GB200, "nvfp4", "float4 dense matrix peak (nvfp4 recipe) 10,000 TFLOP/s"),
], ids=["h100-fp8", "gb200-nvfp4"])
def test_solve_names_the_recipes_peak(system, precision, named):
    best, text = _solve(system, precision)
    mfu_rows = [line for line in text.splitlines() if "MFU (model FLOP" in line]
    assert mfu_rows, text
    row = text.splitlines().index(mfu_rows[0])
    cells = " ".join(" ".join(line.split("│")[2:]) for line in text.splitlines()[row:row + 3])
    assert named in " ".join(cells.split())
    peak = best["throughput"]["peak_tflops"]
    assert f"{best['throughput']['peak']} {peak:,.0f} TFLOP/s" == named
    # MFU is model FLOP/s per GPU against that peak (the model's count, not Bridge's)
    assert best["mfu"] == pytest.approx(best["model_flops_per_token"]["total"] * best["throughput"]["tokens_per_s_per_gpu"]
                                        / (peak * 1e12), rel=1e-9)


def test_plan_leads_each_phase_with_throughput_and_names_the_peak():
    args = ["plan", "--model", str(LLAMA_8B), "--seq-size", "8192", "--system", str(H100), "--gpus", "8",
            "--tokens", "1e9", "--batch", "64", "--precision", "fp8-tensorwise"]
    result = CliRunner().invoke(cli, args, prog_name="mapsat", env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lead = next(line for line in result.output.splitlines() if "tokens/s/GPU" in line).strip()
    assert lead.startswith("all: ") and lead.index("tokens/s/GPU") < lead.index("model TFLOP/s/GPU") < lead.index("MFU")
    assert lead.endswith("of the float8 dense matrix peak (fp8-tensorwise recipe) 1,979 TFLOP/s")


def test_batch_lines_lead_with_throughput():
    throughput = {"tokens_per_s_per_gpu": 13655.97, "model_tflops_per_gpu": 702.88,
                  "peak": "float4 dense matrix peak (nvfp4 recipe)", "peak_tflops": 10000.0}
    assert throughput_lead(throughput, 0.2125) == ("13,656 tokens/s/GPU, 702.9 model TFLOP/s/GPU, MFU 21.2% of the "
                                                   "float4 dense matrix peak (nvfp4 recipe) 10,000 TFLOP/s")
