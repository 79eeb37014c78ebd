"""A whole training run's time, failures, energy and money, from one iteration's time: pure
arithmetic on the solver's answer (no search here).

    steps           tokens / (global batch · seq_size)
    compute time    steps · iteration time (the failure-free time the GPUs compute)
    job MTBF        M = 1 / (failure rate per GPU-hour · GPUs)
    checkpoint      δ = state bytes / storage bandwidth (synchronous), or the snapshot to host
                    memory alone (asynchronous: the write to storage runs in the background)
    interval        τ = sqrt(2·δ·M)                                    (Young 1974)
    lost fraction   f = δ/τ + (τ/2 + W + R)/M  (W: background write, 0 when synchronous)
    goodput         1 − f: the share of wall-clock time that advances training
    wall time       compute time / goodput

Young's first-order interval (J. W. Young, "A first order approximation to the optimum
checkpoint interval", CACM 17(9):530–531, 1974) is used rather than Daly's higher-order one
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22(3):303–312, 2006): the two agree within a few per cent
while δ ≪ M, which holds for every run this tool plans (seconds to write against hours
between failures); `young_daly` refuses δ ≥ M/2, where neither first-order form holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.errors import InputError

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

LLAMA3_INTERRUPTIONS = 419
"""Unexpected interruptions in a 54-day snapshot of Llama 3 405B pre-training (Dubey et al.,
"The Llama 3 Herd of Models", arXiv:2407.21783, 2024, §3.3.4 and Table 5: 466 job
interruptions, of which 47 planned and 419 unexpected)."""
LLAMA3_SNAPSHOT_DAYS = 54
LLAMA3_GPUS = 16384
"""The largest Llama 3 405B training configuration (ibid. §3.3.2, Table 4)."""
LLAMA3_FAILURE_RATE_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_SNAPSHOT_DAYS * 24 * LLAMA3_GPUS)
"""≈ 1.97e-5 unexpected interruptions per GPU-hour: 419 / (54 d · 24 h · 16,384 GPUs), as if
every interruption came from one GPU and every GPU ran the whole snapshot."""

DEFAULT_CHECKPOINT_GBPS = 2000.0
"""Aggregate storage write bandwidth for checkpoints, GB/s: the 2 TB/s sustained throughput of
Meta's Tectonic file system for Llama 3 (ibid. §3.3.1, "Storage": 2 TB/s sustained, 7 TB/s
peak). An assumption for any other cluster: give yours with --checkpoint-gbps."""
DEFAULT_SNAPSHOT_GBPS = 48.0
"""Per-GPU copy bandwidth to host memory for an asynchronous checkpoint's snapshot, GB/s: the
pinned PCIe Gen5 copies measured on an H100 SXM with both directions busy, 47–51 GB/s
(problems/measurements/h100-sxm-80g/host.json)."""
DEFAULT_RESTART_MINUTES = 10.0
"""Time from an interruption to training again (detect, reschedule, reload the checkpoint,
warm up), minutes: an assumption; Llama 3's paper reports no figure. Give yours with
--restart-minutes."""
DEFAULT_PUE = 1.0
"""Facility power usage effectiveness: 1.0 counts the GPUs' power alone."""


@dataclass(frozen=True)
class Failures:
    """How failures and checkpoints slow one run of `num_gpus` GPUs (SI units)."""

    failure_rate_per_gpu_hour: float
    num_gpus: int
    mtbf_s: float
    """M: the job's mean time between interruptions"""
    checkpoint_stall_s: float
    """δ: what training waits for at each checkpoint"""
    checkpoint_write_s: float
    """the write of the state to storage (= δ when synchronous)"""
    interval_s: float
    """τ: compute time between checkpoints (Young)"""
    restart_s: float
    lost_fraction: float
    """f = δ/τ + (τ/2 + W + R)/M"""

    @property
    def goodput(self) -> float:
        return 1.0 - self.lost_fraction


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """τ = sqrt(2·δ·M) (Young 1974)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def lost_fraction(checkpoint_s: float, interval_s: float, rework_extra_s: float, restart_s: float,
                  mtbf_s: float) -> float:
    """The share of wall-clock time that does not advance training, to first order: the
    checkpoint stall once per interval, δ/τ, and per interruption (1/M of them per second)
    half an interval of lost work, the background write not yet finished, and the restart."""
    return checkpoint_s / interval_s + (interval_s / 2.0 + rework_extra_s + restart_s) / mtbf_s


def failures(num_gpus: int, state_bytes: float, *, failure_rate_per_gpu_hour: float = LLAMA3_FAILURE_RATE_PER_GPU_HOUR,
             checkpoint_gbps: float = DEFAULT_CHECKPOINT_GBPS, async_checkpoint: bool = False,
             snapshot_gbps: float = DEFAULT_SNAPSHOT_GBPS,
             restart_minutes: float = DEFAULT_RESTART_MINUTES) -> Failures:
    """The failure terms of a job of `num_gpus` GPUs checkpointing `state_bytes` (weights and
    optimizer state of the whole model). Synchronous: training stops for the write to storage
    at `checkpoint_gbps` (aggregate). Asynchronous: it stops only while each GPU copies its
    share (state / GPUs) to host memory at `snapshot_gbps`; the write runs in the background,
    so the interval is at least the write, and an interruption also loses the write in flight.
    A failure rate of 0 gives goodput 1 (no checkpoints needed)."""
    write_s = state_bytes / (checkpoint_gbps * 1e9)
    stall_s = state_bytes / num_gpus / (snapshot_gbps * 1e9) if async_checkpoint else write_s
    restart_s = restart_minutes * 60.0
    if failure_rate_per_gpu_hour == 0:
        return Failures(0.0, num_gpus, math.inf, stall_s, write_s, math.inf, restart_s, 0.0)
    mtbf_s = SECONDS_PER_HOUR / (failure_rate_per_gpu_hour * num_gpus)
    if stall_s >= mtbf_s / 2:
        raise InputError(f"checkpoint: {stall_s:.3g} s to checkpoint against a job MTBF of {mtbf_s:.3g} s "
                         f"({num_gpus} GPUs at {failure_rate_per_gpu_hour:g} failures per GPU-hour): the job "
                         f"fails about as often as it checkpoints (give a faster --checkpoint-gbps)")
    interval_s = young_interval_s(stall_s, mtbf_s)
    if async_checkpoint:
        interval_s = max(interval_s, write_s)       # the next snapshot waits for the write
    extra_s = write_s if async_checkpoint else 0.0
    f = lost_fraction(stall_s, interval_s, extra_s, restart_s, mtbf_s)
    return Failures(failure_rate_per_gpu_hour, num_gpus, mtbf_s, stall_s, write_s, interval_s, restart_s, min(f, 1.0))


@dataclass(frozen=True)
class RunCost:
    """A whole run on `num_gpus` GPUs: wall-clock time with failures, GPU-hours, energy, money."""

    num_gpus: int
    compute_s: float
    """failure-free time: the sum over phases of steps · iteration time"""
    wall_s: float
    """compute_s / goodput"""
    gpu_hours: float
    interruptions: float
    """expected interruptions: failure rate · GPUs · wall hours"""
    energy_j: float | None
    """GPUs · power · wall time · PUE (None: no power given)"""
    cost_usd: float | None
    """GPU-hours · price (None: no price given)"""

    @property
    def wall_days(self) -> float:
        return self.wall_s / SECONDS_PER_DAY


def run_cost(num_gpus: int, compute_s: float, fail: Failures, *, gpu_power_w: float | None = None,
             pue: float = DEFAULT_PUE, gpu_hour_price_usd: float | None = None) -> RunCost:
    """The run's totals from its failure-free compute time and its failure terms."""
    if fail.goodput <= 0:
        wall_s = math.inf
    else:
        wall_s = compute_s / fail.goodput
    gpu_hours = num_gpus * wall_s / SECONDS_PER_HOUR
    interruptions = fail.failure_rate_per_gpu_hour * gpu_hours
    energy = None if gpu_power_w is None else num_gpus * gpu_power_w * wall_s * pue
    cost = None if gpu_hour_price_usd is None else gpu_hours * gpu_hour_price_usd
    return RunCost(num_gpus, compute_s, wall_s, gpu_hours, interruptions, energy, cost)


def steps(tokens: float, batch_sequences: int, seq_size: int) -> float:
    """Optimizer steps to train `tokens` at a global batch of `batch_sequences` sequences of
    `seq_size` tokens (fractional: the last step's share)."""
    return tokens / (batch_sequences * seq_size)


__all__ = [
    "DEFAULT_CHECKPOINT_GBPS",
    "DEFAULT_PUE",
    "DEFAULT_RESTART_MINUTES",
    "DEFAULT_SNAPSHOT_GBPS",
    "LLAMA3_FAILURE_RATE_PER_GPU_HOUR",
    "SECONDS_PER_DAY",
    "SECONDS_PER_HOUR",
    "Failures",
    "RunCost",
    "failures",
    "lost_fraction",
    "run_cost",
    "steps",
    "young_interval_s",
]
