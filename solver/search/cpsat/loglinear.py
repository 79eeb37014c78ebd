"""Sums of quantized logarithms over one-hot Booleans, and exp of such a sum bounded below
by tangent lines: the two pieces the surrogate (solver.search.cpsat.surrogate) builds every
product term of the time and memory bounds from.

The quantization boundary (all integers CP-SAT sees are made here and in the surrogate):
    Y = floor(LOG_SCALE · ln value) for added logs, and -ceil(...) for subtracted ones, so
    a sum of quantized logs never exceeds the true one; every tangent line's intercept is
    floored, so a tangent never rises above exp.
"""

from __future__ import annotations

import math

import numpy as np
from ortools.sat.python import cp_model

LOG_SCALE = 10_000
"""Y = floor(LOG_SCALE · ln x): logarithms resolved to 1e-4 (0.01 % in value)."""
TANGENT_STEP = 0.1
"""Tangent points every 0.1 in ln-space: exp lies at most step²/8 ≈ 0.13 % above its tangents."""
SLOPE_SCALE = 2**20
"""Tangent slopes are rational with this denominator."""
TANGENT_DECADES = 7.0
"""Tangents cover 7 decades below the ceiling (to 1e-3 reference times); below, a term's
bound is 0 (still sound, and such terms are negligible next to the optimum)."""
PRODUCT_GUARD = 1 << 60
"""A tangent's slope times y's range above this would risk CP-SAT's int64 overflow check: y is
then clamped from below (add_exp_term)."""
TINY = 1e-30
"""Stands in for an exact 0 inside a logarithm (a term that vanishes, e.g. TP with tp = 1)."""


def qlog(value: float, sign: int = 1) -> int:
    """sign·ln(value) quantized downward, so sums of quantized logs never exceed the true sum."""
    return math.floor(sign * LOG_SCALE * math.log(max(value, TINY)))


class LogLinear:
    """A linear expression over Booleans in quantized-log units, with its range."""

    def __init__(self, const: int = 0):
        self.const = const
        self.terms: list[tuple[int, cp_model.IntVar]] = []
        self.lo = const
        self.hi = const

    def add_table(self, table: dict, lits: dict, sign: int = 1) -> "LogLinear":
        """Add Σ qlog(table[k], sign)·lits[k] over an exactly-one set of literals."""
        coefs = {k: qlog(table[k], sign) for k in lits}
        self.terms += [(coefs[k], lits[k]) for k in lits]
        self.lo += min(coefs.values())
        self.hi += max(coefs.values())
        return self

    def add_const(self, value: float, sign: int = 1) -> "LogLinear":
        q = qlog(value, sign)
        self.const += q
        self.lo += q
        self.hi += q
        return self

    def add_var(self, var: cp_model.IntVar, lo: int, hi: int) -> "LogLinear":
        self.terms.append((1, var))
        self.lo += lo
        self.hi += hi
        return self

    def plus(self, other: "LogLinear") -> "LogLinear":
        out = LogLinear(self.const + other.const)
        out.terms = self.terms + other.terms
        out.lo, out.hi = self.lo + other.lo, self.hi + other.hi
        return out

    def expr(self):
        return sum(c * v for c, v in self.terms) + self.const


def add_log_var(cpsat: cp_model.CpModel, name: str, alternatives: list[tuple[list, LogLinear]],
                floor: LogLinear | None = None) -> LogLinear:
    """A variable equal to the alternative whose literals hold, as a one-term LogLinear.
    `floor`, a lower bound of every alternative, is added unconditionally: the enforced
    equalities relax to nothing in CP-SAT's LP, the floor keeps the LP bound useful."""
    lo = min(a.lo for _, a in alternatives)
    hi = max(a.hi for _, a in alternatives)
    y = cpsat.NewIntVar(lo, hi, name)
    for i, (lits, alt) in enumerate(alternatives):
        cpsat.Add(y == alt.expr()).WithName(f"{name}: alternative {i}").OnlyEnforceIf(lits)
    if floor is not None:
        cpsat.Add(y >= floor.expr()).WithName(f"{name}: floor")
    return LogLinear().add_var(y, lo, hi)


def add_exp_term(cpsat: cp_model.CpModel, name: str, log: LogLinear, unit: float, ceiling: float,
                 active=None) -> cp_model.IntVar:
    """z >= exp(y)/unit by tangent lines, where y = `log` (quantized). `active` (literals, or
    None for always) switches the bound on — when off, z >= 0 only."""
    lo, hi = log.lo, log.hi
    y = cpsat.NewIntVar(lo, hi, f"log_{name}")
    cpsat.Add(y == log.expr()).WithName(f"log_{name}: sum of quantized logs")
    y_top = min(hi / LOG_SCALE, math.log(ceiling))
    start = max(lo / LOG_SCALE, y_top - TANGENT_DECADES * math.log(10))
    points = np.arange(y_top, start - TANGENT_STEP, -TANGENT_STEP)
    lines = []
    for point in points:
        value = math.exp(point) / unit                       # F(Y) = exp(Y/S)/unit at the point
        slope = math.floor(value / LOG_SCALE * SLOPE_SCALE)  # K·F'(Y), rounded down
        if slope <= 0:
            continue
        # Tangent of F with exactly this rational slope touches at Y* where F'(Y*) = slope/K.
        y_star = LOG_SCALE * math.log(slope * LOG_SCALE * unit / SLOPE_SCALE)
        f_star = slope * LOG_SCALE / SLOPE_SCALE
        intercept = math.floor(SLOPE_SCALE * f_star - slope * y_star) - 1
        lines.append((slope, intercept))
    steepest = max((s for s, _ in lines), default=0)
    if steepest * max(abs(lo), abs(hi)) > PRODUCT_GUARD:
        # Far below its tangents (a product with an exact 0 in it), y only needs to reach the
        # point where every line is <= 0: clamp it there, so slope·y stays inside int64. The
        # LP keeps y_clamped >= y, so no strength is lost where the lines bind.
        y_floor = min(math.floor(-b / s) for s, b in lines)
        if lo < y_floor:
            clamped = cpsat.NewIntVar(y_floor, max(hi, y_floor), f"log_{name}_clamped")
            cpsat.AddMaxEquality(clamped, [y, y_floor]).WithName(f"log_{name}_clamped = max(log_{name}, {y_floor})")
            y = clamped
    # z's domain must hold every line's value over y's range, or CP-SAT would exclude mappings
    z_max = max([0] + [math.ceil((s * hi + b) / SLOPE_SCALE) for s, b in lines])
    z = cpsat.NewIntVar(0, z_max, name)
    for i, (slope, intercept) in enumerate(lines):
        ct = cpsat.Add(SLOPE_SCALE * z >= slope * y + intercept).WithName(f"{name}: tangent {i}")
        if active is not None:
            ct.OnlyEnforceIf(active)
    return z
