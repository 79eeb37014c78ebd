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

from costmodel.space.dimensions import (
    BY_NAME,
    CHAIN,
    DEGREES,
    GROUP_SPAN,
    NETWORK_GROUPS,
    SPLIT_DEGREES,
    data_parallel,
    skeleton_facts,
    subgroup_limit,
)
from costmodel.encoding import MappingArrays
from costmodel.evaluate import Evaluation
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
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

    def describe(self, problem: Problem) -> str:
        raise NotImplementedError

    def add(self, cpsat: cp_model.CpModel, variables: Variables, problem: Problem) -> None:
        raise NotImplementedError

    def violation(self, mapping: Mapping, evaluation: Evaluation, problem: Problem) -> float:
        raise NotImplementedError


class ParallelSplit(Constraint):
    name = "parallel split"

    def describe(self, problem):
        return f"{'·'.join(CHAIN)} = {problem.num_gpus} GPUs"

    def add(self, cpsat, variables, problem):
        cpsat.AddMultiplicationEquality(problem.num_gpus, [variables.degrees[name].var for name in CHAIN]).WithName(
            f"parallel split: {'·'.join(CHAIN)} = {problem.num_gpus}")

    def violation(self, mapping, evaluation, problem):
        return abs(math.prod(mapping.value(name) for name in CHAIN) - problem.num_gpus)


class DegreeRules(Constraint):
    """Each degree of the split obeys its declared `fits` rule (costmodel.space.dimensions: tp
    divides the heads and widths, 2·cp divides seq_size, ep divides num_experts, etp
    expert_feedforward, ep·etp divides tp·cp·dp by MoE parallel folding, pp lays the blocks
    out) and its space limit (Degree.limit: tp_max, cp_max)."""

    name = "degree rules"

    def describe(self, problem):
        return "; ".join(f"{name}: {BY_NAME[name].rule}".replace("tp_max", str(problem.space.tp_max))
                         .replace("cp_max", str(problem.space.cp_max)) for name in SPLIT_DEGREES)

    def add(self, cpsat, variables, problem):
        # On the split literals (the only splits the variables allow are some skeleton's:
        # this states the rules in the model, whatever built the domains)
        for split, lit in variables.split.items():
            if self._broken(dict(zip(SPLIT_DEGREES, split)), problem):
                cpsat.AddBoolOr([lit.Not()]).WithName(f"degree rules: not split {split}")

    def violation(self, mapping, evaluation, problem):
        mapping = mapping.with_model_defaults(problem.model.num_experts > 0)
        return float(self._broken({d.name: mapping.value(d.name) for d in DEGREES}, problem))

    @staticmethod
    def _broken(degrees: dict[str, int], problem: Problem) -> int:
        """How many of the split's degrees break their rule or limit (dp from the GPU count)."""
        if "dp" not in degrees:
            degrees = {**degrees, "dp": data_parallel(problem.num_gpus, degrees)}
        broken = 0
        for name in SPLIT_DEGREES:
            fits, limit = BY_NAME[name].fits, problem.space.limit(name)
            broken += bool((fits and fits(problem.model, problem.system, degrees))
                           or (limit is not None and degrees[name] > limit))
        return broken


class PipelineDivisibility(Constraint):
    name = "pipeline divisibility"

    def describe(self, problem):
        uneven = (", or pp > 2 divides num_blocks + 2 (first and last stages one block lighter), or else "
                  "a short last chunk (costmodel.space.layout)"
                  if problem.space.uneven_stages else "")
        return (f"pp divides num_blocks ({problem.model.num_blocks}){uneven}; interleaving divides a stage's share; "
                f"interleaving is 1 without pp")

    def add(self, cpsat, variables, problem):
        # per pp value, the interleavings its layout allows (none: that pp is not valid)
        for pp, pp_lit in variables.pp.is_.items():
            allowed = set(stage_interleavings(problem.model, pp, problem.space))
            for il, il_lit in variables.interleaving.is_.items():
                if il not in allowed:
                    cpsat.AddBoolOr([pp_lit.Not(), il_lit.Not()]).WithName(
                        f"pipeline divisibility: not pp = {pp} with interleaving = {il}")

    def violation(self, mapping, evaluation, problem):
        return float(mapping.pipeline_interleaving not in stage_interleavings(problem.model, mapping.pp, problem.space))


class BatchCap(Constraint):
    name = "batch cap"

    def describe(self, problem):
        fixed = dict(problem.space.pins).get("batch")
        if fixed is not None and len(fixed) == 1:
            return f"given batch: global batch fixed at {fixed[0]} (dp divides it)"
        quirk = ", or dp itself when dp > cap" if problem.space.batch_is_dp_above_cap else "; dp <= cap"
        return f"global batch = largest multiple of dp <= {problem.max_batch}{quirk}"

    def add(self, cpsat, variables, problem):
        floor_q = cpsat.NewIntVar(0, problem.max_batch, "cap_over_dp")
        cpsat.AddDivisionEquality(floor_q, problem.max_batch, variables.dp.var).WithName(
            "batch cap: cap_over_dp = cap / dp")
        if problem.space.batch_is_dp_above_cap:
            cpsat.AddMaxEquality(variables.local_batch, [floor_q, 1]).WithName(
                "batch cap: local_batch = max(cap_over_dp, 1)")
        else:
            cpsat.Add(variables.local_batch == floor_q).WithName("batch cap: local_batch = cap_over_dp")
        cpsat.AddMultiplicationEquality(variables.batch, [variables.dp.var, variables.local_batch]).WithName(
            "batch cap: batch = dp · local_batch")

    def violation(self, mapping, evaluation, problem):
        expected = problem.space.batch_for(mapping.dp, problem.max_batch)
        return abs(mapping.batch_size - expected) if expected is not None else mapping.batch_size


class MicrobatchDivisibility(Constraint):
    name = "microbatch divisibility"

    def describe(self, problem):
        return (f"microbatch divides batch/dp, and microbatch·seq_size ({problem.model.seq_size}) is divisible "
                f"by tp·cp")

    def add(self, cpsat, variables, problem):
        cpsat.AddMultiplicationEquality(variables.local_batch, [variables.microbatch.var, variables.microbatches]
                                        ).WithName("microbatch divisibility: local_batch = microbatch · microbatches")
        tokens_per_tp = cpsat.NewIntVar(1, problem.model.seq_size * problem.max_batch, "microbatch_tokens_per_tp")
        cpsat.AddMultiplicationEquality(problem.model.seq_size * variables.microbatch.var,
                                        [variables.tp.var, variables.cp.var, tokens_per_tp]).WithName(
            "microbatch divisibility: microbatch · seq_size = tp · cp · microbatch_tokens_per_tp")

    def violation(self, mapping, evaluation, problem):
        return (mapping.local_batch % mapping.microbatch_size
                + (mapping.microbatch_size * problem.model.seq_size) % (mapping.tp * mapping.cp))


class Pins(Constraint):
    """Dimensions the user fixed (Space.pins): a flag takes one of the codes given. Pinned
    skeleton dimensions need nothing here: the variables' domains come from skeletons that
    already obey the pins."""

    name = "fixed dimensions"

    def describe(self, problem):
        return "; ".join(f"{name} in {list(values)}" for name, values in problem.space.pins) or "none"

    def add(self, cpsat, variables, problem):
        for name, allowed in problem.space.pins:
            if name in variables.flags:
                cpsat.AddExactlyOne([variables.flags[name][code] for code in allowed if code in variables.flags[name]]
                                    or [cpsat.NewConstant(0)]).WithName(f"fixed dimensions: {name} in {list(allowed)}")

    def violation(self, mapping, evaluation, problem):
        values = MappingArrays.from_mappings([mapping])
        return float(sum(int(values.columns[name][0]) not in allowed for name, allowed in problem.space.pins))


def _fact_literal(cpsat: cp_model.CpModel, variables: Variables, problem: Problem, subject: str):
    """A literal true when the skeleton fact `subject > 1` holds (or offload exists)."""
    if subject == "offload":
        return cpsat.NewConstant(int(problem.system.offload is not None))
    if subject == "dp_cp":                       # dp·cp > 1: dp > 1 or cp > 1
        either = cpsat.NewBoolVar("dp_cp_gt1")
        parts = [_fact_literal(cpsat, variables, problem, "dp"), _fact_literal(cpsat, variables, problem, "cp")]
        cpsat.AddBoolOr(parts).WithName("dp_cp_gt1 -> dp > 1 or cp > 1").OnlyEnforceIf(either)
        for part, degree in zip(parts, ("dp", "cp")):
            cpsat.AddImplication(part, either).WithName(f"{degree} > 1 -> dp_cp_gt1")
        return either
    dim = getattr(variables, subject)                   # a degree's one-hot (costmodel.space.dimensions.DEGREES)
    return dim.is_[1].Not() if 1 in dim.is_ else cpsat.NewConstant(1)


class FlagRules(Constraint):
    """A flag is free when all its conditions hold, else pinned to its first code."""

    name = "flag rules"

    def describe(self, problem):
        return "; ".join(f"{d.name} free {d.rule_text()}" for d in problem.space.flags)

    def add(self, cpsat, variables, problem):
        for dim in problem.space.flags:
            if dim.name not in variables.flags:
                continue
            if dim.dim.kind == "subgroup":       # a sub-group size needs a split whose dp·cp it divides
                for code, lit in variables.flags[dim.name].items():
                    if code:
                        cpsat.AddBoolOr([split_lit for split, split_lit in variables.split.items()
                                         if code <= subgroup_limit(_dp_cp(split, problem.num_gpus))]).WithName(
                            f"flag rules: {dim.name} = {code} needs a split whose dp·cp it divides").OnlyEnforceIf(lit)
            conditions = []
            for cond in dim.free_when:
                if cond.subject in SKELETON_FACTS:
                    conditions.append(_fact_literal(cpsat, variables, problem, cond.subject))   # reads 'subject > 1'
                else:
                    lit = variables.flag(cond.subject, cond.value)
                    conditions.append(lit if cond.op == "==" else lit.Not())
            if not conditions:
                continue
            free = cpsat.NewBoolVar(f"{dim.name}_free")
            for cond, condition in zip(dim.free_when, conditions, strict=True):
                cpsat.AddImplication(free, condition).WithName(f"flag rules: {dim.name}_free -> {cond.describe()}")
            cpsat.AddBoolOr([c.Not() for c in conditions] + [free]).WithName(
                f"flag rules: {dim.name}_free when {dim.rule_text()[5:]}")
            first = dim.domain(variables.num_networks)[0]
            cpsat.AddImplication(free.Not(), variables.flag(dim.name, first)).WithName(
                f"flag rules: {dim.name} = {dim.dim.label_of(first)} when not free")

    def violation(self, mapping, evaluation, problem):
        """How many flags take a value their rule forbids (pinned but moved, or outside the domain)."""
        codes = MappingArrays.from_mappings([mapping])
        values = skeleton_facts({d.name: mapping.value(d.name) for d in DEGREES}, problem.system.offload is not None)
        wrong = 0
        for dim in problem.space.flags:
            value = int(getattr(codes, dim.name)[0])
            domain = dim.domain(len(problem.system.networks), values)
            allowed = domain if dim.is_free(values) else domain[:1]
            wrong += value not in allowed
            values[dim.name] = value
        return float(wrong)


def _dp_cp(split: tuple[int, ...], num_gpus: int) -> int:
    """dp·cp of a split (SPLIT_DEGREES) on N GPUs: N over the chain's other degrees (tp·pp)."""
    named = dict(zip(SPLIT_DEGREES, split))
    return num_gpus // math.prod(named[name] for name in CHAIN if name not in ("dp", "cp"))


def group_span_expressions(variables: Variables, num_gpus: int) -> tuple:
    """The GPUs each group of costmodel.space.dimensions.NETWORK_GROUPS spans (GROUP_SPAN), as
    CP-SAT expressions over the smallest literals that know its degrees: a degree's one-hot,
    or a combination (Variables.combinations: the (tp, cp) and (ep, etp) pairs, the group, the
    split); a group spanning dp spans every GPU (tp·cp·pp·dp = N)."""
    keyed = [*(((d.name,), {(value,): lit for value, lit in variables.degrees[d.name].is_.items()}) for d in DEGREES),
             *sorted(variables.combinations.items(), key=lambda item: len(item[0]))]
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

    def describe(self, problem):
        sizes = ", ".join(f"{n.name} {n.size}" for n in problem.system.networks)
        spans = ", ".join("·".join(GROUP_SPAN[name]) if "dp" not in GROUP_SPAN[name]
                          else f"all {problem.num_gpus} GPUs"
                          for name, _ in NETWORK_GROUPS)
        return (f"{spans} fit the networks carrying {', '.join(name for name, _ in NETWORK_GROUPS)} ({sizes})")

    def add(self, cpsat, variables, problem):
        span_of = group_span_expressions(variables, problem.num_gpus)
        spans = {net: (degree, span) for (degree, net), span in zip(NETWORK_GROUPS, span_of, strict=True)}
        if NETWORK_GROUPS[0][1] not in variables.flags:
            # Network choices not modelled: relax to "some network is wide enough" (never
            # excludes a mapping whose groups fit; must-be-filled is left to the exact model).
            widest = max(n.size for n in problem.system.networks)
            for fact, span in spans.values():
                _add_at_most(cpsat, span, widest, _fact_literal(cpsat, variables, problem, fact),
                             f"network size: {fact}'s group fits the widest network")
            return
        for k, network in enumerate(problem.system.networks):
            carried, widest = [], []
            for flag, (fact, span) in spans.items():
                # on = this dimension is > 1 and travels on network k
                on = cpsat.NewBoolVar(f"{fact}_on_net{k}")
                cpsat.AddBoolAnd([variables.flag(flag, k), _fact_literal(cpsat, variables, problem, fact)]
                                 ).WithName(f"network size: {on.Name()} -> {flag} = {k} and {fact} > 1"
                                            ).OnlyEnforceIf(on)
                cpsat.AddBoolOr([variables.flag(flag, k).Not(), _fact_literal(cpsat, variables, problem, fact).Not(),
                                 on]).WithName(f"network size: {flag} = {k} and {fact} > 1 -> {on.Name()}")
                _add_at_most(cpsat, span, network.size, on, f"network size: {fact}'s group fits net{k}")
                carried.append(on)
                if network.must_be_filled:
                    fills = cpsat.NewBoolVar(f"{fact}_fills_net{k}")
                    cpsat.AddImplication(fills, on).WithName(f"network size: {fills.Name()} -> {on.Name()}")
                    _add_at_least(cpsat, span, network.size, fills, f"network size: {fact}'s group fills net{k}")
                    widest.append(fills)
            # must be filled: if the network carries anything, some group spans it whole
            for on in carried if network.must_be_filled else ():
                cpsat.AddBoolOr([on.Not(), *widest]).WithName(f"network size: net{k} carries {on.Name()} only filled")

    def violation(self, mapping, evaluation, problem):
        return float(sum(1 for r in evaluation.reasons if r.startswith("network")))


def _add_at_most(cpsat: cp_model.CpModel, expr, bound: int, enforce, name: str) -> None:
    """expr <= bound where `enforce`, named `name` (a constant expr: forbid `enforce` if it is over)."""
    if isinstance(expr, int):
        if expr > bound:
            cpsat.AddBoolOr([enforce.Not()]).WithName(name)
    else:
        cpsat.Add(expr <= bound).WithName(name).OnlyEnforceIf(enforce)


def _add_at_least(cpsat: cp_model.CpModel, expr, bound: int, enforce, name: str) -> None:
    """expr >= bound where `enforce`, named `name` (a constant expr: forbid `enforce` if it is under)."""
    if isinstance(expr, int):
        if expr < bound:
            cpsat.AddBoolOr([enforce.Not()]).WithName(name)
    else:
        cpsat.Add(expr >= bound).WithName(name).OnlyEnforceIf(enforce)


STRUCTURE: tuple[Constraint, ...] = (ParallelSplit(), DegreeRules(), PipelineDivisibility(), BatchCap(),
                                     MicrobatchDivisibility(), FlagRules(), Pins(), NetworkFit())
