"""Fitted kernel-time models: one GEMM from its shape, one fused attention kernel, one pass
over HBM. Pure functions of SI parameters that broadcast over numpy arrays and plain
scalars alike (only + − × ÷ and `xp.maximum`), so the cost model (costmodel/terms/block.py) and
the fit (costmodel/calibration/) call the very same formula. The forms and the meaning of
each parameter: docs/cost-model.md, "Kernel times from measurements".
"""

from __future__ import annotations

from costmodel.inputs.kernel_fits import AttentionTiming, GemmTiming  # noqa: F401 (read from here)


def gemm_time_s(p: GemmTiming, xp, rows, cols, depth, num_bytes, peak_flops_per_s, hbm_bytes_per_s, batch=1.0):
    """Time of `batch` GEMMs C[rows, cols] = A[rows, depth] · B[depth, cols] moving `num_bytes`:

        launch + max(F / (peak · efficiency) · (1 + depth_overhead / K) · (1 + fill_outputs / (batch·M·N))
                       · (1 + power_drop · F' / (F' + power_flops)),
                     bytes / (HBM bandwidth · hbm_efficiency)),   F = 2 · batch · M · N · K,
                                                                  F' = max(F, sustained_flops)

    `sustained_flops` is 0 for one GEMM timed alone; in a training step the power limiter has
    already seen the GEMMs before, so each pays at least the drop of a GEMM that size
    (costmodel.terms.step_terms, sustained clocks).
    """
    flops = 2.0 * batch * rows * cols * depth
    compute = (flops / (peak_flops_per_s * p.efficiency)
               * (1.0 + p.depth_overhead / depth)
               * (1.0 + p.fill_outputs / (batch * rows * cols))
               * (1.0 + p.power_drop * _onset(xp.maximum(flops, p.sustained_flops), p.power_flops)))
    memory = num_bytes / (hbm_bytes_per_s * p.hbm_efficiency)
    return p.launch_s + xp.maximum(compute, memory)


def _onset(flops, power_flops):
    """The share of the power drop a GEMM of `flops` FLOP has reached."""
    return flops / (flops + power_flops)


def padded_head_size(p: AttentionTiming, head_size):
    """The head size the kernel computes with: rounded up to a multiple of `head_size_step`
    (72 runs as 96 with a step of 32). Floor division keeps it exact on floats and arrays."""
    return -(-head_size // p.head_size_step) * p.head_size_step


def attention_time_s(p: AttentionTiming, pairs, batch_heads, seq, head_size):
    """Time of one fused attention kernel doing `pairs` s×s×d matrix products per (batch, head)
    (2 forward: Q·Kᵀ and ·V; 1 for the recomputed Q·Kᵀ in backward):

        launch + pairs · 2·(b·a)·s²·d' / rate · (1 + head_size_overhead / d') · (1 + seq_overhead / s)
                 · (1 + fill_rows / (b·a·s)),   d' = head size padded to the kernel's step
    """
    padded = padded_head_size(p, head_size)
    flops = pairs * 2.0 * batch_heads * seq * seq * padded
    return p.launch_s + (flops / p.flops_per_s
                         * (1.0 + p.head_size_overhead / padded)
                         * (1.0 + p.seq_overhead / seq)
                         * (1.0 + p.fill_rows / (batch_heads * seq)))


def hbm_pass_s(num_bytes, bytes_per_s, latency_s):
    """Time of one HBM-bound kernel moving `num_bytes` (read + written) at an effective
    bandwidth `bytes_per_s` (bandwidth × efficiency): latency + bytes / rate."""
    return latency_s + num_bytes / bytes_per_s
