"""Kernel fields of a GPU that shares a measured GPU's SM (GB200, B300 and GB300 share the
B200's): the measured GPU's GEMM fit as fractions of each file's own peak, at each GPU's own
sustained clocks (costmodel.inputs.system.Clocks), and its attention rate scaled by the ratio of
sustained clocks. tests/test_blackwell_files.py holds the shipped files to it.
"""

from __future__ import annotations

from costmodel.calibration.fit import POWER_ONSET_S, rounded
from costmodel.inputs.system import Clocks, Datatype


def shared_sm_gemm(reference: dict, clocks: Clocks, datatype: Datatype, peak_tflops: float) -> dict:
    """The reference GEMM fit (file units) with this GPU's clock drop for `datatype`, setting in
    after POWER_ONSET_S at this GPU's full rate (peak · efficiency) when a GEMM is timed alone."""
    return {**reference, "power_drop": rounded(clocks.drop(datatype)),
            "power_flops": rounded(POWER_ONSET_S * peak_tflops * 1e12 * reference["efficiency"])}


def power_scaled(reference: float, reference_w: float, power_w: float) -> float:
    """A sustained clock (or a rate proportional to it) at another power cap: dynamic power ∝
    f·V² with V ∝ f under DVFS, so f ∝ P^(1/3) (the estimate the GB200, B300 and GB300 files take
    from the B200's clocks)."""
    return reference * (power_w / reference_w) ** (1.0 / 3.0)


def shared_sm_attention_tflops(reference_tflops: float, reference_w: float, power_w: float) -> float:
    """The reference's sustained attention rate at this GPU's power cap."""
    return rounded(power_scaled(reference_tflops, reference_w, power_w))
