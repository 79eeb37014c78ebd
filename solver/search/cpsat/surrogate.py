"""The piecewise-linear lower bound of iteration time (the objective) and of HBM use (the
memory constraint), built from tables of the exact model.

Soundness is the point: for every mapping the surrogate objective is <= its exact time and
the surrogate memory <= its exact HBM use, so CP-SAT never excludes a feasible mapping
and never over-estimates one; the exact model adjudicates every candidate (solver.search.solve).

How: the exact iteration time is bounded below by a sum of products,

    (n + (pp-1)/v) · (L/pp · B + H + 2·v·P2P) + usage·DP + OPT,

(n = microbatches = batch/dp/microbatch; B one block and microbatch — compute, exposed TP
communication, recompute and unhidden offload traffic; H the output layer; P2P one
pipeline send; DP the data-parallel reduction, of which overlap hides at most all but the
compute it steals; OPT the optimizer step), each factor an exact table of the model over
a few dimensions ((tp, cp, ep, microbatch), the (tp, cp, ep, pp) split) minimised over the flags it does not
read (solver.search.cpsat.tables); B has one table per combination of the flags it reads. Expanded, each product term is exp(y) with y a sum of
logarithms — linear in the one-hot Booleans — and exp(y) is bounded below by tangent lines
(exp is convex). Memory is the same with one product term (stored activations × blocks in
flight).

The quantization boundary (all integers CP-SAT sees are made here):
    Y = floor(LOG_SCALE · ln value) for added logs, and -ceil(...) for subtracted ones, so
    a sum of quantized logs never exceeds the true one;
    time in units of `time_unit_s`, memory in MiB; every tangent line's intercept is
    floored, and since each term variable is an integer that may round its bound up by
    less than one unit, the proven bound is taken as (objective - number of terms) units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from costmodel.context import Context
from costmodel.units import MiB
from solver.search.cpsat.tables import (ACT_CLASSES, RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL, RECOMPUTE_NONE, TP_COMM_RS_AG,
                                        Tables, block_lower_bounds, even_layout_literals, offers_zero_bubble,
                                        stage_floors)
from solver.search.cpsat.variables import Variables

LOG_SCALE = 10_000
"""Y = floor(LOG_SCALE · ln x): logarithms resolved to 1e-4 (0.01 % in value)."""
TANGENT_STEP = 0.1
"""Tangent points every 0.1 in ln-space: exp lies at most step²/8 ≈ 0.13 % above its tangents."""
SLOPE_SCALE = 2**20
"""Tangent slopes are rational with this denominator."""
TANGENT_DECADES = 7.0
"""Tangents cover 7 decades below the ceiling (to 1e-3 reference times); below, a term's
bound is 0 (still sound, and such terms are negligible next to the optimum)."""
UNITS_PER_REFERENCE = 1e6
"""Time unit = reference time / 1e6, the reference being a lower bound on any mapping's
compute time: the objective resolves the optimum to about a millionth."""
CEILING_REFERENCES = 1e4
"""Tangents stop at 10^4 reference times; above, the last tangent continues (still a lower
bound, and no mapping that slow can be optimal), which keeps every coefficient in int64."""
PRODUCT_GUARD = 1 << 60
"""A tangent's slope times y's range above this would risk CP-SAT's int64 overflow check: y is
then clamped from below (add_exp_term)."""
MAX_LINEAR_UNITS = 1 << 40
"""A linear term (DP, optimizer, memory) is capped at 2^40 units, 10^6 reference times or 1 EiB:
lowering a lower bound keeps it sound, no mapping that far out is optimal or fits, and the
objective's sum stays far inside CP-SAT's 64-bit integers whatever the inputs."""
MEMORY_UNIT_BYTES = MiB
MEMORY_CEILING_CAPACITIES = 64
"""Activation tangents stop at 64 × the HBM capacity: any mapping needing more is far past
infeasible, and the last tangent still bounds it from below."""
TINY = 1e-30
"""Stands in for an exact 0 inside a logarithm (a term that vanishes, e.g. TP with tp = 1)."""


def qlog(value: float, sign: int = 1) -> int:
    """sign·ln(value) quantized downward, so sums of quantized logs never exceed the true sum."""
    return math.floor(sign * LOG_SCALE * math.log(max(value, TINY)))


@dataclass(frozen=True)
class Quantization:
    time_unit_s: float
    memory_unit_bytes: float
    time_terms: int
    memory_terms: int


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


def add_log_var(m: cp_model.CpModel, name: str, alternatives: list[tuple[list, LogLinear]],
                floor: LogLinear | None = None) -> LogLinear:
    """A variable equal to the alternative whose literals hold, as a one-term LogLinear.
    `floor`, a lower bound of every alternative, is added unconditionally: the enforced
    equalities relax to nothing in CP-SAT's LP, the floor keeps the LP bound useful."""
    lo = min(a.lo for _, a in alternatives)
    hi = max(a.hi for _, a in alternatives)
    y = m.NewIntVar(lo, hi, name)
    for lits, alt in alternatives:
        m.Add(y == alt.expr()).OnlyEnforceIf(lits)
    if floor is not None:
        m.Add(y >= floor.expr())
    return LogLinear().add_var(y, lo, hi)


def add_exp_term(m: cp_model.CpModel, name: str, log: LogLinear, unit: float, ceiling: float,
                 active=None) -> cp_model.IntVar:
    """z >= exp(y)/unit by tangent lines, where y = `log` (quantized). `active` (literals, or
    None for always) switches the bound on — when off, z >= 0 only."""
    lo, hi = log.lo, log.hi
    y = m.NewIntVar(lo, hi, f"log_{name}")
    m.Add(y == log.expr())
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
            clamped = m.NewIntVar(y_floor, max(hi, y_floor), f"log_{name}_clamped")
            m.AddMaxEquality(clamped, [y, y_floor])
            y = clamped
    # z's domain must hold every line's value over y's range, or CP-SAT would exclude mappings
    z_max = max([0] + [math.ceil((s * hi + b) / SLOPE_SCALE) for s, b in lines])
    z = m.NewIntVar(0, z_max, name)
    for slope, intercept in lines:
        ct = m.Add(SLOPE_SCALE * z >= slope * y + intercept)
        if active is not None:
            ct.OnlyEnforceIf(active)
    return z


@dataclass
class Bounds:
    """What the surrogate added to the model: the objective's term variables and the memory
    lower bound, with the quantization that maps them back to seconds and bytes."""

    objective_terms: list
    memory_terms: list
    quantization: Quantization
    block_floors: dict      # (tp, cp, ep, pp, interleaving, microbatch) -> surrogate lower bound, s

    def objective(self):
        return sum(self.objective_terms)

    def memory(self):
        return sum(self.memory_terms)

    def add_floor_cuts(self, m: cp_model.CpModel, v: Variables, exclude=()) -> None:
        """Cuts from the block floors of the blocks not in `exclude` (those already scored and
        cut): objective >= the smallest floor of the (tp, cp, ep, pp) split, and of the (tp, cp,
        ep, microbatch) group, that a solution picks; a split or triple with nothing left is
        forbidden. Valid inequalities: they never exclude an unscored mapping.

        Exactly one split and one pair literal is true, so each family is one linear
        inequality, objective >= Σ floor · literal, which the LP relaxation reads at full
        strength (one implied inequality per literal would reach the LP only big-M weak)."""
        q = self.quantization
        objective = self.objective()
        for floors, lits in floor_families(self.block_floors, v, set(exclude)):
            weighted = []
            for key, lit in lits.items():
                value = floors.get(key, math.inf)
                if not math.isfinite(value):
                    m.AddBoolOr([lit.Not()])
                else:
                    floor_units = math.floor(min(value / q.time_unit_s, MAX_LINEAR_UNITS)) - q.time_terms
                    weighted.append(max(0, floor_units) * lit)
            m.Add(objective >= sum(weighted))

    def add_cutoff(self, m: cp_model.CpModel, target_s: float) -> None:
        """objective <= the units of `target_s` (plus the rounding of each term): only
        mappings whose surrogate could still beat or tie the target remain. Left out when
        the target is past the tangents' ceiling (no coefficient may leave int64)."""
        q = self.quantization
        units = target_s / q.time_unit_s
        if units < MAX_LINEAR_UNITS:
            m.Add(self.objective() <= math.floor(units) + q.time_terms)

    def seconds(self, objective_units: float) -> float:
        """A proven objective bound in units, as a sound bound on the exact time in seconds."""
        q = self.quantization
        return max(0.0, (objective_units - q.time_terms) * q.time_unit_s)


def floor_families(block_floors: dict, v: Variables, skip) -> tuple:
    """The smallest block floor of each (tp, cp, ep, pp) split and of each (tp, cp, ep,
    microbatch) group over the blocks not in `skip`, each with the literals it is keyed by."""
    by_split: dict = {}
    by_group_mb: dict = {}
    for key, floor in block_floors.items():
        if key in skip:
            continue
        t, c, e, p, _, mb = key
        by_split[(t, c, e, p)] = min(by_split.get((t, c, e, p), math.inf), floor)
        by_group_mb[(t, c, e, mb)] = min(by_group_mb.get((t, c, e, mb), math.inf), floor)
    return (by_split, v.split), (by_group_mb, v.group_mb)


def _units(value: float, divisor: float) -> int:
    """value / divisor rounded down and capped at MAX_LINEAR_UNITS (still a lower bound)."""
    return math.floor(min(value / divisor, MAX_LINEAR_UNITS))


def add_bounds(m: cp_model.CpModel, v: Variables, c: Context, num_gpus: int, local_batch: dict,
               tp_overlaps: tuple[int, ...], hbm_capacity_bytes: float | None, enforce_hbm: bool = True,
               skeletons=None) -> Bounds:
    """Add the time objective terms and, unless `hbm_capacity_bytes` is None, the HBM lower
    bound (constrained to the capacity when `enforce_hbm`). `local_batch[(tp, cp, ep, pp)]`
    is batch/dp of that split."""
    tables = Tables(c, v, num_gpus, tp_overlaps, len(c.net_size))
    flag = v.flag
    # literals meaning "pp > 1": [] when always, None when never
    if 1 not in v.pp.is_:
        pp_gt1: list | None = []
    elif len(v.pp.is_) == 1:
        pp_gt1 = None
    else:
        pp_gt1 = [v.pp.is_[1].Not()]
    pp_values = {p: float(p) for p in v.pp.is_}
    # Blocks per stage, bounded below for uneven layouts (costmodel.pipeline): in time, the
    # last stage's (its blocks and the output layer never outlast the slowest stage); in
    # memory, what the first stage keeps alive per microbatch in flight (see stage_floors).
    time_blocks, memory_blocks = stage_floors(c.blocks, v.pp.is_, v)
    even_layout = even_layout_literals(m, v, c.blocks)
    pp_minus_1 = {p: float(p - 1) for p in v.pp.is_}
    mb_values = {mb: float(mb) for mb in v.microbatch.is_}
    il_values = {il: float(il) for il in v.interleaving.is_}
    local = {k: float(local_batch[k]) for k in v.split}

    t_ref = min(local[(t, c, e, p)] * time_blocks[p] * min(tables.compute[(t2, c2, e2, mb)] / mb
                                                          for (t2, c2, e2, mb) in tables.tm_keys if (t2, c2, e2) == (t, c, e))
                for (t, c, e, p) in v.split)
    unit = t_ref / UNITS_PER_REFERENCE
    ceiling = t_ref * CEILING_REFERENCES

    def microbatches():       # ln(batch/dp/microbatch)
        return LogLinear().add_table(local, v.split).add_table(mb_values, v.microbatch.is_, -1)

    def bubble():             # ln((pp-1)/interleaving)
        return LogLinear().add_table(pp_minus_1, v.pp.is_).add_table(il_values, v.interleaving.is_, -1)

    comm_rs_ag = flag("tp_comm", TP_COMM_RS_AG)
    # ln(one block's time): one alternative per combination of the flags a block reads
    block_alternatives = [([flag("tp_comm", comm), flag("seq_par_ag_redo", redo),
                            flag("recompute", rc), flag("weight_offload", w), flag("activations_offload", a)],
                           LogLinear().add_table(table, v.group_mb))
                          for (comm, redo, rc, w, a), table in tables.block.items()]
    block_floor = {k: min(table[k] for table in tables.block.values()) for k in v.group_mb}
    block_log = add_log_var(m, "log_block_s", block_alternatives, LogLinear().add_table(block_floor, v.group_mb))
    # In the bubble, a ZB-H1 block is shorter by its weight-gradient GEMMs: where the space
    # offers ZB-H1 the bubble's blocks take that (smaller) table, a lower bound either way.
    if offers_zero_bubble(v.space, v.num_networks):
        bubble_alternatives = [([flag("tp_comm", comm), flag("seq_par_ag_redo", redo), flag("recompute", rc),
                                 flag("weight_offload", w), flag("activations_offload", a)],
                                LogLinear().add_table(table, v.group_mb))
                               for (comm, redo, rc, w, a), table in tables.block_zb.items()]
        bubble_floor = {k: min(table[k] for table in tables.block_zb.values()) for k in v.group_mb}
        bubble_block_log = add_log_var(m, "log_bubble_block_s", bubble_alternatives,
                                       LogLinear().add_table(bubble_floor, v.group_mb))
    else:
        bubble_block_log = block_log
    parts = {  # name -> (LogLinear of the part, literals that switch it on; None = never)
        "blocks": (LogLinear().add_table(time_blocks, v.pp.is_).plus(block_log), []),
        "output_layer": (LogLinear().add_table(tables.head, v.group_mb), []),
        "pp_send": (LogLinear().add_const(2.0).add_table(il_values, v.interleaving.is_).add_table(tables.p2p, v.group_mb),
                    pp_gt1),
    }
    objective = []
    for weight_name, weight, weight_active in (("n", microbatches, []), ("bubble", bubble, pp_gt1)):
        for part_name, (part, part_active) in parts.items():
            if weight_active is None or part_active is None:
                continue      # pp is 1 in every mapping: bubble and sends vanish
            active = weight_active + part_active
            if weight_name == "bubble" and part_name == "blocks":
                part = LogLinear().add_table(time_blocks, v.pp.is_).plus(bubble_block_log)
            if weight_name == "bubble" and part_name == "output_layer":
                # uneven stages paced by a middle stage carry no output layer in a ZB-H1
                # bubble: count it in the bubble only where the layout is even
                active = active + even_layout
                if any(lit is None for lit in active):
                    continue
            objective.append(add_exp_term(m, f"time_{weight_name}_{part_name}", weight().plus(part), unit,
                                          ceiling, active or None))
    exp_terms = len(objective)

    def linear_term(name, options, divisor):
        """z >= Σ floor(table[k]/divisor)·pair[k], one table per option literal list."""
        top = max(_units(x, divisor) for _, t in options for x in t.values())
        z = m.NewIntVar(0, top + 1, name)
        for lits, table in options:
            ct = m.Add(z >= sum(_units(table[k], divisor) * lit for k, lit in v.split.items()))
            if lits:
                ct.OnlyEnforceIf(lits)
        return z

    objective.append(linear_term("time_dp_comm", [([], tables.dp_comm)], unit))
    stages = tuple(v.flags["zero"])       # the sharding stages the space offers (codes)
    objective.append(linear_term("time_optimizer", [([flag("zero", z)], tables.optimizer[z]) for z in stages], unit))

    memory = []
    if hbm_capacity_bytes is not None:
        mib = MEMORY_UNIT_BYTES
        memory.append(linear_term("hbm_weights", [([flag("zero", z), flag("weight_offload", w)],
                                                   tables.weights_hbm[(z, w)]) for z in stages for w in (0, 1)], mib))
        memory.append(linear_term("hbm_optimizer", [([flag("zero", z), flag("optimizer_offload", o)],
                                                     tables.optimizer_hbm[(z, o)]) for z in stages for o in (0, 1)], mib))
        memory.append(linear_term("hbm_embedding", [([flag("zero", z)], tables.embedding[z]) for z in stages], mib))
        class_lits = {"no_sp": [comm_rs_ag.Not()], "sp": [comm_rs_ag, flag("seq_par_ag_redo", 0)],
                      "sp_redo": [comm_rs_ag, flag("seq_par_ag_redo", 1)]}
        rcs = (RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE)
        top = max(_units(x, mib) for rc in rcs for cls in ACT_CLASSES for x in tables.workspace[(rc, cls)].values())
        workspace = m.NewIntVar(0, top + 1, "hbm_workspace")
        for rc in rcs:
            for cls in ACT_CLASSES:
                table = tables.workspace[(rc, cls)]
                m.Add(workspace >= sum(_units(table[k], mib) * lit for k, lit in v.group_mb.items())
                      ).OnlyEnforceIf([flag("recompute", rc), *class_lits[cls]])
        memory.append(workspace)
        # blocks in flight >= blocks/pp · min(pp, microbatches): w = min(ln n, ln pp) exactly
        n_log, p_log = microbatches(), LogLinear().add_table(pp_values, v.pp.is_)
        w_lo, w_hi = min(n_log.lo, p_log.lo), max(n_log.hi, p_log.hi)
        w = m.NewIntVar(w_lo, w_hi, "log_min_pp_microbatches")
        pick_n = m.NewBoolVar("inflight_limited_by_microbatches")
        m.Add(w <= n_log.expr())
        m.Add(w <= p_log.expr())
        m.Add(w >= n_log.expr()).OnlyEnforceIf(pick_n)
        m.Add(w >= p_log.expr()).OnlyEnforceIf(pick_n.Not())
        alternatives = []
        for rc in rcs:
            for cls in ACT_CLASSES:
                stored = LogLinear().add_table(tables.stored[(rc, cls)], v.group_mb)
                in_hbm = (LogLinear().add_table(memory_blocks, v.pp.is_)
                          .add_var(w, w_lo, w_hi))
                lits = [flag("recompute", rc), *class_lits[cls]]
                alternatives.append((lits + [flag("activations_offload", 0)], stored.plus(in_hbm)))
                # offloaded: HBM keeps at least one block's worth of the stage's activations
                alternatives.append((lits + [flag("activations_offload", 1)], stored))
        activations = add_log_var(m, "log_hbm_activations", alternatives)
        memory.append(add_exp_term(m, "hbm_activations", activations, mib,
                                   MEMORY_CEILING_CAPACITIES * hbm_capacity_bytes))
        if enforce_hbm:
            m.Add(sum(memory) <= math.floor(hbm_capacity_bytes / mib) + 1)
        # Offload capacity: offloaded weights with their gradients, and offloaded optimizer
        # state, must fit (offloaded activations only add to this, so leaving them out relaxes).
        offloaded = [linear_term("offload_weights", [([flag("weight_offload", 1), flag("zero", z)],
                                                      tables.weights_and_grads[z]) for z in stages], mib),
                     linear_term("offload_optimizer", [([flag("optimizer_offload", 1), flag("zero", z)],
                                                        tables.optimizer_state[z]) for z in stages], mib)]
        m.Add(sum(offloaded) <= math.floor(c.offload_capacity_bytes / mib))
    block_floors = {}
    if skeletons is not None and hbm_capacity_bytes is not None and enforce_hbm:
        block_floors = block_lower_bounds(tables, c, v.space, skeletons, local_batch, c.offload_capacity_bytes > 0,
                                          v.num_networks, hbm_capacity_bytes)
    return Bounds(objective, memory, Quantization(unit, MEMORY_UNIT_BYTES, exp_terms, 1), block_floors)
