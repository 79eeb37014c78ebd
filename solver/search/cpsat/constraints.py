"""The named constraints of the mapping space, each able to add itself to the CP-SAT model
and to measure its own violation on a decoded mapping (0 when satisfied).

Together with the variable domains they admit exactly the mappings of the space
declaration (solver.space.declaration), so CP-SAT's solution count equals the closed-form count; the
memory relaxation (HbmCapacity) lives with the objective in solver.search.cpsat.surrogate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.dimensions import (
    BY_NAME,
    CHAIN,
    DEGREES,
    GROUP_SPAN,
    NETWORK_GROUPS,
    SPLIT_DEGREES,
    skeleton_facts,
    subgroup_limit,
)
from costmodel.encoding import MappingArrays
from costmodel.evaluate import Evaluation
from costmodel.mapping import Mapping
from costmodel.model import Model
from costmodel.system import System
from solver.space.declaration import SKELETON_FACTS, Space, stage_interleavings

if TYPE_CHECKING:          # constraints add themselves to a CP-SAT model; Problem needs no OR-Tools
    from ortools.sat.python import cp_model

    from solver.search.cpsat.variables import Variables


@dataclass(frozen=True)
class Problem:
    """What the constraints read: the model, the system, the GPU count, the batch cap, the space."""

    model: Model
    system: System
    num_gpus: int
    max_batch: int
    space: Space


class Constraint:
    name: str = "constraint"

    def describe(self, p: Problem) -> str:
        raise NotImplementedError

    def add(self, m: cp_model.CpModel, v: Variables, p: Problem) -> None:
        raise NotImplementedError

    def violation(self, mapping: Mapping, evaluation: Evaluation, p: Problem) -> float:
        raise NotImplementedError


class ParallelSplit(Constraint):
    name = "parallel split"

    def describe(self, p):
        return f"{'·'.join(CHAIN)} = {p.num_gpus} GPUs"

    def add(self, m, v, p):
        m.AddMultiplicationEquality(p.num_gpus, [v.degrees[name].var for name in CHAIN])

    def violation(self, mapping, evaluation, p):
        return abs(math.prod(mapping.value(name) for name in CHAIN) - p.num_gpus)


class DegreeRules(Constraint):
    """Each degree of the split obeys its declared `fits` rule (costmodel.dimensions: tp
    divides the heads and widths, 2·cp divides seq_size, ep divides num_experts, etp
    expert_feedforward, ep·etp divides tp·cp·dp by MoE parallel folding, pp lays the blocks
    out) and its space limit (Degree.limit: tp_max, cp_max)."""

    name = "degree rules"

    def describe(self, p):
        return "; ".join(f"{name}: {BY_NAME[name].rule}".replace("tp_max", str(p.space.tp_max))
                         .replace("cp_max", str(p.space.cp_max)) for name in SPLIT_DEGREES)

    def add(self, m, v, p):
        # On the split literals (the only splits the variables allow are some skeleton's:
        # this states the rules in the model, whatever built the domains)
        for split, lit in v.split.items():
            if self._broken(dict(zip(SPLIT_DEGREES, split)), p):
                m.AddBoolOr([lit.Not()])

    def violation(self, mapping, evaluation, p):
        mapping = mapping.with_model_defaults(p.model.num_experts > 0)
        return float(self._broken({d.name: mapping.value(d.name) for d in DEGREES}, p))

    @staticmethod
    def _broken(degrees: dict[str, int], p: Problem) -> int:
        """How many of the split's degrees break their rule or limit (dp from the GPU count)."""
        if "dp" not in degrees:
            degrees = {**degrees, "dp": p.num_gpus // math.prod(degrees[name] for name in CHAIN if name != "dp")}
        broken = 0
        for name in SPLIT_DEGREES:
            fits, limit = BY_NAME[name].fits, p.space.limit(name)
            broken += bool((fits and fits(p.model, p.system, degrees)) or (limit is not None and degrees[name] > limit))
        return broken


class PipelineDivisibility(Constraint):
    name = "pipeline divisibility"

    def describe(self, p):
        uneven = (", or pp > 2 divides num_blocks + 2 (first and last stages one block lighter), or else "
                  "a short last chunk (costmodel.terms.pipeline)"
                  if p.space.uneven_stages else "")
        return (f"pp divides num_blocks ({p.model.num_blocks}){uneven}; interleaving divides a stage's share; "
                f"interleaving is 1 without pp")

    def add(self, m, v, p):
        # per pp value, the interleavings its layout allows (none: that pp is not valid)
        for pp, pp_lit in v.pp.is_.items():
            allowed = set(stage_interleavings(p.model, pp, p.space))
            for il, il_lit in v.interleaving.is_.items():
                if il not in allowed:
                    m.AddBoolOr([pp_lit.Not(), il_lit.Not()])

    def violation(self, mapping, evaluation, p):
        return float(mapping.pipeline_interleaving not in stage_interleavings(p.model, mapping.pp, p.space))


class BatchCap(Constraint):
    name = "batch cap"

    def describe(self, p):
        fixed = dict(p.space.pins).get("batch")
        if fixed is not None and len(fixed) == 1:
            return f"given batch: global batch fixed at {fixed[0]} (dp divides it)"
        quirk = ", or dp itself when dp > cap" if p.space.batch_is_dp_above_cap else "; dp <= cap"
        return f"global batch = largest multiple of dp <= {p.max_batch}{quirk}"

    def add(self, m, v, p):
        floor_q = m.NewIntVar(0, p.max_batch, "cap_over_dp")
        m.AddDivisionEquality(floor_q, p.max_batch, v.dp.var)
        if p.space.batch_is_dp_above_cap:
            m.AddMaxEquality(v.local_batch, [floor_q, 1])
        else:
            m.Add(v.local_batch == floor_q)
        m.AddMultiplicationEquality(v.batch, [v.dp.var, v.local_batch])

    def violation(self, mapping, evaluation, p):
        expected = p.space.batch_for(mapping.dp, p.max_batch)
        return abs(mapping.batch_size - expected) if expected is not None else mapping.batch_size


class MicrobatchDivisibility(Constraint):
    name = "microbatch divisibility"

    def describe(self, p):
        return f"microbatch divides batch/dp, and microbatch·seq_size ({p.model.seq_size}) is divisible by tp·cp"

    def add(self, m, v, p):
        m.AddMultiplicationEquality(v.local_batch, [v.microbatch.var, v.microbatches])
        tokens_per_tp = m.NewIntVar(1, p.model.seq_size * p.max_batch, "microbatch_tokens_per_tp")
        m.AddMultiplicationEquality(p.model.seq_size * v.microbatch.var, [v.tp.var, v.cp.var, tokens_per_tp])

    def violation(self, mapping, evaluation, p):
        return (mapping.local_batch % mapping.microbatch_size
                + (mapping.microbatch_size * p.model.seq_size) % (mapping.tp * mapping.cp))


class Pins(Constraint):
    """Dimensions the user fixed (Space.pins): a flag takes one of the codes given. Pinned
    skeleton dimensions need nothing here: the variables' domains come from skeletons that
    already obey the pins."""

    name = "fixed dimensions"

    def describe(self, p):
        return "; ".join(f"{name} in {list(values)}" for name, values in p.space.pins) or "none"

    def add(self, m, v, p):
        for name, allowed in p.space.pins:
            if name in v.flags:
                m.AddExactlyOne([v.flags[name][code] for code in allowed if code in v.flags[name]] or
                                [m.NewConstant(0)])

    def violation(self, mapping, evaluation, p):
        values = MappingArrays.from_mappings([mapping])
        return float(sum(int(values.columns[name][0]) not in allowed for name, allowed in p.space.pins))


def _fact_literal(m: cp_model.CpModel, v: Variables, p: Problem, subject: str):
    """A literal true when the skeleton fact `subject > 1` holds (or offload exists)."""
    if subject == "offload":
        return m.NewConstant(int(p.system.offload is not None))
    if subject == "dp_cp":                       # dp·cp > 1: dp > 1 or cp > 1
        either = m.NewBoolVar("dp_cp_gt1")
        parts = [_fact_literal(m, v, p, "dp"), _fact_literal(m, v, p, "cp")]
        m.AddBoolOr(parts).OnlyEnforceIf(either)
        for part in parts:
            m.AddImplication(part, either)
        return either
    dim = getattr(v, subject)                   # a degree's one-hot (costmodel.dimensions.DEGREES)
    return dim.is_[1].Not() if 1 in dim.is_ else m.NewConstant(1)


class FlagRules(Constraint):
    """A flag is free when all its conditions hold, else pinned to its first code."""

    name = "flag rules"

    def describe(self, p):
        return "; ".join(f"{d.name} free {d.rule_text()}" for d in p.space.flags)

    def add(self, m, v, p):
        for dim in p.space.flags:
            if dim.name not in v.flags:
                continue
            if dim.dim.kind == "subgroup":       # a sub-group size needs a split whose dp·cp it divides
                for code, lit in v.flags[dim.name].items():
                    if code:
                        m.AddBoolOr([split_lit for split, split_lit in v.split.items()
                                     if code <= subgroup_limit(_dp_cp(split, p.num_gpus))]).OnlyEnforceIf(lit)
            conditions = []
            for cond in dim.free_when:
                if cond.subject in SKELETON_FACTS:
                    conditions.append(_fact_literal(m, v, p, cond.subject))   # reads 'subject > 1'
                else:
                    lit = v.flag(cond.subject, cond.value)
                    conditions.append(lit if cond.op == "==" else lit.Not())
            if not conditions:
                continue
            free = m.NewBoolVar(f"{dim.name}_free")
            for c in conditions:
                m.AddImplication(free, c)
            m.AddBoolOr([c.Not() for c in conditions] + [free])
            first = dim.domain(v.num_networks)[0]
            m.AddImplication(free.Not(), v.flag(dim.name, first))

    def violation(self, mapping, evaluation, p):
        """How many flags take a value their rule forbids (pinned but moved, or outside the domain)."""
        codes = MappingArrays.from_mappings([mapping])
        values = skeleton_facts({d.name: mapping.value(d.name) for d in DEGREES}, p.system.offload is not None)
        wrong = 0
        for dim in p.space.flags:
            value = int(getattr(codes, dim.name)[0])
            domain = dim.domain(len(p.system.networks), values)
            allowed = domain if dim.is_free(values) else domain[:1]
            wrong += value not in allowed
            values[dim.name] = value
        return float(wrong)


def _dp_cp(split: tuple[int, ...], num_gpus: int) -> int:
    """dp·cp of a split (SPLIT_DEGREES) on N GPUs: N over the chain's other degrees (tp·pp)."""
    named = dict(zip(SPLIT_DEGREES, split))
    return num_gpus // math.prod(named[name] for name in CHAIN if name not in ("dp", "cp"))


def group_span_expressions(v: Variables, num_gpus: int) -> tuple:
    """The GPUs each group of costmodel.dimensions.NETWORK_GROUPS spans (GROUP_SPAN), as
    CP-SAT expressions over the smallest literals that know its degrees: a degree's one-hot,
    or a combination (Variables.combinations: the (tp, cp) and (ep, etp) pairs, the group, the
    split); a group spanning dp spans every GPU (tp·cp·pp·dp = N)."""
    keyed = [*(((d.name,), {(value,): lit for value, lit in v.degrees[d.name].is_.items()}) for d in DEGREES),
             *sorted(v.combinations.items(), key=lambda item: len(item[0]))]
    out = []
    for degree, _ in NETWORK_GROUPS:
        span = GROUP_SPAN[degree]
        if "dp" in span:
            out.append(num_gpus)
            continue
        names, literals = next((names, lits) for names, lits in keyed if set(span) <= set(names))
        at = [names.index(factor) for factor in span]
        out.append(sum(math.prod(key[i] for i in at) * lit for key, lit in literals.items()))
    return tuple(out)


class NetworkFit(Constraint):
    """The network carrying a dimension spans at least its group (tp, tp·cp, etp·ep, etp,
    tp·cp·pp, N GPUs: GROUP_SPAN); a must-be-filled network is spanned whole by its widest group."""

    name = "network size"

    def describe(self, p):
        sizes = ", ".join(f"{n.name} {n.size}" for n in p.system.networks)
        spans = ", ".join("·".join(GROUP_SPAN[name]) if "dp" not in GROUP_SPAN[name] else f"all {p.num_gpus} GPUs"
                          for name, _ in NETWORK_GROUPS)
        return (f"{spans} fit the networks carrying {', '.join(name for name, _ in NETWORK_GROUPS)} ({sizes})")

    def add(self, m, v, p):
        span_of = group_span_expressions(v, p.num_gpus)
        spans = {net: (degree, span) for (degree, net), span in zip(NETWORK_GROUPS, span_of, strict=True)}
        if NETWORK_GROUPS[0][1] not in v.flags:
            # Network choices not modelled: relax to "some network is wide enough" (never
            # excludes a mapping whose groups fit; must-be-filled is left to the exact model).
            widest = max(n.size for n in p.system.networks)
            for fact, span in spans.values():
                _add_at_most(m, span, widest, _fact_literal(m, v, p, fact))
            return
        for k, network in enumerate(p.system.networks):
            carried, widest = [], []
            for flag, (fact, span) in spans.items():
                # on = this dimension is > 1 and travels on network k
                on = m.NewBoolVar(f"{fact}_on_net{k}")
                m.AddBoolAnd([v.flag(flag, k), _fact_literal(m, v, p, fact)]).OnlyEnforceIf(on)
                m.AddBoolOr([v.flag(flag, k).Not(), _fact_literal(m, v, p, fact).Not(), on])
                _add_at_most(m, span, network.size, on)
                carried.append(on)
                if network.must_be_filled:
                    fills = m.NewBoolVar(f"{fact}_fills_net{k}")
                    m.AddImplication(fills, on)
                    _add_at_least(m, span, network.size, fills)
                    widest.append(fills)
            # must be filled: if the network carries anything, some group spans it whole
            for on in carried if network.must_be_filled else ():
                m.AddBoolOr([on.Not(), *widest])

    def violation(self, mapping, evaluation, p):
        return float(sum(1 for r in evaluation.reasons if r.startswith("network")))


def _add_at_most(m: cp_model.CpModel, expr, bound: int, enforce) -> None:
    if isinstance(expr, int):
        if expr > bound:
            m.AddBoolOr([enforce.Not()])
    else:
        m.Add(expr <= bound).OnlyEnforceIf(enforce)


def _add_at_least(m: cp_model.CpModel, expr, bound: int, enforce) -> None:
    if isinstance(expr, int):
        if expr < bound:
            m.AddBoolOr([enforce.Not()])
    else:
        m.Add(expr >= bound).OnlyEnforceIf(enforce)


STRUCTURE: tuple[Constraint, ...] = (ParallelSplit(), DegreeRules(), PipelineDivisibility(), BatchCap(),
                                     MicrobatchDivisibility(), FlagRules(), Pins(), NetworkFit())
