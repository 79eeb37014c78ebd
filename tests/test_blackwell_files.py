"""The Blackwell files that share the B200's SM (GB200, B300, GB300) take its kernel fields at
their own clocks (costmodel/calibration/shared_sm.py): the GEMM fits as fractions of each
file's peak, each datatype's drop from the file's sustained clock, the HBM efficiency, and
the attention rate at the file's power cap. A file edited by hand away from its derivation
fails here, as a generated file fails tests/test_calibration.py."""

from __future__ import annotations

import pytest

from conftest import SYSTEMS_DIR
from costmodel.calibration.shared_sm import power_scaled, shared_sm_attention_tflops, shared_sm_gemm
from costmodel.inputs.load import load_system
from costmodel.inputs.system import Datatype

B200 = load_system(SYSTEMS_DIR / "b200-180g-nvl8.yaml")
DATATYPES = (Datatype.float8, Datatype.bfloat16)


@pytest.mark.parametrize("name", ["gb200-186g-nvl72", "b300-288g-nvl8", "gb300-288g-nvl72"])
def test_a_shared_sm_file_is_the_b200s_fields_at_its_own_clocks(name):
    system = load_system(SYSTEMS_DIR / f"{name}.yaml")
    clocks = system.clocks
    for datatype in DATATYPES:
        scaled = power_scaled(B200.clocks.sustained_mhz[datatype], B200.clocks.power_w, clocks.power_w)
        assert clocks.sustained_mhz[datatype] == pytest.approx(scaled, abs=1.0), (name, datatype)
        compute = system.compute_for(datatype)
        expected = shared_sm_gemm(B200.compute_for(datatype).gemm.model_dump(), clocks, datatype,
                                  compute.matrix_tflops)
        assert compute.gemm.model_dump() == expected, (name, datatype)
        reference = B200.compute_for(datatype).grouped_gemm        # BF16 only (pytorch/ao's table)
        assert (compute.grouped_gemm is None) == (reference is None) == (datatype is Datatype.float8)
        if reference is not None:
            assert compute.grouped_gemm.model_dump() == shared_sm_gemm(reference.model_dump(), clocks, datatype,
                                                                       compute.matrix_tflops), (name, datatype)
        assert compute.attention.tflops == shared_sm_attention_tflops(
            B200.compute_for(datatype).attention.tflops, B200.clocks.power_w, clocks.power_w)
    assert system.hbm.efficiency == B200.hbm.efficiency
    # The peak clock gives this file's datasheet peak at the B200's rate per clock.
    ratio = system.compute_for(Datatype.float8).matrix_tflops / B200.compute_for(Datatype.float8).matrix_tflops
    assert clocks.peak_mhz == pytest.approx(B200.clocks.peak_mhz * ratio, abs=1.0)


def test_a_gemm_fit_whose_drop_is_not_the_clocks_is_refused(tmp_path):
    text = (SYSTEMS_DIR / "gb200-186g-nvl72.yaml").read_text()
    path = tmp_path / "gb200.yaml"
    path.write_text(text.replace("power_drop: 0.389", "power_drop: 0.5", 1))
    with pytest.raises(Exception, match=r"float8\.gemm\.power_drop\(0\.5\) is not the sustained clock's drop"):
        load_system(path)


@pytest.mark.parametrize("window_s", [0.0, 2e-3, 1.0])
def test_on_a_gpu_with_clocks_every_gemm_of_a_step_runs_at_the_sustained_clock(window_s):
    """Short or long, each GEMM of a step takes (1 + drop) × its time at full clock, whatever the
    whole-step power window (costmodel.terms.step_terms.gemm_in_step)."""
    from dataclasses import replace

    from costmodel.ops import ArrayOps
    from costmodel.terms.kernel_time import gemm_time_s
    from costmodel.terms.step_terms import gemm_in_step

    compute = B200.compute_for(Datatype.float8)
    timing = compute.gemm.timing()
    in_step = gemm_in_step(timing, 0.0, window_s, compute.matrix_flops_per_s, at_sustained_clock=True)
    full_clock = replace(timing, power_drop=0.0)
    for m, n, k in ((512, 512, 512), (8192, 8192, 8192), (16384, 28672, 8192)):
        args = (ArrayOps, m, n, k, 0.0, compute.matrix_flops_per_s, B200.hbm.bandwidth_bytes_per_s)
        step = gemm_time_s(in_step, *args) - timing.launch_s
        alone = gemm_time_s(full_clock, *args) - timing.launch_s
        assert step == pytest.approx(alone * (1 + compute.gemm.power_drop), rel=1e-12)
    assert compute.gemm.power_drop == pytest.approx(B200.clocks.drop(Datatype.float8), abs=1e-3)
