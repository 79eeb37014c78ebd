"""The fitted kernel models as a system file states them (costmodel.calibration writes them):
a shape-aware GEMM model and a fused-attention model, in file units (µs, TFLOP/s), each
turned into the SI timing the formulas read (costmodel.terms.kernel_time)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

import costmodel.inputs.limits as limits
from costmodel.terms.kernel_time import AttentionTiming, GemmTiming
from costmodel.model import INPUT_CONFIG, RealNumber, WholeNumber, within
from costmodel.inputs.units import MICRO, tflops_to_flops_per_s


class GemmFit(BaseModel):
    """A GEMM's time from its shape, fitted to measurements (`mapsat calibrate`); the formula is
    costmodel.terms.kernel_time.gemm_time_s and docs/cost-model.md."""

    model_config = INPUT_CONFIG

    launch_us: Annotated[RealNumber, within(limits.LATENCY_US)] = Field(
        ge=0, description="Fixed cost of one GEMM kernel, µs.")
    efficiency: Annotated[RealNumber, within(limits.EFFICIENCY)] = Field(
        gt=0, le=1, description="Fraction of matrix peak the main loop reaches at full clocks.")
    depth_overhead: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(
        ge=0, description="Per-tile prologue/epilogue in equivalent reduction steps: time × (1 + depth_overhead / K).")
    fill_outputs: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(
        ge=0, description="Output elements M·N at which poor SM fill doubles the time: "
                          "× (1 + fill_outputs / (M·N)).")
    power_drop: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(
        ge=0, description="Long GEMMs run at efficiency / (1 + power_drop) under the power limit.")
    power_flops: Annotated[RealNumber, within(limits.CURVE_SIZE)] = Field(gt=0, description="GEMM FLOP at which half of power_drop has set in.")
    hbm_efficiency: Annotated[RealNumber, within(limits.EFFICIENCY)] = Field(
        gt=0, le=1, description="Fraction of HBM bandwidth a GEMM bound by its operands' bytes reaches.")

    def timing(self) -> GemmTiming:
        return GemmTiming(launch_s=self.launch_us * MICRO, efficiency=self.efficiency,
                          depth_overhead=self.depth_overhead, fill_outputs=self.fill_outputs,
                          power_drop=self.power_drop, power_flops=self.power_flops,
                          hbm_efficiency=self.hbm_efficiency)


class AttentionFit(BaseModel):
    """A fused attention kernel's time from its shape, fitted to measurements (`mapsat
    calibrate`); the formula is costmodel.terms.kernel_time.attention_time_s and docs/cost-model.md."""

    model_config = INPUT_CONFIG

    launch_us: Annotated[RealNumber, within(limits.LATENCY_US)] = Field(
        ge=0, description="Fixed cost of one attention kernel, µs.")
    tflops: Annotated[RealNumber, within(limits.TFLOPS)] = Field(
        gt=0, description="Sustained rate on the full (non-causal) 2·b·a·s²·d FLOP count per s×s×d product, "
                          "TFLOP/s.")
    head_size_overhead: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(
        ge=0, description="× (1 + head_size_overhead / d'), d' the padded head size.")
    seq_overhead: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(ge=0, description="× (1 + seq_overhead / s).")
    fill_rows: Annotated[RealNumber, within(limits.SHAPE_OVERHEAD)] = Field(ge=0, description="Query rows b·a·s at which poor SM fill doubles the time.")
    head_size_step: Annotated[WholeNumber, within(limits.ATTN_SIZE)] = Field(32, gt=0, description="Head sizes are padded up to a multiple of this.")

    def timing(self) -> AttentionTiming:
        return AttentionTiming(launch_s=self.launch_us * MICRO, flops_per_s=tflops_to_flops_per_s(self.tflops),
                               head_size_overhead=self.head_size_overhead, seq_overhead=self.seq_overhead,
                               fill_rows=self.fill_rows, head_size_step=float(self.head_size_step))
