"""Fitting the kernel-time models of costmodel/terms/kernel_time.py to measurements, and testing them on
points the fit did not see.

Each family is fitted on one split and tested on the other (never the same points):

| family | fitted on | tested on |
| --- | --- | --- |
| GEMM (per datatype) | `kind: grid` shapes, every (M, N, K) in {256..32768}³ | `kind: block` shapes: a transformer block's forward, activation- and weight-gradient GEMMs |
| grouped GEMM (per datatype) | experts of 8×4096×14336, 64×2048×1408, 256×7168×2048 (experts × hidden × expert ffn) | experts of 8×6144×16384 and 128×2048×768 (GROUPED_GEMM_TEST_SHAPES) |
| grouped GEMM from a forward + backward table: the GEMM fit's efficiency only | Llama 4's experts | DeepSeek-V3's (GROUPED_PASSES_TEST_MODEL) |
| fused attention | sequence 2048 and 8192 | sequence 4096 |
| HBM-bound layers | inputs of 1, 16 and 256 MiB | inputs of 4, 64 and 1024 MiB |
| network (nccl-tests) | every message size | — (no held-out split) |

The fit minimises the sum of squared log-ratios (modelled / measured time), so every point
weighs by its relative error whatever its size, with a small Levenberg–Marquardt loop on the
parameters' logarithms (which keeps them positive) — numpy only. Fitted values are rounded
to 3 significant digits (values below a stated floor become 0), and the errors reported are
those of the rounded values, i.e. of what the system file says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel.calibration.measurements import (AttentionData, EltwiseData, GemmData, GroupedGemmData, GroupedPassesData,
                                                NcclData)
from costmodel.errors import InputError
from costmodel.terms.kernel_time import GemmTiming, attention_time_s, gemm_time_s, hbm_pass_s
from costmodel.terms.step_terms import gemm_in_step
from costmodel.ops import ArrayOps
from costmodel.inputs.system import AttentionFit, GemmFit
from costmodel.inputs.units import MICRO, TERA

SIGNIFICANT_DIGITS = 3
GROUPED_GEMM_TEST_SHAPES = ((8, 6144, 16384), (128, 2048, 768))
"""(experts, hidden, expert ffn) held out of the grouped-GEMM fit: Mixtral 8x22B's and
Qwen3-30B-A3B's experts, one of few large and one of many small experts."""
GROUPED_PASSES_TEST_MODEL = "DeepSeekV3"
"""The model whose expert shapes are held out of a grouped-GEMM fit on a forward + backward
table (pytorch/ao's B200 table: Llama 4 16e's and DeepSeek-V3's experts)."""
LOSS_VALUES_PER_OUTPUT = 5
"""The benchmark's loss, F.mse_loss(out, ones) and its backward: the forward reads the output and
the labels, the backward reads both again and writes the output's gradient, each the output's size."""
ATTENTION_TEST_SEQ = 4096.0
ELTWISE_FIT_MIB = (1.0, 16.0, 256.0)


@dataclass(frozen=True)
class Errors:
    """|relative error| of modelled time over a set of points."""

    count: int
    median: float
    p90: float

    @staticmethod
    def of(modelled: np.ndarray, measured: np.ndarray) -> "Errors":
        if len(measured) == 0:
            return Errors(0, float("nan"), float("nan"))
        err = np.abs(modelled / measured - 1.0)
        return Errors(len(err), float(np.median(err)), float(np.percentile(err, 90)))

    def text(self) -> str:
        if not self.count:
            return "no points"
        return f"{self.count} points, median {100 * self.median:.1f} %, p90 {100 * self.p90:.1f} %"


@dataclass(frozen=True)
class FamilyFit:
    """One fitted family: its system-file fields (file units, rounded) and its errors."""

    family: str
    fields: dict
    fit: Errors
    test: Errors
    fit_points: str
    test_points: str


def rounded(value: float, floor: float = 0.0) -> float:
    """`value` to SIGNIFICANT_DIGITS digits; 0 below `floor` (a negligible overhead)."""
    if value < floor:
        return 0.0
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def fit_log_least_squares(model: Callable[[np.ndarray], np.ndarray], start: np.ndarray, measured: np.ndarray,
                          iterations: int = 300) -> np.ndarray:
    """Positive parameters minimising Σ log(model(params) / measured)², by Levenberg–Marquardt
    on log(params) with a forward-difference Jacobian. Deterministic.

    Marquardt's schedule: damping starts at 1e-3 of the normal matrix's diagonal, is divided
    by 3 after a step that lowers the cost and multiplied by 4 after one that does not; it
    gives up past 1e10 (no descent left) and stops when no log-parameter moves by 1e-8. The
    Jacobian's step is 1e-6 in log space (a relative change of 1e-6 in each parameter); 1e-12
    on the diagonal keeps the system solvable when a parameter has no effect; log-parameters
    stay within ±700 so that exp() stays finite."""
    logp = np.log(np.asarray(start, dtype=float))
    residual = np.log(model(np.exp(logp)) / measured)
    cost, damping, step_size = residual @ residual, 1e-3, 1e-6
    for _ in range(iterations):
        jac = np.empty((len(measured), len(logp)))
        for i in range(len(logp)):
            shifted = logp.copy()
            shifted[i] += step_size
            jac[:, i] = (np.log(model(np.exp(shifted)) / measured) - residual) / step_size
        normal, gradient = jac.T @ jac, jac.T @ residual
        while True:
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            trial = np.clip(logp + step, -700.0, 700.0)
            trial_residual = np.log(model(np.exp(trial)) / measured)
            trial_cost = trial_residual @ trial_residual
            if np.isfinite(trial_cost) and trial_cost < cost:
                logp, residual, cost, damping = trial, trial_residual, trial_cost, damping / 3
                break
            damping *= 4
            if damping > 1e10:
                return np.exp(logp)
        if np.abs(step).max() < 1e-8:
            break
    return np.exp(logp)


# ---------------------------------------------------------------- GEMM

def _gemm_bytes(data: GemmData, elem_bytes: float) -> np.ndarray:
    """Operands and result in the compute datatype, as costmodel/terms/block.py counts a GEMM's bytes."""
    return elem_bytes * data.batch * (data.rows * data.depth + data.depth * data.cols + data.rows * data.cols)


def gemm_predict(fields: dict, data: GemmData, peak_flops_per_s: float, hbm_bytes_per_s: float,
                 elem_bytes: float) -> np.ndarray:
    timing = GemmFit(**fields).timing()
    return gemm_time_s(timing, ArrayOps, data.rows, data.cols, data.depth, _gemm_bytes(data, elem_bytes),
                       peak_flops_per_s, hbm_bytes_per_s, data.batch)


GEMM_FIELDS = ("launch_us", "efficiency", "depth_overhead", "fill_outputs", "power_drop", "power_flops",
               "hbm_efficiency")
# Below these a fitted value is negligible and written as 0: 0.01 µs of launch, less than one
# element of overhead, a power drop under 0.1 %.
GEMM_FLOORS = (0.01, 0.0, 1.0, 1.0, 1e-3, 0.0, 0.0)


POWER_ONSET_S = 1.08e-3
"""How long a GEMM runs at full rate before half of a clock drop has set in, when timed alone:
the H100's measured BF16 fit (h100-80g-nvl8.yaml: power_flops / (peak · efficiency) = 9.71e11 /
(989e12 · 0.91)). Only a table timed at full clock (FullClock) takes it; microbenchmarks fit
their own. In a step such a GPU runs at its sustained clock throughout (step_terms.gemm_in_step)."""


@dataclass(frozen=True)
class FullClock:
    """Kernels timed in short runs at full clock (a published table): the fit has no drop (the
    table shows none); the written fields carry the system's sustained-clock drop (`Clocks.drop`,
    setting in after POWER_ONSET_S at full rate when timed alone) and the host-side launch
    overhead the table's device timing leaves out (`launch_overhead_us`)."""

    drop: float
    launch_overhead_us: float


def _fit_gemm_fields(times: Callable[[GemmTiming], np.ndarray], measured: np.ndarray, peak_flops_per_s: float,
                     full_clock: FullClock | None = None) -> dict:
    """The GemmFit fields (file units, rounded) minimising the log error of `times(timing)`; with
    `full_clock`, five of them at full clock, then the drop, its onset and the launch overhead."""

    def values_of(params) -> list:
        if full_clock is not None:
            launch_s, efficiency, depth, fill, hbm = params
            params = (launch_s, efficiency, depth, fill, 0.0, 1.0, hbm)
        launch_s, *rest = params
        values = [launch_s / MICRO, *rest]
        values[1], values[6] = min(values[1], 1.0), min(values[6], 1.0)
        return values

    def model(params: np.ndarray) -> np.ndarray:
        return times(GemmFit.model_construct(**dict(zip(GEMM_FIELDS, values_of(params)))).timing())

    # Starting point (the fit moves far from it): 5 µs launch, 0.8 of peak, 200 K-steps of
    # tile overhead, 1e5 outputs to fill the GPU, a 30 % power drop from ~1e12 FLOP, 0.7 of HBM.
    start = np.array([5e-6, 0.8, 200.0, 1e5, 0.3, 1e12, 0.7])
    if full_clock is not None:
        start = start[[0, 1, 2, 3, 6]]
    values = values_of(fit_log_least_squares(model, start, measured))
    if full_clock is not None:
        values[0] += full_clock.launch_overhead_us
        values[4] = full_clock.drop
        values[5] = POWER_ONSET_S * peak_flops_per_s * values[1]
    return dict(zip(GEMM_FIELDS, (rounded(v, f) for v, f in zip(values, GEMM_FLOORS))))


def at_full_clock(fields: dict, full_clock: FullClock | None) -> dict:
    """GEMM fields as a table at full clock timed them: no drop, no host launch overhead."""
    if full_clock is None:
        return fields
    return {**fields, "launch_us": max(0.0, fields["launch_us"] - full_clock.launch_overhead_us), "power_drop": 0.0}


def fit_gemm(train: GemmData, test: GemmData, peak_flops_per_s: float, hbm_bytes_per_s: float,
             elem_bytes: float, label: str, split: tuple[str, str] = ("grid", "block"),
             full_clock: FullClock | None = None) -> FamilyFit:
    """The GEMM model fitted on `train`, its errors on `train` and `test` as the measurements
    timed them (a table at full clock: `at_full_clock`)."""
    def times(timing: GemmTiming) -> np.ndarray:
        return gemm_time_s(timing, ArrayOps, train.rows, train.cols, train.depth, _gemm_bytes(train, elem_bytes),
                           peak_flops_per_s, hbm_bytes_per_s, train.batch)

    fields = _fit_gemm_fields(times, train.time_s, peak_flops_per_s, full_clock)
    as_timed, rates = at_full_clock(fields, full_clock), (peak_flops_per_s, hbm_bytes_per_s, elem_bytes)
    return FamilyFit(f"gemm {label}", fields, Errors.of(gemm_predict(as_timed, train, *rates), train.time_s),
                     Errors.of(gemm_predict(as_timed, test, *rates), test.time_s), f"kind: {split[0]}",
                     f"kind: {split[1]}")


def sustained_drop(fields: dict, data: GemmData, peak_flops_per_s: float, hbm_bytes_per_s: float,
                   elem_bytes: float) -> float:
    """The clock drop published long runs of GEMMs show against a fit at full clock: the
    geometric mean of measured / modelled time, less 1 (`fields` as a file states them, the
    launch included: the long runs were timed from the host)."""
    modelled = gemm_predict({**fields, "power_drop": 0.0}, data, peak_flops_per_s, hbm_bytes_per_s, elem_bytes)
    return float(np.exp(np.mean(np.log(data.time_s / modelled)))) - 1.0


# ---------------------------------------------------------------- grouped GEMM

def grouped_gemm_bytes(data: GroupedGemmData, elem_bytes: float) -> np.ndarray:
    """Every expert's operands and result once, in the compute datatype."""
    return elem_bytes * data.experts * (data.rows * data.depth + data.depth * data.cols + data.rows * data.cols)


def grouped_gemm_predict(timing: GemmTiming, data: GroupedGemmData, peak_flops_per_s: float, hbm_bytes_per_s: float,
                         elem_bytes: float) -> np.ndarray:
    """The GEMM formula with batch = experts: one launch for the whole group (costmodel/terms/moe.py)."""
    return gemm_time_s(timing, ArrayOps, data.rows, data.cols, data.depth, grouped_gemm_bytes(data, elem_bytes),
                       peak_flops_per_s, hbm_bytes_per_s, data.experts)


def _shape_names(shapes) -> str:
    return ", ".join(f"{e}×{h}×{f}" for e, h, f in sorted(set(shapes)))


def fit_grouped_gemm(data: GroupedGemmData, peak_flops_per_s: float, hbm_bytes_per_s: float, elem_bytes: float,
                     label: str) -> FamilyFit:
    """The GEMM formula's seven fields fitted anew to grouped GEMMs, on every shape but
    GROUPED_GEMM_TEST_SHAPES, tested on those."""
    held_out = np.array([shape in GROUPED_GEMM_TEST_SHAPES for shape in data.shapes])
    train, test = data.subset(~held_out), data.subset(held_out)
    if len(train.time_s) < len(GEMM_FIELDS):
        raise InputError(f"grouped_gemm: {len(train.time_s)} {label} points outside the held-out shapes "
                         f"{_shape_names(GROUPED_GEMM_TEST_SHAPES)}; need >= {len(GEMM_FIELDS)}")
    rates = (peak_flops_per_s, hbm_bytes_per_s, elem_bytes)
    fields = _fit_gemm_fields(lambda timing: grouped_gemm_predict(timing, train, *rates), train.time_s,
                              peak_flops_per_s)
    timing = GemmFit(**fields).timing()
    return FamilyFit(f"grouped gemm {label}", fields,
                     Errors.of(grouped_gemm_predict(timing, train, *rates), train.time_s),
                     Errors.of(grouped_gemm_predict(timing, test, *rates), test.time_s),
                     f"experts×hidden×ffn {_shape_names(train.shapes)}", f"{_shape_names(test.shapes) or 'none'}")


def grouped_passes_predict(timing: GemmTiming, data: GroupedPassesData, peak_flops_per_s: float,
                           hbm_bytes_per_s: float, elem_bytes: float, loss_bytes_per_s: float) -> np.ndarray:
    """Forward + backward of a grouped GEMM as the table timed it: its three grouped GEMMs as they
    run (forward rows × N × K, activation gradient rows × K × N, weight gradient K × N × rows, rows
    = total_M / groups) and the loss's HBM passes (LOSS_VALUES_PER_OUTPUT values per output at
    `loss_bytes_per_s`)."""
    rows = data.total_rows / data.groups
    total = 0.0
    for m, n, k in ((rows, data.cols, data.depth), (rows, data.depth, data.cols), (data.depth, data.cols, rows)):
        total = total + grouped_gemm_predict(timing, GroupedGemmData(data.groups, m, n, k, data.time_s, ()),
                                             peak_flops_per_s, hbm_bytes_per_s, elem_bytes)
    return total + LOSS_VALUES_PER_OUTPUT * elem_bytes * data.total_rows * data.cols / loss_bytes_per_s


def fit_grouped_gemm_efficiency(gemm: dict, data: GroupedPassesData, peak_flops_per_s: float,
                                hbm_bytes_per_s: float, elem_bytes: float, loss_bytes_per_s: float,
                                label: str) -> FamilyFit:
    """A grouped-GEMM fit from a forward + backward table too small for seven fields: the file's
    GEMM fit `gemm` (file units) with its efficiency refitted (and the power drop's onset with it,
    POWER_ONSET_S at the new rate), timed as a step runs it (at the sustained clock: the table's
    kernels ran back to back). Fitted on every model but GROUPED_PASSES_TEST_MODEL, tested on it."""
    held_out = np.array([model == GROUPED_PASSES_TEST_MODEL for model in data.models])
    train, test = data.subset(~held_out), data.subset(held_out)
    if not len(train.time_s):
        raise InputError(f"grouped_gemm_fwd_bwd.json: every {label} point is {GROUPED_PASSES_TEST_MODEL}'s, the "
                         "held-out model; the fit needs points of another model")

    def fields_at(efficiency: float) -> dict:
        return {**gemm, "efficiency": min(efficiency, 1.0),
                "power_flops": POWER_ONSET_S * peak_flops_per_s * min(efficiency, 1.0)}

    def times(fields: dict, points: GroupedPassesData) -> np.ndarray:
        timing = gemm_in_step(GemmFit(**fields).timing(), 0.0, 0.0, peak_flops_per_s, at_sustained_clock=True)
        return grouped_passes_predict(timing, points, peak_flops_per_s, hbm_bytes_per_s, elem_bytes,
                                      loss_bytes_per_s)

    (efficiency,) = fit_log_least_squares(lambda params: times(fields_at(params[0]), train), np.array([gemm["efficiency"]]),
                                          train.time_s)
    fields = {key: rounded(fields_at(efficiency)[key], floor) for key, floor in zip(GEMM_FIELDS, GEMM_FLOORS)}
    return FamilyFit(f"grouped gemm {label}", fields, Errors.of(times(fields, train), train.time_s),
                     Errors.of(times(fields, test), test.time_s), f"{', '.join(sorted(set(train.models)))} "
                     "forward + backward", f"{', '.join(sorted(set(test.models))) or 'none'}")


def block_layer_shapes():
    """(forward, activation-gradient, weight-gradient) GEMM shapes (M, N, K) of the layers of a
    transformer block, as benchmarks/measure_gpu.py enumerates the `kind: block` GEMMs:
    hidden h, tp t, T tokens; QKV (h → 3h/t), projection (h/t → h), MLP (h → 4h/t, 4h/t → h)."""
    for h in (4096, 8192, 12288, 18432, 25600):
        for t in (1, 2, 4, 8, 16):
            for tokens in (2048, 8192):
                for depth, cols in ((h, 3 * h // t), (h // t, h), (h, 4 * h // t), (4 * h // t, h)):
                    yield (tokens, cols, depth), (tokens, depth, cols), (depth, cols, tokens)


def layer_errors(fields: dict, data: GemmData, peak_flops_per_s: float, hbm_bytes_per_s: float,
                 elem_bytes: float) -> Errors:
    """How well costmodel/terms/block.py's rule — a layer's backward GEMMs take twice its forward
    GEMM — predicts the measured forward + activation-gradient + weight-gradient time of each
    layer whose three GEMMs are in `data` (the `kind: block` points: held out from the fit)."""
    measured = {(m, n, k): t for m, n, k, t in zip(data.rows, data.cols, data.depth, data.time_s)}
    forward, totals = [], []
    for shapes in block_layer_shapes():
        if all(shape in measured for shape in shapes):
            forward.append(shapes[0])
            totals.append(sum(measured[shape] for shape in shapes))
    rows, cols, depth = (np.array([shape[i] for shape in forward], dtype=float) for i in range(3))
    modelled = 3.0 * gemm_predict(fields, GemmData(rows, cols, depth, np.array(totals)), peak_flops_per_s,
                                  hbm_bytes_per_s, elem_bytes)
    return Errors.of(modelled, np.array(totals))


# ---------------------------------------------------------------- fused attention

def attention_fwd_bwd_s(fields: dict, data: AttentionData) -> np.ndarray:
    """Forward + backward of one fused attention layer as costmodel/terms/block.py adds it up: the
    forward kernel (2 s×s×data products per head), backward twice the forward, and the
    recomputed Q·Kᵀ (1 product)."""
    p = AttentionFit(**fields).timing()
    forward = attention_time_s(p, 2.0, data.batch_heads, data.seq, data.head_size)
    return 3.0 * forward + attention_time_s(p, 1.0, data.batch_heads, data.seq, data.head_size)


def _attention_subset(data: AttentionData, keep: np.ndarray) -> AttentionData:
    return AttentionData(data.batch_heads[keep], data.seq[keep], data.head_size[keep], data.fwd_bwd_s[keep])


def fit_attention(data: AttentionData) -> FamilyFit:
    held_out = data.seq == ATTENTION_TEST_SEQ
    train, test = _attention_subset(data, ~held_out), _attention_subset(data, held_out)
    if len(train.seq) < 5:
        raise InputError(f"attention: {len(train.seq)} points outside sequence {ATTENTION_TEST_SEQ:g}; need >= 5")
    names = ("launch_us", "tflops", "head_size_overhead", "seq_overhead", "fill_rows")
    floors = (0.01, 0.0, 1.0, 1.0, 1.0)      # as for GEMMs: 0.01 µs, one element, position or row

    def model(params: np.ndarray) -> np.ndarray:
        fields = dict(zip(names, (params[0] / MICRO, params[1] / TERA, *params[2:])))
        return attention_fwd_bwd_s(fields, train)

    # Starting point: 10 µs launch, 1,000 TFLOP/s, 30 head-size elements, 300 key positions and
    # 1e4 query rows of overhead.
    best = fit_log_least_squares(model, np.array([1e-5, 1e15, 30.0, 300.0, 1e4]), train.fwd_bwd_s)
    fields = dict(zip(names, (rounded(v, f) for v, f in zip((best[0] / MICRO, best[1] / TERA, *best[2:]), floors))))
    return FamilyFit("attention bf16", fields, Errors.of(attention_fwd_bwd_s(fields, train), train.fwd_bwd_s),
                     Errors.of(attention_fwd_bwd_s(fields, test), test.fwd_bwd_s),
                     "seq 2048, 8192 (fwd + bwd)", f"seq {ATTENTION_TEST_SEQ:g} (fwd + bwd)")


# ---------------------------------------------------------------- HBM-bound layers

def hbm_predict(fields: dict, num_bytes: np.ndarray, hbm_bytes_per_s: float) -> np.ndarray:
    return hbm_pass_s(num_bytes, hbm_bytes_per_s * fields["efficiency"], fields["latency_us"] * MICRO)


def fit_hbm(data: EltwiseData, hbm_bytes_per_s: float) -> FamilyFit:
    train = np.isin(data.mib, ELTWISE_FIT_MIB)
    if train.sum() < 2:
        raise InputError(f"eltwise: {int(train.sum())} points of {', '.join(f'{m:g}' for m in ELTWISE_FIT_MIB)} MiB; "
                         "need >= 2")

    def model(params: np.ndarray) -> np.ndarray:
        return hbm_pass_s(data.num_bytes[train], hbm_bytes_per_s * min(params[1], 1.0), params[0])

    best = fit_log_least_squares(model, np.array([5e-6, 0.8]), data.time_s[train])   # 5 µs, 0.8 of bandwidth
    fields = {"efficiency": rounded(min(best[1], 1.0)), "latency_us": rounded(best[0] / MICRO, 0.01)}
    return FamilyFit("hbm-bound layers", fields,
                     Errors.of(hbm_predict(fields, data.num_bytes[train], hbm_bytes_per_s), data.time_s[train]),
                     Errors.of(hbm_predict(fields, data.num_bytes[~train], hbm_bytes_per_s), data.time_s[~train]),
                     "1, 16, 256 MiB, every op", "4, 64, 1024 MiB, every op")


# ---------------------------------------------------------------- a network level

def fit_network(data: NcclData, bandwidth_gbps: float, label: str) -> FamilyFit:
    """latency + bus bytes / (bandwidth · efficiency) (costmodel/terms/comm.py), linear least squares
    on relative errors; a negative latency is refitted as 0."""
    weights = 1.0 / data.time_s
    design = np.stack([np.ones_like(data.time_s), data.bus_bytes], axis=1) * weights[:, None]
    (latency_s, seconds_per_byte), *_ = np.linalg.lstsq(design, np.ones_like(data.time_s), rcond=None)
    if latency_s < 0:
        latency_s = 0.0
        seconds_per_byte = float(np.sum(data.bus_bytes * weights ** 2) / np.sum((data.bus_bytes * weights) ** 2))
    if seconds_per_byte <= 0:
        raise InputError(f"nccl-tests for {label}: time does not grow with message size; cannot fit a bandwidth")
    efficiency = 1.0 / (seconds_per_byte * bandwidth_gbps * 1e9)
    if efficiency > 1.0:
        raise InputError(f"nccl-tests for {label}: measured bus bandwidth {1 / seconds_per_byte / 1e9:.1f} GB/s "
                         f"exceeds the network's bandwidth_gbps {bandwidth_gbps:g}")
    fields = {"efficiency": rounded(efficiency), "latency_us": rounded(latency_s / MICRO, 0.01)}
    modelled = fields["latency_us"] * MICRO + data.bus_bytes / (bandwidth_gbps * 1e9 * fields["efficiency"])
    no_points = Errors.of(np.array([]), np.array([]))
    return FamilyFit(f"network {label}", fields, Errors.of(modelled, data.time_s), no_points, "every message size",
                     "none")
