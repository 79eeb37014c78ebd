"""`mapsat calibrate` and the kernel-time models it fits (costmodel/terms/kernel_time.py,
costmodel/calibration/): the shipped H100 and H200 files are what the command writes from the
shipped measurements, and the fitted models predict measurements they were not fitted on.

Tolerances (issue 12): on the held-out `kind: block` GEMMs, median |error| <= 10 % and 90th
percentile <= 25 % per GPU and datatype. Attention (held out: sequence 4096) is held to the
same bounds. HBM-bound layers are one efficiency for six kernels whose measured bandwidths
differ by 2.3× (softmax 1.3 TB/s, add 3.0 TB/s on the H100), so their bound is looser: median
<= 35 %, p90 <= 60 %. The measured values are printed by benchmarks/bench_calibration.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from conftest import PROBLEMS, SYSTEMS_DIR
from costmodel.calibration import calibrate_system
from costmodel.calibration.fit import fit_network, sustained_drop
from costmodel.calibration.measurements import load_gemm, load_nccl
from costmodel.errors import InputError
from costmodel.inputs.system import Datatype
from costmodel.inputs.load import load_system
from solver.cli.app import cli

MEASUREMENTS = PROBLEMS / "measurements"
CALIBRATED = {"h100-80g-nvl8": "h100-sxm-80g", "h200-141g-nvl8": "h200-sxm-141g",
              "h800-80g-nvl8": "h100-sxm-80g"}   # the H800 is the H100's SM: its file is fitted on the H100's


@pytest.fixture(scope="module", params=sorted(CALIBRATED))
def calibrated(request):
    system = request.param
    base = SYSTEMS_DIR / "calibration" / f"{system}.base.yaml"
    return system, calibrate_system(base, MEASUREMENTS / CALIBRATED[system])


def test_shipped_file_is_what_calibrate_writes(calibrated):
    system, result = calibrated
    shipped = SYSTEMS_DIR / f"{system}.yaml"
    assert result.text == shipped.read_text(), \
        f"rerun: mapsat calibrate --base problems/systems/calibration/{system}.base.yaml ... --out {system}.yaml"
    # The markers stay in the written file: calibrating it again updates it in place, to itself.
    assert calibrate_system(shipped, MEASUREMENTS / CALIBRATED[system]).text == result.text


def test_held_out_points_are_predicted_within_the_issue_bounds(calibrated):
    system, result = calibrated
    fits = {f.family: f for f in result.fits}
    for family in ("gemm fp8", "gemm bf16", "attention bf16"):
        test = fits[family].test
        assert test.count >= 40, family
        assert test.median <= 0.10 and test.p90 <= 0.25, (family, test)
    # Grouped GEMMs (mixture-of-experts layers) were measured on the H100 only, in bf16; held out:
    # the experts of Mixtral 8x22B and Qwen3-30B-A3B (costmodel.calibration.fit.GROUPED_GEMM_TEST_SHAPES).
    grouped = fits.get("grouped gemm bf16")
    assert (grouped is not None) == (CALIBRATED[system] == "h100-sxm-80g")
    if grouped is not None:
        assert grouped.test.count == 18 and grouped.test.median <= 0.10 and grouped.test.p90 <= 0.25, grouped.test
    hbm = fits["hbm-bound layers"].test
    assert hbm.count == 18 and hbm.median <= 0.35 and hbm.p90 <= 0.60, hbm
    adam = fits["fused Adam (HBM fit)"].test
    assert adam.count == 4 and adam.median <= 0.30, adam


def test_calibrated_files_load_and_measured_h100_gemms_run_below_the_paper_assumption():
    # The issue's numbers: the measured FP8 plateau is ~0.64 of peak, not the 0.75-0.78 the
    # paper-era file assumed; so a big FP8 GEMM takes longer on the measured H100.
    from costmodel.terms.context import Context
    from costmodel.terms.layer_time import gemm_s
    from costmodel.inputs.model import Model
    from costmodel.ops import ScalarOps
    from costmodel.inputs.system import Datatype

    model = Model(name="m", hidden=8192, feedforward=32768, seq_size=8192, attn_heads=64, attn_size=128, num_blocks=8)
    times = {}
    for name in ("h100-80g-nvl8", "h100-80g-nvl8-paper2023"):
        c = Context.build(model, load_system(SYSTEMS_DIR / f"{name}.yaml"), Datatype.float8)
        rows, cols, depth = 8192.0, 32768.0, 8192.0   # 4.4e12 FLOP
        times[name] = gemm_s(c, ScalarOps, rows, cols, depth, rows * depth + depth * cols + rows * cols)
    fraction = 2 * 8192 * 32768 * 8192 / 1979e12 / times["h100-80g-nvl8"]
    assert 0.5 <= fraction <= 0.7
    assert times["h100-80g-nvl8"] > 1.1 * times["h100-80g-nvl8-paper2023"]
    h200 = load_system(SYSTEMS_DIR / "h200-141g-nvl8.yaml")
    assert h200.hbm.bandwidth_gbps == 4800 and h200.compute[Datatype.float8].matrix_tflops == 1979


def test_cli_writes_the_file_and_prints_each_family(tmp_path):
    out = tmp_path / "h100.yaml"
    result = CliRunner().invoke(cli, ["calibrate", "--base", str(SYSTEMS_DIR / "calibration/h100-80g-nvl8.base.yaml"),
                                      "--measurements", str(MEASUREMENTS / "h100-sxm-80g"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == (SYSTEMS_DIR / "h100-80g-nvl8.yaml").read_text()
    for family in ("gemm fp8", "gemm bf16", "grouped gemm bf16", "attention bf16", "hbm-bound layers", "fused Adam",
                   "host link"):
        assert family in result.output


# nccl-tests output in its own format, synthesised from latency 12 µs and 360 GB/s of bus
# bandwidth for an 8-GPU all-reduce (bus bytes = 2·7/8 of the message): the fit must give
# them back. Not a measurement: a check of the parser and the fit.
def _nccl_text(latency_us=12.0, bus_gbps=360.0, ranks=8) -> str:
    factor = 2 * (ranks - 1) / ranks
    lines = ["# nThread 1 nGpus 8 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"]
    size = 8
    while size <= 2 ** 33:
        t_us = latency_us + size * factor / (bus_gbps * 1e3)
        algbw = size / t_us / 1e3
        lines.append(f"{size:>12} {size // 4:>13}     float     sum      -1 {t_us:8.2f} {algbw:7.2f} {algbw * factor:7.2f}"
                     f"      0 {t_us:8.2f} {algbw:7.2f} {algbw * factor:7.2f}      0")
        size *= 2
    lines.append("# Avg bus bandwidth    : 100.0")
    return "\n".join(lines) + "\n"


def test_nccl_tests_output_gives_back_latency_and_efficiency(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(_nccl_text())
    f = fit_network(load_nccl(path), bandwidth_gbps=450.0, label="nvlink")
    assert f.fields["latency_us"] == pytest.approx(12.0, rel=0.02)
    assert f.fields["efficiency"] == pytest.approx(360.0 / 450.0, rel=0.01)


def test_a_network_marker_is_filled_from_nccl_tests(tmp_path):
    base_text = (SYSTEMS_DIR / "calibration/h100-80g-nvl8.base.yaml").read_text()
    old = ("    efficiency: 0.73          # A100 fit (0.65) relative to nccl-tests there, applied to ~360 GB/s "
           "all-reduce bus bandwidth on DGX H100\n    latency_us: 10            # the A100 fit\n")
    assert old in base_text
    base = tmp_path / "base.yaml"
    base.write_text(base_text.replace(old, "    # mapsat-calibrate: network nvlink\n"))
    nccl = tmp_path / "nvlink.txt"
    nccl.write_text(_nccl_text())
    out = tmp_path / "out.yaml"
    result = CliRunner().invoke(cli, ["calibrate", "--base", str(base), "--measurements",
                                      str(MEASUREMENTS / "h100-sxm-80g"), "--nccl", f"nvlink={nccl}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    nvlink = load_system(out).networks[0]
    assert nvlink.efficiency == 0.8 and nvlink.latency_us == pytest.approx(12.0, rel=0.02)


@pytest.mark.parametrize("args, message", [
    (["--measurements", "nowhere"], "--measurements nowhere: no such folder"),
    (["--nccl", "nvlink"], "--nccl nvlink: expected NETWORK=FILE"),
    (["--nccl", "nvlink=x.txt"], "--nccl nvlink: "),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    base = str(SYSTEMS_DIR / "calibration/h100-80g-nvl8.base.yaml")
    default = {"--measurements": str(MEASUREMENTS / "h100-sxm-80g")}
    given = dict(zip(args[::2], args[1::2]))
    argv = ["calibrate", "--base", base]
    for option, value in {**default, **given}.items():
        argv += [option, value]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert message in lines[0]


def test_a_bad_measurement_names_the_file_point_and_field(tmp_path):
    folder = tmp_path / "gpu"
    folder.mkdir()
    for name in ("attention.json", "eltwise.json", "adam.json"):
        (folder / name).write_text((MEASUREMENTS / "h100-sxm-80g" / name).read_text())
    (folder / "gemm.json").write_text('[{"dtype": "bf16", "kind": "grid", "M": 256, "N": 256, "K": -4, "ms": 0.01}]')
    result = CliRunner().invoke(cli, ["calibrate", "--base", str(SYSTEMS_DIR / "calibration/h100-80g-nvl8.base.yaml"),
                                      "--measurements", str(folder)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {folder / 'gemm.json'}: point 0: field 'K' -4: Input should be greater than 0"]


@pytest.fixture(scope="module")
def b200():
    return calibrate_system(SYSTEMS_DIR / "calibration" / "b200-180g-nvl8.base.yaml", MEASUREMENTS / "b200-xla")


def test_the_b200_file_is_what_calibrate_writes_from_xlas_table(b200):
    shipped = SYSTEMS_DIR / "b200-180g-nvl8.yaml"
    assert b200.text == shipped.read_text(), \
        "rerun: mapsat calibrate --base problems/systems/calibration/b200-180g-nvl8.base.yaml ... --out b200-180g-nvl8.yaml"


def test_b200_gemms_fitted_on_half_of_xlas_table_predict_the_other_half(b200):
    """XLA's published B200 GEMM table (problems/measurements/b200-xla, 375 shapes per datatype),
    fitted on its `kind: fit` half at full clock and scored on the `kind: held_out` half: the
    bound is issue 33's 7 % median. The written fields carry the sustained clock's drop
    (peak / sustained − 1 of the base file's clocks) and the H100-measured host launch overhead."""
    fits = {f.family: f for f in b200.fits}
    system = load_system(SYSTEMS_DIR / "b200-180g-nvl8.yaml")
    for family, datatype in (("gemm fp8", "float8"), ("gemm bf16", "bfloat16")):
        f = fits[family]
        assert f.test.count == 187 and f.test.median <= 0.07, (family, f.test)
        assert f.fields["power_drop"] == pytest.approx(system.clocks.drop(datatype), abs=1e-3), f.fields
        assert f.fields["launch_us"] > 1.51, f.fields


def test_b200_grouped_gemms_fitted_on_llama4s_experts_predict_deepseek_v3s(b200):
    """pytorch/ao's B200 table of BF16 grouped GEMMs forward + backward (b200-xla/
    grouped_gemm_fwd_bwd.json): the BF16 GEMM fit with its efficiency refitted on Llama 4 16e's
    four points, scored on DeepSeek-V3's four (the issue's bounds: median 10 %, p90 25 %). The
    table runs at about half the dense rate, and only the efficiency (and the drop's onset,
    which follows it) may differ from the dense fit."""
    fits = {f.family: f for f in b200.fits}
    grouped, dense = fits["grouped gemm bf16"], fits["gemm bf16"]
    assert grouped.fit.count == 4 and grouped.test.count == 4, grouped
    assert grouped.test.median <= 0.10 and grouped.test.p90 <= 0.25, grouped.test
    assert 0.4 * dense.fields["efficiency"] < grouped.fields["efficiency"] < 0.7 * dense.fields["efficiency"]
    same = {k: v for k, v in grouped.fields.items() if k not in ("efficiency", "power_flops")}
    assert same == {k: v for k, v in dense.fields.items() if k not in ("efficiency", "power_flops")}


@pytest.mark.parametrize("edit, message", [
    (lambda points: [{k: v for k, v in p.items() if k != "model"} for p in points], r"point 0: missing field 'model'"),
    (lambda points: [{**p, "model": "DeepSeekV3"} for p in points], r"every bf16 point is DeepSeekV3's, the held-out model"),
])
def test_a_bad_grouped_table_of_passes_is_refused_by_name(tmp_path, edit, message):
    folder = tmp_path / "b200"
    shutil.copytree(MEASUREMENTS / "b200-xla", folder)
    table = folder / "grouped_gemm_fwd_bwd.json"
    table.write_text(json.dumps(edit(json.loads(table.read_text()))))
    with pytest.raises(InputError, match=message):
        calibrate_system(SYSTEMS_DIR / "calibration" / "b200-180g-nvl8.base.yaml", folder)


@pytest.mark.parametrize("old, new, message", [
    ("    # mapsat-calibrate: gemm bf16\n", "", r"marker 'grouped_gemm bf16' .* below a 'gemm bf16' marker"),
    ("  efficiency:\n    - [0, 0.6]\n", "  efficiency: 0.6\n",
     r"hbm\.efficiency: the loss passes of grouped_gemm_fwd_bwd\.json need it"),
])
def test_a_grouped_table_of_passes_needs_the_gemm_fit_above_it_and_an_hbm_curve(tmp_path, old, new, message):
    base = (SYSTEMS_DIR / "calibration" / "b200-180g-nvl8.base.yaml").read_text()
    assert old in base
    path = tmp_path / "b200.base.yaml"
    path.write_text(base.replace(old, new, 1))
    with pytest.raises(InputError, match=message):
        calibrate_system(path, MEASUREMENTS / "b200-xla")


def test_the_b200s_sustained_clocks_are_what_the_published_long_runs_give():
    """The clocks the B200 file states are the geometric-mean drop of the published long-run GEMMs
    (problems/measurements/b200-xla/long_runs.json) against the file's own fit at full clock, to
    the MHz the file rounds to."""
    system = load_system(SYSTEMS_DIR / "b200-180g-nvl8.yaml")
    for datatype, dtype, elem_bytes in ((Datatype.bfloat16, "bf16", 2.0), (Datatype.float8, "fp8", 1.0)):
        compute = system.compute_for(datatype)
        runs = load_gemm(MEASUREMENTS / "b200-xla" / "long_runs.json", dtype, "long_run")
        drop = sustained_drop(compute.gemm.model_dump(), runs, compute.matrix_flops_per_s,
                              system.hbm.bandwidth_bytes_per_s, elem_bytes)
        assert system.clocks.sustained_mhz[datatype] == pytest.approx(system.clocks.peak_mhz / (1 + drop), abs=1.0)
    assert system.clocks.drop(Datatype.float8) > system.clocks.drop(Datatype.bfloat16)   # FP8 draws more power


@pytest.mark.parametrize("name", ["a100-40g-nvl8"])
def test_files_from_public_specifications_say_they_are_uncalibrated(name):
    path = SYSTEMS_DIR / f"{name}.yaml"
    assert "UNCALIBRATED" in path.read_text().split("\nname:")[0], f"{name}'s header must say it is uncalibrated"
    system = load_system(path)
    assert system.name == name
    if name.startswith("gb"):
        assert system.networks[0].size == 72 and system.offload is not None


@pytest.mark.parametrize("change, message", [
    ({"gemm": {"launch_us": 6, "efficiency": 0.9, "depth_overhead": 200, "fill_outputs": 3e5, "power_drop": 0.3,
               "power_flops": 1e12, "hbm_efficiency": 0.7}}, "give exactly one of matrix_efficiency"),
    ({"matrix_efficiency": None}, "give exactly one of matrix_efficiency"),
])
def test_a_compute_entry_has_one_gemm_model(system_data, write_file, change, message):
    from costmodel.errors import InputError
    system_data["compute"]["bfloat16"].update(change)
    if change.get("matrix_efficiency", 0) is None:
        del system_data["compute"]["bfloat16"]["matrix_efficiency"]
    with pytest.raises(InputError) as excinfo:
        load_system(write_file("s.yaml", system_data))
    text = str(excinfo.value)
    assert "\n" not in text and "compute.bfloat16" in text and message in text, text


def test_offload_memory_has_no_kernel_latency(system_data, write_file):
    from costmodel.errors import InputError
    system_data["offload"] = {"capacity_gib": 512, "bandwidth_gbps": 48, "latency_us": 5}
    with pytest.raises(InputError, match="offload.latency_us: 5.0 must be 0"):
        load_system(write_file("s.yaml", system_data))


@pytest.mark.parametrize("system", sorted(CALIBRATED))
def test_whole_layers_follow_the_backward_is_twice_forward_rule(system):
    # block.py times a layer's backward GEMMs as twice its forward GEMM; on the measured
    # (held-out) block GEMMs, forward + both gradients is predicted within the GEMM bounds.
    from costmodel.calibration.fit import layer_errors
    from costmodel.calibration.measurements import load_gemm
    from costmodel.inputs.system import Datatype

    loaded = load_system(SYSTEMS_DIR / f"{system}.yaml")
    for dtype, datatype, elem in (("bf16", Datatype.bfloat16, 2.0), ("fp8", Datatype.float8, 1.0)):
        compute = loaded.compute[datatype]
        e = layer_errors(compute.gemm.model_dump(), load_gemm(MEASUREMENTS / CALIBRATED[system] / "gemm.json", dtype,
                                                               "block"),
                         compute.matrix_flops_per_s, loaded.hbm.bandwidth_bytes_per_s, elem)
        assert e.count == 200 and e.median <= 0.10 and e.p90 <= 0.25, (dtype, e)
