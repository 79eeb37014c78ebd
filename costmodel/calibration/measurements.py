"""Reading measurements in the shared microbenchmark format (benchmarks/measure_gpu.py writes
it; problems/measurements/README.md describes it) and nccl-tests output, as numpy arrays in SI
units. Every malformed file or point is an InputError naming the file, the point and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodel.errors import InputError
from costmodel.inputs.load import parse, read_document
from costmodel.inputs.model import RealNumber, WholeNumber
from costmodel.inputs.units import MICRO

# Points carry derived fields (tflops, gbps, ...) beside the measured ones: ignored, not errors.
_POINT = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class GemmPoint(BaseModel):
    model_config = _POINT
    dtype: Literal["bf16", "fp8"]
    # grid / block: this project's microbenchmark (grid fitted, block held out); fit / held_out: a
    # published table split in two halves; long_run: a published GEMM timed long enough for the
    # power limit to hold its clock down (problems/measurements/README.md).
    kind: Literal["grid", "block", "fit", "held_out", "long_run"]
    batch: WholeNumber = Field(1, gt=0)
    M: WholeNumber = Field(gt=0)
    N: WholeNumber = Field(gt=0)
    K: WholeNumber = Field(gt=0)
    ms: RealNumber = Field(gt=0)


class GroupedGemmPoint(BaseModel):
    model_config = _POINT
    dtype: Literal["bf16", "fp8"]
    experts: WholeNumber = Field(gt=0)
    hidden: WholeNumber = Field(gt=0)
    expert_ffn: WholeNumber = Field(gt=0)
    M: WholeNumber = Field(gt=0)
    N: WholeNumber = Field(gt=0)
    K: WholeNumber = Field(gt=0)
    ms: RealNumber = Field(gt=0)


class GroupedGemmPassesPoint(BaseModel):
    """One grouped GEMM timed forward + backward (its three GEMMs and the benchmark's loss):
    `total_M` rows split over `groups`, times (N × K) weights per group (a published table:
    problems/measurements/README.md)."""

    model_config = _POINT
    dtype: Literal["bf16", "fp8"]
    model: str = Field(min_length=1)           # the model whose expert shape it is: the held-out split
    total_M: WholeNumber = Field(gt=0)
    N: WholeNumber = Field(gt=0)
    K: WholeNumber = Field(gt=0)
    groups: WholeNumber = Field(gt=0)
    fwd_bwd_us: RealNumber = Field(gt=0)


class AttentionPoint(BaseModel):
    model_config = _POINT
    seq: WholeNumber = Field(gt=0)
    head_dim: WholeNumber = Field(gt=0)
    heads: WholeNumber = Field(gt=0)
    batch: WholeNumber = Field(gt=0)
    fwd_ms: RealNumber = Field(gt=0)
    fwd_bwd_ms: RealNumber = Field(gt=0)


class EltwisePoint(BaseModel):
    model_config = _POINT
    op: str
    mib: RealNumber = Field(gt=0)
    bytes: RealNumber = Field(gt=0)
    ms: RealNumber = Field(gt=0)


class AdamPoint(BaseModel):
    model_config = _POINT
    params: WholeNumber = Field(gt=0)
    ms: RealNumber = Field(gt=0)


def _points(path: Path, cls: type[BaseModel]) -> list:
    data = read_document(path)
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty list of measured points")
    points = []
    for i, item in enumerate(data):
        if isinstance(item, dict) and "error" in item:
            continue                      # a point the measuring script could not take
        points.append(parse(cls, item, f"{path}: point {i}"))
    if not points:
        raise InputError(f"{path}: every point records an error; nothing to fit")
    return points


@dataclass(frozen=True)
class GemmData:
    rows: np.ndarray
    cols: np.ndarray
    depth: np.ndarray
    time_s: np.ndarray
    batch: np.ndarray | float = 1.0     # GEMMs of that shape in one kernel (a batched matmul)


@dataclass(frozen=True)
class GroupedGemmData:
    """Grouped GEMMs: `experts` GEMMs of rows × cols × depth (rows = tokens per expert) in one
    kernel, each point from the experts of a model shape (experts, hidden, expert_ffn)."""

    experts: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    depth: np.ndarray
    time_s: np.ndarray
    shapes: tuple[tuple[int, int, int], ...]     # (experts, hidden, expert_ffn) of each point

    def subset(self, keep: np.ndarray) -> "GroupedGemmData":
        return GroupedGemmData(self.experts[keep], self.rows[keep], self.cols[keep], self.depth[keep],
                               self.time_s[keep], tuple(s for s, k in zip(self.shapes, keep) if k))


@dataclass(frozen=True)
class GroupedPassesData:
    """Grouped GEMMs timed forward + backward: `groups` GEMMs of (total_M / groups) × N × K
    forward, each point from the experts of a named model."""

    groups: np.ndarray
    total_rows: np.ndarray
    cols: np.ndarray
    depth: np.ndarray
    time_s: np.ndarray
    models: tuple[str, ...]

    def subset(self, keep: np.ndarray) -> "GroupedPassesData":
        return GroupedPassesData(self.groups[keep], self.total_rows[keep], self.cols[keep], self.depth[keep],
                                 self.time_s[keep], tuple(m for m, k in zip(self.models, keep) if k))


@dataclass(frozen=True)
class AttentionData:
    batch_heads: np.ndarray
    seq: np.ndarray
    head_size: np.ndarray
    fwd_bwd_s: np.ndarray


@dataclass(frozen=True)
class EltwiseData:
    op: tuple[str, ...]
    mib: np.ndarray
    num_bytes: np.ndarray
    time_s: np.ndarray


GEMM_SPLITS = (("grid", "block"), ("fit", "held_out"))
"""The (fitted, held-out) kinds of a gemm.json: this project's grid and block shapes, or a
published table's two halves."""


def load_gemm(path: Path, dtype: str, kind: str) -> GemmData:
    """The GEMMs of one datatype (`bf16`, `fp8`) and kind (`grid`, `block`, `fit`, `held_out`)
    in a gemm.json."""
    chosen = [p for p in _points(path, GemmPoint) if p.dtype == dtype and p.kind == kind]
    if not chosen:
        raise InputError(f"{path}: no {dtype} GEMMs of kind {kind!r}")
    return GemmData(*(np.array([getattr(p, f) for p in chosen], dtype=float) for f in ("M", "N", "K")),
                    np.array([p.ms for p in chosen]) * 1e-3, np.array([p.batch for p in chosen], dtype=float))


def gemm_split(path: Path, dtype: str) -> tuple[str, str]:
    """The (fitted, held-out) kinds the GEMMs of `dtype` in a gemm.json come in."""
    kinds = {p.kind for p in _points(path, GemmPoint) if p.dtype == dtype}
    for split in GEMM_SPLITS:
        if kinds & set(split):
            return split
    raise InputError(f"{path}: no {dtype} GEMMs")


def load_grouped_gemm(path: Path, dtype: str) -> GroupedGemmData:
    """The grouped GEMMs of one datatype (`bf16`, `fp8`) in a grouped_gemm.json."""
    chosen = [p for p in _points(path, GroupedGemmPoint) if p.dtype == dtype]
    if not chosen:
        raise InputError(f"{path}: no {dtype} grouped GEMMs")
    columns = (np.array([getattr(p, f) for p in chosen], dtype=float) for f in ("experts", "M", "N", "K"))
    return GroupedGemmData(*columns, np.array([p.ms for p in chosen]) * 1e-3,
                           tuple((p.experts, p.hidden, p.expert_ffn) for p in chosen))


def load_grouped_gemm_passes(path: Path, dtype: str) -> GroupedPassesData:
    """The grouped GEMMs of one datatype timed forward + backward in a grouped_gemm_fwd_bwd.json."""
    chosen = [p for p in _points(path, GroupedGemmPassesPoint) if p.dtype == dtype]
    if not chosen:
        raise InputError(f"{path}: no {dtype} grouped GEMMs")
    columns = (np.array([getattr(p, f) for p in chosen], dtype=float) for f in ("groups", "total_M", "N", "K"))
    return GroupedPassesData(*columns, np.array([p.fwd_bwd_us for p in chosen]) * MICRO,
                             tuple(p.model for p in chosen))


def load_attention(path: Path) -> AttentionData:
    pts = _points(path, AttentionPoint)
    return AttentionData(np.array([p.batch * p.heads for p in pts], dtype=float),
                         np.array([p.seq for p in pts], dtype=float), np.array([p.head_dim for p in pts], dtype=float),
                         np.array([p.fwd_bwd_ms for p in pts]) * 1e-3)


def load_eltwise(path: Path) -> EltwiseData:
    pts = _points(path, EltwisePoint)
    return EltwiseData(tuple(p.op for p in pts), np.array([p.mib for p in pts], dtype=float),
                       np.array([p.bytes for p in pts], dtype=float), np.array([p.ms for p in pts]) * 1e-3)


def load_adam(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(parameters, seconds) of the fused AdamW steps in an adam.json."""
    pts = _points(path, AdamPoint)
    return np.array([p.params for p in pts], dtype=float), np.array([p.ms for p in pts]) * 1e-3


# ---------------------------------------------------------------- nccl-tests

@dataclass(frozen=True)
class NcclData:
    """Out-of-place rows of one nccl-tests run: message size, time, and the bytes each GPU puts
    on the wire (size × busbw / algbw, nccl-tests' bus-bandwidth factor, e.g. 2(n−1)/n)."""

    size_bytes: np.ndarray
    time_s: np.ndarray
    bus_bytes: np.ndarray


_NUMBER = r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
# size count type redop root time algbw busbw #wrong ...  (all_reduce_perf, reduce_scatter_perf, ...)
_ROW = re.compile(rf"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+{_NUMBER}\s+({_NUMBER})\s+({_NUMBER})\s+({_NUMBER})\s")


def load_nccl(path: Path) -> NcclData:
    """Parse nccl-tests text output (e.g. `all_reduce_perf -b 8 -e 8G -f 2`): each result row
    gives size (B), count, type, redop, root, then out-of-place time (µs), algbw and busbw (GB/s)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror})") from None
    rows = [m.groups() for line in text.splitlines() if not line.lstrip().startswith("#") and (m := _ROW.match(line))]
    if len(rows) < 2:
        raise InputError(f"{path}: found {len(rows)} nccl-tests result rows (size count type redop root time algbw "
                         "busbw ...); need at least 2")
    size = np.array([float(r[0]) for r in rows])
    time_s = np.array([float(r[2]) for r in rows]) * 1e-6
    algbw = np.array([float(r[3]) for r in rows])
    busbw = np.array([float(r[4]) for r in rows])
    if (time_s <= 0).any():
        raise InputError(f"{path}: a row has a time <= 0 µs")
    # busbw / algbw is the same for every row of one run; small messages print 0.00 for both.
    ratios = busbw[algbw > 0] / algbw[algbw > 0]
    if ratios.size == 0:
        raise InputError(f"{path}: no row has a bandwidth above 0.00 GB/s; measure larger messages")
    return NcclData(size, time_s, size * float(np.median(ratios)))
