"""The CP-SAT variables of a mapping, built from the space declaration, and their decoding.

Skeleton dimensions are integer variables (each degree of costmodel.space.dimensions.DEGREES, batch,
interleaving, microbatch) with one Boolean per value (`tp[8]`, `pp[16]`, ...), linked both
ways; flags get one Boolean per code (`recompute[full]`, `tp_net[1]`). Combinations of
skeleton values that the objective and memory tables need — the group (GROUP_DEGREES, built
from its halves: the (tp, cp) and (ep, etp) pairs), the split (the group and pp) and the
group_mb (the group and the microbatch) — get a Boolean each that is the AND of its parts'
Booleans, for the combinations some skeleton has. The domains are the values any valid
mapping can take (read off the space's skeletons); the constraints state which are valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from costmodel.space.dimensions import DEGREES, GROUP_DEGREES, SPLIT_DEGREES, BlockKey, subgroup_limit

from solver.space.declaration import Skeleton, Space, divisors


@dataclass
class OneHot:
    """An integer dimension with one Boolean per value: var == v  <=>  is_[v]."""

    var: cp_model.IntVar
    is_: dict[int, cp_model.IntVar]

    def value_of(self, solver: cp_model.CpSolver) -> int:
        return next(v for v, lit in self.is_.items() if solver.BooleanValue(lit))


def one_hot(model: cp_model.CpModel, name: str, values) -> OneHot:
    values = sorted(set(int(v) for v in values))
    var = model.NewIntVarFromDomain(cp_model.Domain.FromValues(values), name)
    lits = {v: model.NewBoolVar(f"{name}[{v}]") for v in values}
    model.AddExactlyOne(lits.values()).WithName(f"{name}: exactly one value")
    # var = Σ v·[var == v]: the integer and its Booleans agree.
    model.Add(var == sum(v * lit for v, lit in lits.items())).WithName(f"{name}: the integer of its one-hot")
    return OneHot(var, lits)


def and_pairs(model: cp_model.CpModel, name: str, first: dict, second: dict, keep) -> dict:
    """Booleans pair[a + b] = first[a] AND second[b] (keys as tuples: a value v counts as
    (v,)) for the pairs `keep(a, b)` allows; exactly one of them is true in every solution,
    so a mapping whose pair is not kept is excluded (keep every pair a valid mapping has)."""
    pairs = {}
    for a, lit_a in first.items():
        for b, lit_b in second.items():
            if not keep(a, b):
                continue
            key = (a if isinstance(a, tuple) else (a,)) + (b if isinstance(b, tuple) else (b,))
            lit = model.NewBoolVar(f"{name}[{','.join(map(str, key))}]")
            model.AddImplication(lit, lit_a).WithName(f"{lit.Name()} -> {lit_a.Name()}")
            model.AddImplication(lit, lit_b).WithName(f"{lit.Name()} -> {lit_b.Name()}")
            model.AddBoolOr([lit_a.Not(), lit_b.Not(), lit]).WithName(
                f"{lit_a.Name()} and {lit_b.Name()} -> {lit.Name()}")
            pairs[key] = lit
    # Every valid mapping has an allowed pair: forbid the disallowed ones outright.
    model.AddExactlyOne(pairs.values()).WithName(f"{name}: exactly one kept pair")
    return pairs


class Variables:
    """Owns every decision variable of the mapping and decodes a solution."""

    def __init__(self, model: cp_model.CpModel, space: Space, skeletons: list[Skeleton], num_gpus: int,
                 num_networks: int, flags: tuple[str, ...] | None = None):
        """`flags` names the flag dimensions to model (default: all of the space's)."""
        self.model = model
        self.space = space
        self.num_networks = num_networks
        self.degrees: dict[str, OneHot] = {d.name: one_hot(model, d.name, {getattr(s, d.name) for s in skeletons})
                                           for d in DEGREES}
        self.batch = model.NewIntVarFromDomain(cp_model.Domain.FromValues(sorted({s.batch for s in skeletons})), "batch")
        local_batches = {s.local_batch for s in skeletons}
        self.local_batch = model.NewIntVarFromDomain(cp_model.Domain.FromValues(sorted(local_batches)), "local_batch")
        self.microbatch = one_hot(model, "microbatch", {m for s in skeletons for m in s.microbatches})
        self.microbatches = model.NewIntVarFromDomain(
            cp_model.Domain.FromValues(sorted({d for q in local_batches for d in divisors(q)})), "microbatches")
        self.interleaving = one_hot(model, "interleaving", {v for s in skeletons for v in s.interleavings})
        # Only combinations some skeleton has (the others are invalid whatever the rest).
        self.combinations: dict[tuple[str, ...], dict[tuple[int, ...], cp_model.IntVar]] = {}
        self.group = self._combine(GROUP_DEGREES, skeletons)
        last = SPLIT_DEGREES[-1]              # (the split is the group and pp)
        splits = {s.split for s in skeletons}
        self.split = and_pairs(model, "split", self.group, self.degrees[last].is_, lambda g, p: (*g, p) in splits)
        group_mbs = {(*s.group, mb) for s in skeletons for mb in s.microbatches}
        self.group_mb = and_pairs(model, "group_mb", self.group, self.microbatch.is_,
                                  lambda g, mb: (*g, mb) in group_mbs)
        self.combinations[SPLIT_DEGREES] = self.split
        self.flags: dict[str, dict[int, cp_model.IntVar]] = {}
        for dim in space.flags:
            if flags is not None and dim.name not in flags:
                continue
            # (a subgroup's codes up to the largest any skeleton takes)
            widest = {"dp_cp_pow2": max((subgroup_limit(s.dp * s.cp) for s in skeletons), default=1)}
            self.flags[dim.name] = {code: model.NewBoolVar(f"{dim.name}[{dim.label_of(code)}]")
                                    for code in dim.domain(num_networks, widest)}
            model.AddExactlyOne(self.flags[dim.name].values()).WithName(f"{dim.name}: exactly one code")

    def __getattr__(self, name: str) -> OneHot:
        """A degree's one-hot by its name (`v.tp`, `v.pp`: costmodel.space.dimensions.DEGREES)."""
        degrees = self.__dict__.get("degrees", {})
        if name in degrees:
            return degrees[name]
        raise AttributeError(name)

    def _combine(self, names: tuple[str, ...], skeletons: list[Skeleton]) -> dict:
        """The literals of the degrees `names` taken together, (value, ...) -> AND of its parts,
        for the combinations some skeleton has; built as the AND of its two halves' (tp·cp and
        ep·etp make the group), each kept in `combinations` for the network spans."""
        if len(names) == 1:
            return {(value,): lit for value, lit in self.degrees[names[0]].is_.items()}
        half = len(names) // 2
        first, second = self._combine(names[:half], skeletons), self._combine(names[half:], skeletons)
        seen = {tuple(getattr(s, name) for name in names) for s in skeletons}
        label = "group" if names == GROUP_DEGREES else "_".join(names)
        self.combinations[names] = and_pairs(self.model, label, first, second, lambda a, b: a + b in seen)
        return self.combinations[names]

    def flag(self, name: str, code: int) -> cp_model.IntVar:
        return self.flags[name][code]

    def exclude_block(self, key: BlockKey) -> None:
        """Cut the block `key` (once scored exactly)."""
        self.model.AddBoolOr([self.split[key.split].Not(), self.interleaving.is_[key.interleaving].Not(),
                              self.microbatch.is_[key.microbatch].Not()]).WithName(f"block {tuple(key)} scored")

    def pin(self, name: str, value: int) -> None:
        """Fix dimension `name` (costmodel.space.dimensions) to `value` (a number, or a flag's code);
        a value outside the variable's domain makes the model infeasible."""
        if name in self.flags:
            lits = self.flags[name]
        elif isinstance(getattr(self, name, None), OneHot):
            lits = getattr(self, name).is_
        else:                                   # batch: a plain integer variable
            self.model.Add(getattr(self, name) == value).WithName(f"pin: {name} = {value}")
            return
        if value not in lits:
            self.model.AddBoolOr([]).WithName(f"pin: {name} = {value}, outside its domain")   # nothing is feasible
            return
        self.model.Add(lits[value] == 1).WithName(f"pin: {name} = {value}")

    def decode(self, solver: cp_model.CpSolver) -> tuple[BlockKey, dict[str, int]]:
        """The block and the flag codes of a solution."""
        key = BlockKey(*(getattr(self, name).value_of(solver) for name in SPLIT_DEGREES),
                       self.interleaving.value_of(solver), self.microbatch.value_of(solver))
        flags = {name: next(c for c, lit in lits.items() if solver.BooleanValue(lit))
                 for name, lits in self.flags.items()}
        return key, flags
