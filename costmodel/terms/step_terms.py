"""Whole-step terms: what a training step costs beyond the sum of its kernels timed one at a
time (docs/cost-model.md, "Whole-step terms").

The kernel models (costmodel.terms.kernel_time) are fitted to microbenchmarks that time one kernel
at a time, back to back, each shape for a fraction of a second. A training step differs in
three ways, each a term with a physical meaning, the same for every system (a system file's
`step:` section, written by `mapsat calibrate --runs`; systems differ only through their specs
and microbenchmarks):

- **Kernel gaps.** Between two kernels of a step the GPU idles while the next one is launched
  and its stream waits on the previous one (`step.kernel_gap_us`). The microbenchmark's timing
  leaves that gap out, so a step's fixed cost per kernel is the measured one plus the gap:
  each GEMM's and attention kernel's `launch_us` and each element-wise kernel's
  `hbm.latency_us` grow by it. The kernels are therefore counted from the model itself — every
  kernel the formulas time pays one gap. CUDA graphs replay captured kernels without it:
  per-layer graphs inside the blocks, a full-iteration graph everywhere. Collectives keep
  their network's `latency_us`, an end-to-end cost per operation that includes its launch.
- **Sustained clocks.** The microbenchmark's GEMM model slows long GEMMs by
  `1 + power_drop · F / (F + power_flops)`: a GEMM of F FLOP timed alone runs long enough for
  the power limiter to lower the clocks once F passes `power_flops`. In a step the GEMMs follow
  one another, so the limiter has seen the power of the GEMMs before: each runs at least at the
  clock a GEMM lasting `step.power_window_ms` at full rate reaches (F' = max(F, window · peak ·
  efficiency)). 0 is a GEMM timed alone; a window far beyond `power_flops` / rate, every GEMM at
  the clock of an endless GEMM loop. The window is fitted to the runs (one duration for every
  system and datatype: the limiter's, not a GPU's); the drop and its onset stay each system
  file's measured (or carried-over) `power_drop` and `power_flops`.
- **Allocator fragmentation.** A caching allocator holds memory beyond the live tensors: what
  is allocated and freed every microbatch (activations, the recompute workspace, the loss's
  logits) leaves blocks it cannot reuse (`step.allocator_fragmentation`, a fraction of those
  bytes).

Without a `step:` section (the A100 files, whose step curves were fitted to whole Selene
iterations that already include these costs) every term is zero and every formula gives what
it gave before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodel.inputs.kernel_fits import AttentionTiming, GemmTiming

__all__ = ["HEAD_KERNELS_FORWARD", "OPTIMIZER_KERNELS", "StepGaps", "allocator_bytes",
           "attention_in_step", "gemm_in_step", "step_gaps"]

ALWAYS_SUSTAINED_FLOPS = 1e300
"""F' of a GEMM on a GPU at its sustained clock: F' / (F' + power_flops) is 1.0 in floating point
for any power_flops a file can state (at most 1e30), so the whole drop applies."""
HEAD_KERNELS_FORWARD = 2.0
"""Kernels of the output side's forward, one microbatch: the logits GEMM and the
softmax-cross-entropy (costmodel.terms.iteration.output_layer_s times them)."""
OPTIMIZER_KERNELS = 1.0
"""Kernels of the optimizer step as costmodel.terms.data_parallel times it: one fused (multi-tensor)
Adam pass over this GPU's share of the parameters."""


@dataclass(frozen=True)
class StepGaps:
    """The launch gap a kernel of the step pays (s): inside the blocks, and outside them (the
    output layer, the loss, the optimizer step)."""

    block_s: float
    outer_s: float

    @property
    def outer_extra_s(self) -> float:
        """What a kernel outside the blocks pays beyond a block's kernel (per-layer graphs)."""
        return self.outer_s - self.block_s


def step_gaps(kernel_gap_s: float, cuda_graphs: str) -> StepGaps:
    """The gap per kernel under the problem's CUDA graphs: none keeps it everywhere, per-layer
    removes it inside the blocks, full-iteration everywhere."""
    block = 0.0 if cuda_graphs in ("per-layer", "full-iteration") else kernel_gap_s
    outer = 0.0 if cuda_graphs == "full-iteration" else kernel_gap_s
    return StepGaps(block, outer)


def gemm_in_step(timing: GemmTiming | None, gap_s: float, power_window_s: float,
                 peak_flops_per_s: float, at_sustained_clock: bool = False) -> GemmTiming | None:
    """A GEMM's fitted model as a step runs it: its launch plus the gap, and the sustained
    clocks' drop at least that of a GEMM lasting the power window at full rate (the FLOP its
    main loop does in that time at `peak_flops_per_s` · efficiency). On a GPU whose file states
    its sustained clock (costmodel.inputs.system.Clocks) every GEMM pays the whole drop (as if the
    limiter had seen an endless GEMM: F' = ALWAYS_SUSTAINED_FLOPS) and the window does not apply."""
    if timing is None:
        return None
    if at_sustained_clock:
        return replace(timing, launch_s=timing.launch_s + gap_s, sustained_flops=ALWAYS_SUSTAINED_FLOPS)
    return replace(timing, launch_s=timing.launch_s + gap_s,
                   sustained_flops=power_window_s * peak_flops_per_s * timing.efficiency)


def attention_in_step(timing: AttentionTiming | None, gap_s: float) -> AttentionTiming | None:
    """A fused attention kernel's fitted model as a step runs it: its launch plus the gap."""
    return None if timing is None else replace(timing, launch_s=timing.launch_s + gap_s)


def allocator_bytes(fraction: float, transient_bytes):
    """What the caching allocator holds beyond the live tensors at the peak: `fraction` of the
    bytes allocated and freed every microbatch (a scalar or an array)."""
    return fraction * transient_bytes
