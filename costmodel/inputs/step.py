"""The `step:` section of a system file: what a whole training step costs beyond its kernels
(costmodel.terms.step_terms applies it)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

import costmodel.inputs.limits as limits
from costmodel.inputs.model import INPUT_CONFIG, RealNumber, within
from costmodel.inputs.units import MICRO, MILLI


class WholeStep(BaseModel):
    """What a whole training step costs beyond the sum of its kernels timed one at a time
    (docs/cost-model.md, "Whole-step terms"): fitted to measured iterations by `mapsat calibrate
    --runs`, the same values in every system file that states them (they describe the software
    and the power limiter, not one GPU). Without this section a system has none of them (the A100
    files: their step curves were fitted to whole Selene iterations, which include them)."""

    model_config = INPUT_CONFIG

    kernel_gap_us: Annotated[RealNumber, within(limits.LATENCY_US)] = Field(
        ge=0, description="Idle time between two kernels of a step, µs: launch and stream synchronisation, which a "
                          "microbenchmark's back-to-back timing leaves out. Added to each GEMM's and attention "
                          "kernel's `launch_us` and each element-wise kernel's `hbm.latency_us`; CUDA graphs remove "
                          "it (per-layer: inside the blocks; full-iteration: everywhere).")
    power_window_ms: Annotated[RealNumber, within(limits.POWER_WINDOW_MS)] = Field(
        0.0, ge=0, description="Sustained clocks, ms: every GEMM of a step runs at least at the clock a GEMM lasting "
                               "this long at full rate reaches under the GEMM model's `power_drop` and `power_flops` "
                               "(the power limiter has seen the step's earlier GEMMs). 0: each GEMM as timed alone.")
    allocator_fragmentation: Annotated[RealNumber, within(limits.FRACTION)] = Field(
        0.0, ge=0, description="Memory the caching allocator holds beyond live tensors at the peak, as a fraction of "
                               "the memory allocated and freed every microbatch (activations, the recompute workspace, "
                               "the loss's logits).")

    @property
    def kernel_gap_s(self) -> float:
        return self.kernel_gap_us * MICRO

    @property
    def power_window_s(self) -> float:
        return self.power_window_ms * MILLI
