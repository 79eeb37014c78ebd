"""The fitted kernel models as a system file states them (costmodel.calibration writes them):
a shape-aware GEMM model and a fused-attention model, in file units (µs, TFLOP/s), each
turned into the SI timing the formulas read (costmodel.terms.kernel_time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.inputs.model import INPUT_CONFIG, RealNumber, WholeNumber, within
from costmodel.inputs.units import MICRO, tflops_to_flops_per_s


@dataclass(frozen=True)
class GemmTiming:
    """Shape-aware GEMM time, SI (see `gemm_time_s`)."""

    launch_s: float          # fixed cost of one kernel: launch, prologue, tail
    efficiency: float        # fraction of the matrix peak the main loop reaches at full clocks
    depth_overhead: float    # per-tile prologue/epilogue, in equivalent reduction steps (K elements)
    fill_outputs: float      # output elements (batch·M·N) at which poor SM fill doubles the time
    power_drop: float        # long GEMMs run at efficiency / (1 + power_drop) under the power limit
    power_flops: float       # GEMM size (FLOP) at which half of that drop has set in
    hbm_efficiency: float    # fraction of HBM bandwidth when the GEMM is bound by its operands' bytes
    sustained_flops: float = 0.0  # a step's sustained clocks: the drop of a GEMM at least this large (FLOP)


@dataclass(frozen=True)
class AttentionTiming:
    """Fused (FlashAttention) kernel time, SI (see `attention_time_s`)."""

    launch_s: float
    flops_per_s: float       # sustained rate on the full (non-causal) s²·d FLOP count of padded heads
    head_size_overhead: float  # per-row overhead in equivalent head-size elements
    seq_overhead: float      # per-tile overhead in equivalent key positions
    fill_rows: float         # query rows (batch·heads·seq) at which poor SM fill doubles the time
    head_size_step: float    # head sizes are padded up to a multiple of this (kernel templates)



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


CLOCK_DATATYPES = ("bfloat16", "float8")
"""The GEMM datatypes a file states a sustained clock for; float16 GEMMs run on the 16-bit
tensor cores at bfloat16's."""


class Clocks(BaseModel):
    """The SM clock a GPU's datasheet peaks are stated at and the clock it holds under its power
    cap through a training step of each datatype's GEMMs (a physical input, from published
    readings named in `source`; docs/cost-model.md, "Whole-step terms"). A file that states
    them runs every GEMM of a step at that clock: its GEMM fits, measured in short runs at full
    clock, carry `power_drop` = peak / sustained − 1 (`mapsat calibrate` writes it), so the loss
    is counted once, and the whole-step power window does not apply to it."""

    model_config = INPUT_CONFIG

    peak_mhz: Annotated[RealNumber, within(limits.CLOCK_MHZ)] = Field(
        gt=0, description="The clock the datasheet's peaks hold at (boost), MHz.")
    sustained_mhz: dict[Literal[CLOCK_DATATYPES], Annotated[RealNumber, within(limits.CLOCK_MHZ)]] = Field(
        min_length=1, description="Per GEMM datatype (bfloat16, float8), the clock held under the power cap through "
                                  "a step of those GEMMs, MHz (FP8 GEMMs draw more power, so hold a lower clock).")
    power_w: Annotated[RealNumber, within(limits.POWER_W)] = Field(gt=0, description="The power cap, W.")
    source: str = Field(min_length=1, description="Where the readings come from (a measurement or a derivation).")

    @model_validator(mode="after")
    def _sustained_at_most_peak(self) -> "Clocks":
        for datatype, mhz in self.sustained_mhz.items():
            if mhz > self.peak_mhz:
                raise ValueError(f"sustained_mhz.{datatype}({mhz:g}) exceeds peak_mhz({self.peak_mhz:g})")
        return self

    def drop(self, datatype) -> float:
        """How much longer a compute-bound GEMM of `datatype` (a Datatype or its name) takes at
        its sustained clock: peak / sustained − 1 (0 where the file states none for it)."""
        name = getattr(datatype, "value", datatype)
        mhz = self.sustained_mhz.get("bfloat16" if name == "float16" else name)
        return 0.0 if mhz is None else self.peak_mhz / mhz - 1.0


def check_clock_drops(clocks: Clocks, fits: dict[str, tuple]) -> None:
    """With `clocks`, each GEMM fit's power_drop (`fits`: datatype name → its gemm and grouped
    GEMM fits) is the sustained clock's drop, to the 3 significant digits a calibrated file
    states: the loss is in one place (ValueError naming the field otherwise)."""
    for datatype, pair in fits.items():
        for name, fit in zip(("gemm", "grouped_gemm"), pair):
            drop = clocks.drop(datatype)
            if fit is not None and abs(fit.power_drop - drop) > 5e-3 * max(drop, 1.0):
                raise ValueError(f"compute.{datatype}.{name}.power_drop({fit.power_drop:g}) is not the sustained "
                                 f"clock's drop {drop:.3g} (clocks: peak_mhz / sustained_mhz − 1)")
