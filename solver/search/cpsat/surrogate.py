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
a few dimensions ((tp, cp, ep, etp, microbatch), the (tp, cp, ep, etp, pp) split) minimised over the flags it does not
read (solver.search.cpsat.tables); B has one table per combination of the flags it reads. Expanded, each product term is exp(y) with y a sum of
logarithms — linear in the one-hot Booleans — and exp(y) is bounded below by tangent lines
(exp is convex). Memory is the same with one product term (stored activations × blocks in
flight).

The pieces: `add_time_terms` (the objective), `add_hbm_terms` (the memory lower bound) and
`add_offload_bound`, each returning a small frozen result; `add_bounds` puts them together.

The quantization boundary (all integers CP-SAT sees are made here and in
solver.search.cpsat.loglinear):
    Y = floor(LOG_SCALE · ln value) for added logs, and -ceil(...) for subtracted ones, so
    a sum of quantized logs never exceeds the true one;
    time in units of `time_unit_s`, memory in MiB; every tangent line's intercept is
    floored, and since each term variable is an integer that may round its bound up by
    less than one unit, the proven bound is taken as (objective - number of terms) units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from costmodel.terms.context import Context
from costmodel.inputs.units import MiB
from solver.search.cpsat.loglinear import LogLinear, add_exp_term, add_log_var
from solver.search.cpsat.tables import (ACT_CLASSES, RECOMPUTE_ATTN_ONLY, RECOMPUTE_FULL, RECOMPUTE_NONE, TP_COMM_RS_AG,
                                        Tables, block_lower_bounds, even_layout_literals, offers_zero_bubble,
                                        stage_floors)
from solver.search.cpsat.variables import Variables
from solver.space.declaration import Space

UNITS_PER_REFERENCE = 1e6
"""Time unit = reference time / 1e6, the reference being a lower bound on any mapping's
compute time: the objective resolves the optimum to about a millionth."""
CEILING_REFERENCES = 1e4
"""Tangents stop at 10^4 reference times; above, the last tangent continues (still a lower
bound, and no mapping that slow can be optimal), which keeps every coefficient in int64."""
MAX_LINEAR_UNITS = 1 << 40
"""A linear term (DP, optimizer, memory) is capped at 2^40 units, 10^6 reference times or 1 EiB:
lowering a lower bound keeps it sound, no mapping that far out is optimal or fits, and the
objective's sum stays far inside CP-SAT's 64-bit integers whatever the inputs."""
MEMORY_UNIT_BYTES = MiB
MEMORY_CEILING_CAPACITIES = 64
"""Activation tangents stop at 64 × the HBM capacity: any mapping needing more is far past
infeasible, and the last tangent still bounds it from below."""
@dataclass(frozen=True)
class Quantization:
    time_unit_s: float
    memory_unit_bytes: float
    time_terms: int
    memory_terms: int


@dataclass
class Bounds:
    """What the surrogate added to the model: the objective's term variables and the memory
    lower bound, with the quantization that maps them back to seconds and bytes."""

    objective_terms: list
    memory_terms: list
    quantization: Quantization
    block_floors: dict      # (tp, cp, ep, etp, pp, interleaving, microbatch) -> surrogate lower bound, s

    def objective(self):
        return sum(self.objective_terms)

    def memory(self):
        return sum(self.memory_terms)

    def add_floor_cuts(self, cpsat: cp_model.CpModel, variables: Variables, exclude=()) -> None:
        """Cuts from the block floors of the blocks not in `exclude` (those already scored and
        cut): objective >= the smallest floor of the (tp, cp, ep, etp, pp) split, and of the (tp, cp,
        ep, etp, microbatch) group, that a solution picks; a split or triple with nothing left is
        forbidden. Valid inequalities: they never exclude an unscored mapping.

        Exactly one split and one pair literal is true, so each family is one linear
        inequality, objective >= Σ floor · literal, which the LP relaxation reads at full
        strength (one implied inequality per literal would reach the LP only big-M weak)."""
        q = self.quantization
        objective = self.objective()
        for family, (floors, lits) in zip(("split", "group and microbatch"),
                                           floor_families(self.block_floors, variables, set(exclude)), strict=True):
            weighted = []
            for key, lit in lits.items():
                value = floors.get(key, math.inf)
                if not math.isfinite(value):
                    cpsat.AddBoolOr([lit.Not()]).WithName(f"floor cut: no mapping left in {key}")
                else:
                    floor_units = math.floor(min(value / q.time_unit_s, MAX_LINEAR_UNITS)) - q.time_terms
                    weighted.append(max(0, floor_units) * lit)
            cpsat.Add(objective >= sum(weighted)).WithName(f"floor cut: objective >= the floor of its {family}")

    def add_cutoff(self, cpsat: cp_model.CpModel, target_s: float) -> None:
        """objective <= the units of `target_s` (plus the rounding of each term): only
        mappings whose surrogate could still beat or tie the target remain. Left out when
        the target is past the tangents' ceiling (no coefficient may leave int64)."""
        q = self.quantization
        units = target_s / q.time_unit_s
        if units < MAX_LINEAR_UNITS:
            cpsat.Add(self.objective() <= math.floor(units) + q.time_terms).WithName(
                f"cutoff: objective <= {target_s:g} s")

    def seconds(self, objective_units: float) -> float:
        """A proven objective bound in units, as a sound bound on the exact time in seconds."""
        q = self.quantization
        return max(0.0, (objective_units - q.time_terms) * q.time_unit_s)


def floor_families(block_floors: dict, variables: Variables, skip) -> tuple:
    """The smallest block floor of each (tp, cp, ep, etp, pp) split and of each (tp, cp, ep, etp,
    microbatch) group over the blocks not in `skip`, each with the literals it is keyed by."""
    by_split: dict = {}
    by_group_mb: dict = {}
    for key, floor in block_floors.items():
        if key in skip:
            continue
        split, group_mb = key.split, (*key.split[:-1], key.microbatch)     # the split less pp, and the microbatch
        by_split[split] = min(by_split.get(split, math.inf), floor)
        by_group_mb[group_mb] = min(by_group_mb.get(group_mb, math.inf), floor)
    return (by_split, variables.split), (by_group_mb, variables.group_mb)


def _units(value: float, divisor: float) -> int:
    """value / divisor rounded down and capped at MAX_LINEAR_UNITS (still a lower bound)."""
    return math.floor(min(value / divisor, MAX_LINEAR_UNITS))


@dataclass(frozen=True)
class SplitLogs:
    """The logarithms every product term is built from, over the model's literals."""

    local: dict               # (tp, cp, ep, etp, pp) -> batch/dp
    pp_values: dict
    pp_minus_1: dict
    mb_values: dict
    il_values: dict
    time_blocks: dict         # pp -> blocks of the stage bounded below in time (stage_floors)
    memory_blocks: dict       # pp -> blocks per microbatch in flight bounded below in memory

    def microbatches(self, variables: Variables) -> LogLinear:
        """ln(batch/dp/microbatch)"""
        return LogLinear().add_table(self.local, variables.split).add_table(self.mb_values,
                                                                            variables.microbatch.is_, -1)

    def bubble(self, variables: Variables) -> LogLinear:
        """ln((pp-1)/interleaving)"""
        return LogLinear().add_table(self.pp_minus_1, variables.pp.is_).add_table(self.il_values,
                                                                                  variables.interleaving.is_, -1)


@dataclass(frozen=True)
class TimeTerms:
    """The objective's term variables (time units), the first `exp_terms` of them product terms."""

    terms: list
    exp_terms: int
    unit_s: float


def _linear_term(cpsat: cp_model.CpModel, variables: Variables, name: str, options, divisor: float):
    """z >= Σ floor(table[k]/divisor)·pair[k], one table per option literal list."""
    top = max(_units(x, divisor) for _, t in options for x in t.values())
    z = cpsat.NewIntVar(0, top + 1, name)
    for i, (lits, table) in enumerate(options):
        ct = cpsat.Add(z >= sum(_units(table[k], divisor) * lit for k, lit in variables.split.items())).WithName(
            f"{name} >= its table {i}")
        if lits:
            ct.OnlyEnforceIf(lits)
    return z


def add_time_terms(cpsat: cp_model.CpModel, variables: Variables, tables: Tables, logs: SplitLogs,
                   even_layout: list) -> TimeTerms:
    """The objective: (n + (pp-1)/v) · (blocks · B + H + 2·v·P2P) as product terms, and the
    data-parallel reduction and the optimizer step as linear terms."""
    flag = variables.flag
    several_kinds = tables.several_kinds
    # literals meaning "pp > 1": [] when always, None when never
    if 1 not in variables.pp.is_:
        pp_gt1: list | None = []
    elif len(variables.pp.is_) == 1:
        pp_gt1 = None
    else:
        pp_gt1 = [variables.pp.is_[1].Not()]
    t_ref = min(logs.local[split] * logs.time_blocks[split[-1]]
                * min(tables.compute[group_mb] / group_mb[-1] for group_mb in tables.tm_keys
                      if group_mb[:-1] == split[:-1])
                for split in variables.split)
    unit = t_ref / UNITS_PER_REFERENCE
    ceiling = t_ref * CEILING_REFERENCES

    def block_log(name: str, per_flags: dict) -> LogLinear:
        """ln(one block's time): one alternative per combination of the flags a block reads"""
        alternatives = [([flag("tp_comm", comm), flag("seq_par_ag_redo", redo), flag("recompute", rc),
                          flag("weight_offload", w), flag("activations_offload", a)],
                         LogLinear().add_table(table, variables.group_mb))
                        for (comm, redo, rc, w, a), table in per_flags.items()]
        floor = {k: min(table[k] for table in per_flags.values()) for k in variables.group_mb}
        return add_log_var(cpsat, name, alternatives, LogLinear().add_table(floor, variables.group_mb))

    block = block_log("log_block_s", tables.block)
    # In the bubble, a ZB-H1 block is shorter by its weight-gradient GEMMs: where the space
    # offers ZB-H1 the bubble's blocks take that (smaller) table, a lower bound either way.
    bubble_block = (block_log("log_bubble_block_s", tables.block_zb)
                    if offers_zero_bubble(variables.space, variables.num_networks) else block)
    parts = {  # name -> (LogLinear of the part, literals that switch it on; None = never)
        "blocks": (LogLinear().add_table(logs.time_blocks, variables.pp.is_).plus(block), []),
        "output_layer": (_output_layer(tables, variables, several_kinds), []),
        "pp_send": (LogLinear().add_const(2.0).add_table(logs.il_values, variables.interleaving.is_)
                    .add_table(tables.p2p, variables.group_mb), pp_gt1),
    }
    terms = []
    for weight_name, weight, weight_active in (("n", logs.microbatches, []), ("bubble", logs.bubble, pp_gt1)):
        for part_name, (part, part_active) in parts.items():
            if weight_active is None or part_active is None:
                continue      # pp is 1 in every mapping: bubble and sends vanish
            active = weight_active + part_active
            if weight_name == "bubble" and part_name == "blocks":
                part = LogLinear().add_table(logs.time_blocks, variables.pp.is_).plus(bubble_block)
            if weight_name == "bubble" and part_name == "output_layer" and several_kinds:
                continue      # (a ZB-H1 bubble's pacing stage may hold no output layer)
            if weight_name == "bubble" and part_name == "output_layer":
                # uneven stages paced by a middle stage carry no output layer in a ZB-H1
                # bubble: count it in the bubble only where the layout is even
                active = active + even_layout
                if any(lit is None for lit in active):
                    continue
            terms.append(add_exp_term(cpsat, f"time_{weight_name}_{part_name}", weight(variables).plus(part), unit,
                                      ceiling, active or None))
    exp_terms = len(terms)
    terms.append(_linear_term(cpsat, variables, "time_dp_comm", [([], tables.dp_comm)], unit))
    stages = tuple(variables.flags["zero"])   # the sharding stages the space offers (codes)
    terms.append(_linear_term(cpsat, variables, "time_optimizer",
                              [([flag("zero", z)], tables.optimizer[z]) for z in stages],
                              unit))
    return TimeTerms(terms, exp_terms, unit)


def _output_layer(tables: Tables, variables: Variables, several_kinds: bool) -> LogLinear:
    """ln of the output layer's share of a microbatch's time on the pacing stage: all of it;
    with blocks of several kinds, whose stages sum their own blocks, 1/pp of it (the blocks'
    part is then at most L/pp mean blocks, and the slowest stage at least the mean stage:
    (L·mean + H)/pp)."""
    head = LogLinear().add_table(tables.head, variables.group_mb)
    if several_kinds:
        head = head.add_table({p: 1.0 / p for p in variables.pp.is_}, variables.pp.is_)
    return head


def add_hbm_terms(cpsat: cp_model.CpModel, variables: Variables, tables: Tables, logs: SplitLogs,
                  hbm_capacity_bytes: float) -> list:
    """A lower bound of a GPU's HBM use (MiB), as term variables: weights, optimizer state,
    embeddings, one block's workspace, and the stored activations in flight (a product
    term)."""
    flag, mib = variables.flag, MEMORY_UNIT_BYTES
    stages = tuple(variables.flags["zero"])
    comm_rs_ag = flag("tp_comm", TP_COMM_RS_AG)
    memory = [
        _linear_term(cpsat, variables, "hbm_weights",
                     [([flag("zero", z), flag("weight_offload", w)], tables.weights_hbm[(z, w)])
                      for z in stages for w in (0, 1)], mib),
        _linear_term(cpsat, variables, "hbm_optimizer",
                     [([flag("zero", z), flag("optimizer_offload", o)], tables.optimizer_hbm[(z, o)])
                      for z in stages for o in (0, 1)], mib),
        _linear_term(cpsat, variables, "hbm_embedding",
                     [([flag("zero", z)], tables.embedding[z]) for z in stages], mib),
    ]
    class_lits = {"no_sp": [comm_rs_ag.Not()], "sp": [comm_rs_ag, flag("seq_par_ag_redo", 0)],
                  "sp_redo": [comm_rs_ag, flag("seq_par_ag_redo", 1)]}
    rcs = (RECOMPUTE_FULL, RECOMPUTE_ATTN_ONLY, RECOMPUTE_NONE)
    top = max(_units(x, mib) for rc in rcs for cls in ACT_CLASSES for x in tables.workspace[(rc, cls)].values())
    workspace = cpsat.NewIntVar(0, top + 1, "hbm_workspace")
    for rc in rcs:
        for cls in ACT_CLASSES:
            table = tables.workspace[(rc, cls)]
            cpsat.Add(workspace >= sum(_units(table[k], mib) * lit for k, lit in variables.group_mb.items())
                  ).WithName(f"hbm_workspace >= its table at recompute code {rc}, {cls}").OnlyEnforceIf(
                [flag("recompute", rc), *class_lits[cls]])
    memory.append(workspace)
    # blocks in flight >= blocks/pp · min(pp, microbatches): w = min(ln n, ln pp) exactly
    n_log, p_log = logs.microbatches(variables), LogLinear().add_table(logs.pp_values, variables.pp.is_)
    w_lo, w_hi = min(n_log.lo, p_log.lo), max(n_log.hi, p_log.hi)
    w = cpsat.NewIntVar(w_lo, w_hi, "log_min_pp_microbatches")
    pick_n = cpsat.NewBoolVar("inflight_limited_by_microbatches")
    cpsat.Add(w <= n_log.expr()).WithName("log_min_pp_microbatches <= log microbatches")
    cpsat.Add(w <= p_log.expr()).WithName("log_min_pp_microbatches <= log pp")
    cpsat.Add(w >= n_log.expr()).WithName("log_min_pp_microbatches >= log microbatches").OnlyEnforceIf(pick_n)
    cpsat.Add(w >= p_log.expr()).WithName("log_min_pp_microbatches >= log pp").OnlyEnforceIf(pick_n.Not())
    alternatives = []
    for rc in rcs:
        for cls in ACT_CLASSES:
            stored = LogLinear().add_table(tables.stored[(rc, cls)], variables.group_mb)
            in_hbm = LogLinear().add_table(logs.memory_blocks, variables.pp.is_).add_var(w, w_lo, w_hi)
            lits = [flag("recompute", rc), *class_lits[cls]]
            alternatives.append((lits + [flag("activations_offload", 0)], stored.plus(in_hbm)))
            # offloaded: HBM keeps at least one block's worth of the stage's activations
            alternatives.append((lits + [flag("activations_offload", 1)], stored))
    activations = add_log_var(cpsat, "log_hbm_activations", alternatives)
    memory.append(add_exp_term(cpsat, "hbm_activations", activations, mib,
                               MEMORY_CEILING_CAPACITIES * hbm_capacity_bytes))
    return memory


def add_offload_bound(cpsat: cp_model.CpModel, variables: Variables, tables: Tables,
                      offload_capacity_bytes: float) -> None:
    """Offload capacity: offloaded weights with their gradients, and offloaded optimizer
    state, must fit (offloaded activations only add to this, so leaving them out relaxes)."""
    flag, mib = variables.flag, MEMORY_UNIT_BYTES
    stages = tuple(variables.flags["zero"])
    offloaded = [_linear_term(cpsat, variables, "offload_weights", [([flag("weight_offload", 1), flag("zero", z)],
                                                         tables.weights_and_grads[z]) for z in stages], mib),
                 _linear_term(cpsat, variables, "offload_optimizer", [([flag("optimizer_offload", 1), flag("zero", z)],
                                                           tables.optimizer_state[z]) for z in stages], mib)]
    cpsat.Add(sum(offloaded) <= math.floor(offload_capacity_bytes / mib)).WithName("offload capacity")


def add_bounds(cpsat: cp_model.CpModel, variables: Variables, c: Context, num_gpus: int, local_batch: dict,
               space: Space, hbm_capacity_bytes: float | None, enforce_hbm: bool = True,
               skeletons=None, tables: Tables | None = None) -> Bounds:
    """Add the time objective terms and, unless `hbm_capacity_bytes` is None, the HBM lower
    bound (constrained to the capacity when `enforce_hbm`) and the offload capacity.
    `local_batch[(tp, cp, ep, etp, pp)]` is batch/dp of that split; `tables`: the exact model's
    tables over these variables' keys when already built (Tables of the same arguments)."""
    tables = tables or Tables(c, variables, num_gpus, space, len(c.net.size))
    # Blocks per stage, bounded below for uneven layouts (costmodel.space.layout): in time, the
    # last stage's (its blocks and the output layer never outlast the slowest stage); in
    # memory, what the first stage keeps alive per microbatch in flight (see stage_floors).
    time_blocks, memory_blocks = stage_floors(c.model.blocks, variables.pp.is_, variables)
    even_layout = even_layout_literals(cpsat, variables, c.model.blocks)
    logs = SplitLogs(local={k: float(local_batch[k]) for k in variables.split},
                     pp_values={p: float(p) for p in variables.pp.is_},
                     pp_minus_1={p: float(p - 1) for p in variables.pp.is_},
                     mb_values={mb: float(mb) for mb in variables.microbatch.is_},
                     il_values={il: float(il) for il in variables.interleaving.is_},
                     time_blocks=time_blocks, memory_blocks=memory_blocks)
    time = add_time_terms(cpsat, variables, tables, logs, even_layout)
    memory = []
    if hbm_capacity_bytes is not None:
        memory = add_hbm_terms(cpsat, variables, tables, logs, hbm_capacity_bytes)
        if enforce_hbm:
            cpsat.Add(sum(memory) <= math.floor(hbm_capacity_bytes / MEMORY_UNIT_BYTES) + 1).WithName(
                "HBM capacity")
        add_offload_bound(cpsat, variables, tables, c.memory.offload_capacity_bytes)
    block_floors = {}
    if skeletons is not None and hbm_capacity_bytes is not None and enforce_hbm:
        block_floors = block_lower_bounds(tables, c, variables.space, skeletons, local_batch,
                                          c.memory.offload_capacity_bytes > 0, variables.num_networks, hbm_capacity_bytes)
    return Bounds(time.terms, memory, Quantization(time.unit_s, MEMORY_UNIT_BYTES, time.exp_terms, 1), block_floors)
