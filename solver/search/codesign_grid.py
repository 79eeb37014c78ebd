"""The co-design grid: the knobs, their candidate values, the order "least" is taken in,
the target, and one candidate's verdict (solver.search.codesign answers the question)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from costmodel.errors import InputError
from costmodel.evaluate import Evaluation
from costmodel.inputs.system import System
from solver.search.explain import TIE_REL

CAPACITY_KNOBS = ("hbm_gib", "offload_gib")
"""Knobs that enter only feasibility: the best time never grows with them."""
OUTER_KNOBS = ("offload_gbps", "nvlink_size")
"""Knobs that change times: one CP-SAT model per combination of their values."""
MONOTONE_KNOBS = CAPACITY_KNOBS + ("offload_gbps",)
"""Knobs more of which never makes any mapping slower or infeasible: capacities (only in the
feasibility checks) and offload bandwidth (only as bytes / (rate · efficiency(bytes)) in
the offload times, each exposed through max(·, compute) or summed)."""
ENUMERATED_KNOBS = ("nvlink_size",)
"""Knobs with no such guarantee (the NVLink size changes which groups fit and which network
must be filled): every value is asked, nothing is pruned across them."""
KNOBS = CAPACITY_KNOBS + OUTER_KNOBS
OFFLOAD_FLAGS = ("weight_offload", "activations_offload", "optimizer_offload")

System_ = dict[str, float]
"""One candidate system: the value of each varied knob, by knob name."""

MAX_GRID_SYSTEMS = 10_000
"""Candidate systems one grid may hold, as a batch file's problems (solver.study.batch): each
may be a certified search of its own, and the answer lists every smaller one in its proof."""
MAX_MODELS = 100
"""Combinations of the outer knobs (offload_gbps × nvlink_size values) one grid may hold:
each is a CP-SAT model of its own, built and searched like one `solve` (seconds to minutes,
tens of MB); real questions ask a handful of NVLink sizes (4, 8, 16, 36, 72) and bandwidths."""


@dataclass(frozen=True)
class Grid:
    """The varied knobs with their ascending values, and the order "least" is taken in."""

    values: dict[str, tuple[float, ...]]     # knob -> ascending values, in --vary order
    order: tuple[str, ...]                   # lexicographic order (every varied knob once)
    cost: dict[str, float] = field(default_factory=dict)   # knob -> weight (empty: lexicographic)

    @classmethod
    def build(cls, values: dict[str, tuple[float, ...]], minimize: tuple[str, ...] = (),
              cost: dict[str, float] | None = None) -> "Grid":
        """Check the knobs and values (one-line errors naming the option) and fix the order."""
        if not values:
            raise InputError("--vary: give at least one knob, e.g. --vary hbm_gib=80,120")
        for knob, vals in values.items():
            if knob not in KNOBS:
                raise InputError(f"--vary: {knob!r} is not a knob (knobs: {', '.join(KNOBS)})")
            if not vals:
                raise InputError(f"--vary {knob}: no values")
        _check_size(values)
        for knob, vals in values.items():
            if any(not math.isfinite(x) or x < 0 or (x == 0 and knob != "offload_gib") for x in vals):
                raise InputError(f"--vary {knob}={_listed(vals)}: values must be positive (offload_gib may be 0)")
            if any(b <= a for a, b in zip(vals, vals[1:])):
                raise InputError(f"--vary {knob}={_listed(vals)}: values must be ascending")
        for option, names in (("--minimize", minimize), ("--cost", tuple(cost or ()))):
            for knob in names:
                if knob not in values:
                    raise InputError(f"{option}: {knob!r} is not a varied knob (varied: {', '.join(values)})")
        if len(set(minimize)) != len(minimize):
            raise InputError(f"--minimize: {','.join(minimize)} names a knob twice")
        for knob, weight in (cost or {}).items():
            if not math.isfinite(weight) or weight < 0:
                raise InputError(f"--cost {knob}={weight:g}: a weight must be a number >= 0")
        order = tuple(minimize) + tuple(k for k in values if k not in minimize)
        return cls({k: tuple(float(x) for x in v) for k, v in values.items()}, order, dict(cost or {}))

    def key(self, system: System_) -> tuple:
        """The order's sort key: smaller is less hardware; distinct systems never tie."""
        lex = tuple(system[k] for k in self.order)
        return (sum(w * system[k] for k, w in self.cost.items()), lex) if self.cost else (0.0, lex)

    def candidates(self) -> list[System_]:
        """Every grid point, least first."""
        names = list(self.values)
        points = [dict(zip(names, combo)) for combo in itertools.product(*(self.values[k] for k in names))]
        return sorted(points, key=self.key)

    def outer(self, system: System_) -> tuple:
        return tuple(system.get(k) for k in OUTER_KNOBS)

    def dominates(self, big: System_, small: System_) -> bool:
        """`big` has the same NVLink size and every monotone knob at least `small`'s: its
        certified best time is at most `small`'s (or both are infeasible)."""
        return (all(big.get(k) == small.get(k) for k in ENUMERATED_KNOBS)
                and all(big[k] >= small[k] for k in MONOTONE_KNOBS if k in self.values))


def _listed(values: tuple[float, ...], limit: int = 60) -> str:
    """Values as --vary takes them, cut short when long."""
    text = ",".join(f"{x:g}" for x in values)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _check_size(values: dict[str, tuple[float, ...]]) -> None:
    """Refuse a grid past MAX_GRID_SYSTEMS systems or MAX_MODELS outer combinations, before any
    question is asked: the error spells the product out."""
    systems = math.prod(len(vals) for vals in values.values())
    if systems > MAX_GRID_SYSTEMS:
        product = " × ".join(f"{knob} {len(vals):,}" for knob, vals in values.items())
        raise InputError(f"--vary: the grid has {systems:,} systems ({product}), more than {MAX_GRID_SYSTEMS:,}: "
                         f"vary fewer values")
    outer = {knob: len(vals) for knob, vals in values.items() if knob in OUTER_KNOBS}
    models = math.prod(outer.values())
    if models > MAX_MODELS:
        product = " × ".join(f"{knob} {n:,}" for knob, n in outer.items())
        raise InputError(f"--vary: {product} values make {models:,} CP-SAT models (one per combination, each "
                         f"searched like one solve), more than {MAX_MODELS}: vary fewer of these values")


def least_reaching(values: tuple[float, ...], reaches_at: Callable[[float], bool], monotone: bool) -> float | None:
    """The smallest of the ascending `values` at which `reaches_at` holds (None: none).

    `monotone`: holding at a value implies holding at every larger one (a monotone knob, the
    others at their largest or enumerated). Then bisection asks about log2(n) values, and
    every value below the answer lies below one asked that missed — the miss that proves it.
    Otherwise (an NVLink size) every value is asked in order."""
    if not monotone:
        return next((value for value in values if reaches_at(value)), None)
    low, high = 0, len(values)      # below `low`: proven misses; at `high` (if any): reaches
    while low < high:
        middle = (low + high) // 2
        if reaches_at(values[middle]):
            high = middle
        else:
            low = middle + 1        # values[middle] missed: it proves every value up to it
    return values[low] if low < len(values) else None


@dataclass(frozen=True)
class Target:
    """What "reaches" means: the certified best time <= a time, given directly, as an MFU
    (needs one global batch across the space, so MFU is proportional to 1/time), or within
    a fraction of the best the grid allows (time <= best / (1 - within): at one global
    batch, MFU >= (1 - within) × the best MFU)."""

    kind: str        # "time" | "mfu" | "within"
    value: float

    def __post_init__(self) -> None:
        if self.kind not in ("time", "mfu", "within"):
            raise InputError(f"target: {self.kind!r} is not time, mfu or within")
        if not math.isfinite(self.value) or self.value <= 0 or (self.kind != "time" and self.value >= 1):
            option = {"time": "--target-time", "mfu": "--target-mfu", "within": "--within"}[self.kind]
            need = "a time > 0 s" if self.kind == "time" else "a fraction in (0, 1)"
            raise InputError(f"{option}: {self.value:g} is not {need}")

    def time_s(self, reference: Evaluation) -> float:
        """The target as a time, given the fastest mapping the grid allows."""
        if self.kind == "time":
            return self.value
        if self.kind == "mfu":
            return reference.iteration_time_s * reference.mfu / self.value
        return reference.iteration_time_s / (1 - self.value)


@dataclass(frozen=True)
class Verdict:
    """One candidate system's answer: its certified best time (asked directly), or a bound
    from a question that dominates it (same outer knobs, capacities at least as large)."""

    system: System_
    best_time_s: float | None        # certified best time; None: no mapping is feasible
    certified: bool
    dominated_by: System_ | None = None   # None: asked directly

    def to_dict(self) -> dict:
        verdict = "infeasible" if self.best_time_s is None else "slower"
        out = {"system": as_json(self.system), "verdict": verdict, "certified": self.certified}
        if self.dominated_by is None:
            out["best_time_s"] = self.best_time_s
        else:
            out["dominated_by"] = as_json(self.dominated_by)
            out["best_time_at_least_s"] = self.best_time_s
        return out


def as_json(point: System_ | None) -> dict | None:
    """A system for JSON: whole values as integers ({"offload_gib": 512})."""
    return None if point is None else {k: int(v) if float(v).is_integer() else v for k, v in point.items()}


def system_at(base: System, point: System_) -> System:
    """The base system with the point's knob values (System.with_overrides)."""
    return base.with_overrides(**{k: (int(v) if k == "nvlink_size" else v) for k, v in point.items()})


def check_values(base: System, grid: Grid) -> None:
    """Every value must make a valid system (beside the largest capacities): the error names
    --vary and the value."""
    top = {k: max(v) for k, v in grid.values.items() if k in MONOTONE_KNOBS}
    for knob, values in grid.values.items():
        for value in values:
            if knob == "nvlink_size" and value != int(value):
                raise InputError(f"--vary {knob}={value:g}: not a whole number of GPUs")
            try:
                system_at(base, {**top, knob: value})
            except InputError as err:
                reason = str(err).split(": ", 1)[-1]
                raise InputError(f"--vary {knob}={value:g}: {reason}") from None


def reaches(best: Evaluation | None, target_s: float) -> bool:
    return best is not None and best.iteration_time_s <= target_s * (1 + TIE_REL)
