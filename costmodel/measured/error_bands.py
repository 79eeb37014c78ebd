"""How far off the model is, by class of prediction: the spread of its out-of-sample errors on
the shipped measured runs (docs/training-runs.md, "Error bands").

A prediction's class is its GPU generation (from the system file's compute capability), the
precision family its GEMMs run in (bf16, fp8, fp4) and whether the model is dense or a mixture
of experts. The errors are the signed (predicted − measured) / measured of the runs of that
class, each scored without its own configuration in the fit (leave one configuration out; the
MoE and NVFP4 rows are fitted on nothing, so their errors are out of sample as they are).

A class's band is where the next run's error should fall four times in five: a Student-t
prediction interval, mean ± t(0.90, ν) · s · √(1 + 1/n), around the class's mean error. Its
spread s pools the class's own with PRIOR_RUNS runs' worth of the spread of every class's errors
(so a class of one or two runs is not taken as exact), ν = n − 1 + PRIOR_RUNS. No central
correction is applied to the point figure: a class's bias shows as a band off zero.

    bands = bands_from(residuals)           # {class: [signed error, ...]} -> {class: Band}
    write_bands(path, bands, source)        # problems/runs/error-bands.json
    band = load_bands().get(error_class(system, model, precision, datatype))
    low_s, high_s = band.time_range(predicted_s)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from statistics import NormalDist
from pathlib import Path
from typing import Iterable

import numpy as np

from costmodel.errors import InputError
from costmodel.measured.runs import PROBLEMS_DIR

BANDS_FILE = PROBLEMS_DIR / "runs" / "error-bands.json"
PRIOR_RUNS = 4
"""Runs' worth of the spread over every class each class's spread is pooled with."""
COVERAGE = 0.80
"""The share of new runs a band is meant to hold (two-sided: 10 % outside on each side)."""
UNKNOWN = "no measured runs of this kind: error unknown"


def generation(compute_capability: float | None) -> str:
    """A GPU generation by CUDA compute capability: ampere (8.x), hopper (9.x), blackwell (10.x+)."""
    if compute_capability is None:
        return "unknown"
    return "ampere" if compute_capability < 9 else "hopper" if compute_capability < 10 else "blackwell"


def precision_family(precision, datatype) -> str:
    """The number format a problem's GEMMs run in: fp4 (NVFP4), fp8 (every FP8 recipe, MXFP8,
    --datatype float8), bf16 (bf16 and 16-bit datatypes), fp32."""
    name = getattr(precision, "value", precision)
    if name is not None:
        return "fp4" if name == "nvfp4" else "bf16" if name == "bf16" else "fp8"
    kind = getattr(datatype, "value", datatype)
    return {"float8": "fp8", "float32": "fp32"}.get(kind, "bf16")


def error_class(system, model, precision, datatype) -> str:
    """The class of a prediction: generation/precision family/dense or moe."""
    capability = None if system.precision is None else system.precision.compute_capability
    kind = "moe" if model.num_experts else "dense"
    return f"{generation(capability)}/{precision_family(precision, datatype)}/{kind}"


@dataclass(frozen=True)
class Band:
    """One class's out-of-sample errors: `low` and `high` bound the signed error
    (predicted − measured) / measured; `runs` how many runs they come from."""

    cls: str
    runs: int
    low: float
    high: float
    median: float

    def time_range(self, predicted_s: float) -> tuple[float, float]:
        """The measured time the band allows for a prediction: predicted / (1 + error), from the
        highest error to the lowest."""
        return predicted_s / (1.0 + self.high), predicted_s / (1.0 + self.low)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    def text(self) -> str:
        return (f"model {100 * self.low:+.1f} % to {100 * self.high:+.1f} % of measured ({COVERAGE:.0%} band from "
                f"{self.runs} run{'s' if self.runs != 1 else ''} of {self.cls}, out of sample)")

    def to_dict(self, predicted_s: float | None = None) -> dict:
        out = {"class": self.cls, "runs": self.runs, "error_low": self.low, "error_high": self.high,
               "error_median": self.median}
        if predicted_s is not None:
            out["time_low_s"], out["time_high_s"] = self.time_range(predicted_s)
        return out


def t_quantile(p: float, dof: float) -> float:
    """Student's t quantile by the Cornish–Fisher expansion around the normal one (within 1 % of
    the exact value for ν ≥ 3 at p = 0.9: 1.627 against 1.638 at ν = 3)."""
    z = float(NormalDist().inv_cdf(p))
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def band_of(cls: str, errors: Iterable[float], prior_sd: float) -> Band | None:
    """The prediction band of one class's signed errors, its spread pooled with `prior_sd`
    (None without any error)."""
    values = np.array([e for e in errors if e is not None and np.isfinite(e)], dtype=float)
    n = len(values)
    if not n:
        return None
    own = float(values.var(ddof=1)) * (n - 1) if n > 1 else 0.0
    dof = n - 1 + PRIOR_RUNS
    sd = float(np.sqrt((own + PRIOR_RUNS * prior_sd ** 2) / dof))
    half = t_quantile(0.5 + COVERAGE / 2, dof) * sd * float(np.sqrt(1 + 1 / n))
    mean = float(values.mean())
    return Band(cls, n, mean - half, mean + half, float(np.median(values)))


def pooled_sd(residuals: dict[str, list[float]]) -> float:
    """The spread of the errors about their classes' means, over every class with two runs or more."""
    squares = sum(float(((np.array(v) - np.mean(v)) ** 2).sum()) for v in residuals.values() if len(v) > 1)
    dof = sum(len(v) - 1 for v in residuals.values() if len(v) > 1)
    return float(np.sqrt(squares / dof)) if dof else 0.0


def bands_from(residuals: dict[str, list[float]]) -> dict[str, Band]:
    """A band per class that has runs."""
    prior = pooled_sd(residuals)
    return {cls: band for cls, errors in sorted(residuals.items())
            if (band := band_of(cls, errors, prior)) is not None}


def write_bands(path: Path, bands: dict[str, Band], source: str) -> None:
    document = {"about": "Out-of-sample errors of the step time by class of prediction (costmodel/measured/"
                         "error_bands.py); written by `mapsat calibrate --runs ... --bands FILE`.",
                "source": source, "coverage": COVERAGE, "prior_runs": PRIOR_RUNS,
                "bands": [band.to_dict() for band in bands.values()]}
    Path(path).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def load_bands(path: Path = BANDS_FILE) -> dict[str, Band]:
    """The bands of a bands file (the shipped one by default); {} when there is none."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["bands"]
        return {r["class"]: Band(r["class"], int(r["runs"]), float(r["error_low"]), float(r["error_high"]),
                                 float(r["error_median"])) for r in rows}
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path}: not an error-bands file ({err})") from None


def band_document(band: Band | None, cls: str, predicted_s: float | None) -> dict:
    """What JSON answers carry: the band and the time range, or the class and UNKNOWN."""
    if band is None:
        return {"class": cls, "runs": 0, "unknown": UNKNOWN}
    return band.to_dict(predicted_s)


def band_text(band: Band | None, cls: str, predicted_s: float | None, unit: str = "s") -> str:
    """One line: the band and the measured time it allows, or UNKNOWN."""
    if band is None:
        return f"{cls}: {UNKNOWN}"
    if predicted_s is None:
        return band.text()
    low, high = band.time_range(predicted_s)
    return f"{low:.4g}–{high:.4g} {unit}: {band.text()}"


@dataclass(frozen=True)
class ClassedError:
    """One run's out-of-sample error, its class and its configuration."""

    cls: str
    configuration: str
    error: float


def classed_errors(scores: Iterable, inputs) -> list[ClassedError]:
    """The scored runs' errors with their classes (`scores`: RunScore, `inputs`: RunInputs)."""
    out = []
    for s in scores:
        if s.status != "scored" or s.time_error is None:
            continue
        cls = error_class(inputs.system(s.run), inputs.model(s.run), s.run.precision, s.datatype)
        out.append(ClassedError(cls, s.run.configuration_key, s.time_error))
    return out


def bands_of(errors: Iterable[ClassedError]) -> dict[str, Band]:
    residuals: dict[str, list[float]] = {}
    for e in errors:
        residuals.setdefault(e.cls, []).append(e.error)
    return bands_from(residuals)


@dataclass(frozen=True)
class Coverage:
    """How often a run's error falls inside the band of its class made without its
    configuration, and how wide those bands are."""

    inside: int
    scored: int
    median_half_width: float

    @property
    def share(self) -> float:
        return self.inside / self.scored if self.scored else float("nan")


def coverage(errors: list[ClassedError]) -> Coverage:
    """Each run against the band its class has without the runs of its configuration, the pooled
    spread taken without them too (runs whose class has no other configuration are not counted:
    their band would be unknown)."""
    inside, widths = 0, []
    for e in errors:
        rest = [o for o in errors if o.configuration != e.configuration]
        residuals: dict[str, list[float]] = {}
        for o in rest:
            residuals.setdefault(o.cls, []).append(o.error)
        band = band_of(e.cls, residuals.get(e.cls, []), pooled_sd(residuals))
        if band is None:
            continue
        widths.append(band.half_width)
        inside += band.low <= e.error <= band.high
    return Coverage(inside, len(widths), float(np.median(widths)) if widths else float("nan"))
