"""How many mappings a space holds, in closed form over the (tp, cp, ep, etp, pp) skeletons.

For one skeleton the count is

    interleavings × microbatches × flag combinations,

and the flag combinations are summed over the assignments of the flags that other flags'
conditions read (recompute × tp_comm: 9 terms) of the product of the other flags' domain
sizes (1 when a flag is pinned). Nothing loops over mappings: the 15.6 million of the
brief's 256-block model take a few milliseconds.

How many of them the exact model accepts is a search, not a count: `mapsat count
--feasible` adds it from `solver.search.brute.scan` (`CountResult.with_feasible`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache

from costmodel.space.dimensions import DIMENSIONS
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.space.declaration import Skeleton, Space, coarse_facts, facts, skeletons


@dataclass(frozen=True)
class CountResult:
    """Counts of one space for one problem.

    `by_dimension[d][v]` is how many mappings have value `v` in dimension `d` (values as
    strings: numbers for the skeleton and networks, choice names for the other flags); each
    dimension's counts sum to `mappings`. `feasible`, `feasible_by_dimension` and the
    settings they were scored under (`datatype`, `kernels`) are set only when feasibility was
    counted."""

    space: str
    num_gpus: int
    max_batch: int
    mappings: int
    skeletons: int
    by_dimension: dict[str, dict[str, int]]
    seconds: float
    feasible: int | None = None
    feasible_by_dimension: dict[str, dict[str, int]] | None = None
    datatype: str | None = None
    kernels: Kernels | None = None
    notes: list[str] = field(default_factory=list)

    def with_feasible(self, feasible: int, feasible_by_dimension: dict[str, dict[str, int]], datatype: Datatype,
                      seconds: float, kernels: Kernels = Kernels()) -> "CountResult":
        """This count with the feasible ones (from an exhaustive scan under `datatype` and
        `kernels`) added, `seconds` more."""
        return replace(self, feasible=feasible, feasible_by_dimension=feasible_by_dimension,
                       datatype=datatype.value, kernels=kernels, seconds=self.seconds + seconds)

    def to_dict(self) -> dict:
        out = {"space": self.space, "gpus": self.num_gpus, "max_batch": self.max_batch,
               "mappings": self.mappings, "skeletons": self.skeletons, "by_dimension": self.by_dimension}
        if self.feasible is not None:
            kernels = self.kernels or Kernels()
            out.update(feasible=self.feasible, datatype=self.datatype, attention=kernels.attention,
                       grad_datatype=kernels.grad_datatype, **kernels.precision_record,
                       feasible_by_dimension=self.feasible_by_dimension)
        out["seconds"] = self.seconds
        return out


def _referenced_flags(space: Space) -> list[str]:
    """Flags that some other flag's condition reads (recompute and tp_comm), in order."""
    read = {c.subject for dim in space.flags for c in dim.free_when}
    return [dim.name for dim in space.flags if dim.name in read]


@lru_cache(maxsize=4096)
def count_flag_combinations(space: Space, known: tuple[tuple[str, int], ...], num_networks: int,
                            fixed: tuple[str, int] | None = None) -> int:
    """Number of valid flag combinations given the skeleton facts `known`, optionally with one
    flag fixed to one code (for the per-value breakdown). Closed form: a sum over the
    assignments of the referenced flags of a product of the other flags' sizes; the flags whose
    freedom reads skeleton facts only give the same factor in every assignment, taken once."""
    dims = space.flags
    referenced = _referenced_flags(space)
    by_name = {dim.name: dim for dim in dims}
    reads_flags = {dim.name for dim in dims if any(c.subject in by_name for c in dim.free_when)}

    def options(name: str, values: dict[str, int]) -> tuple[int, ...]:
        dim = by_name[name]
        domain = dim.domain(num_networks, values)
        domain = domain if dim.is_free(values) else domain[:1]
        domain = tuple(c for c in domain if space.admits(name, c))
        if fixed is not None and fixed[0] == name:
            domain = tuple(c for c in domain if c == fixed[1])
        return domain

    total = 0
    base = dict(known)
    constant = 1
    for dim in dims:
        if dim.name not in referenced and dim.name not in reads_flags:
            constant *= len(options(dim.name, base))
    if not constant:
        return 0
    varying = [dim.name for dim in dims if dim.name not in referenced and dim.name in reads_flags]
    # Assign the referenced flags in declaration order (each may depend on earlier ones).
    stack: list[dict[str, int]] = [base]
    for name in referenced:
        stack = [{**values, name: code} for values in stack for code in options(name, values)]
    for values in stack:
        product = constant
        for name in varying:
            product *= len(options(name, values))
        total += product
    return total


@lru_cache(maxsize=4096)
def flag_breakdown(space: Space, known: tuple[tuple[str, int], ...], num_networks: int) -> dict[str, dict[int, int]]:
    """count_flag_combinations with each flag fixed to each of its codes, all in one pass: for
    every flag, {code: combinations taking it} (codes no combination takes left out). In each
    assignment of the referenced flags, a flag of n options takes each with the product of
    the others' sizes (the assignment's product / n); a referenced flag takes its assigned code."""
    dims = space.flags
    referenced = _referenced_flags(space)
    by_name = {dim.name: dim for dim in dims}

    def options(name: str, values: dict[str, int]) -> tuple[int, ...]:
        dim = by_name[name]
        domain = dim.domain(num_networks, values)
        domain = domain if dim.is_free(values) else domain[:1]
        return tuple(c for c in domain if space.admits(name, c))

    out: dict[str, dict[int, int]] = {dim.name: {} for dim in dims}
    stack: list[dict[str, int]] = [dict(known)]
    for name in referenced:
        stack = [{**values, name: code} for values in stack for code in options(name, values)]
    for values in stack:
        sizes = {dim.name: options(dim.name, values) for dim in dims if dim.name not in values}
        product = math.prod(len(codes) for codes in sizes.values())
        if not product:
            continue
        for name in referenced:
            out[name][values[name]] = out[name].get(values[name], 0) + product
        for name, codes in sizes.items():
            for code in codes:
                out[name][code] = out[name].get(code, 0) + product // len(codes)
    return out


def _known(skeleton: Skeleton, system: System) -> tuple[tuple[str, int], ...]:
    """Skeleton facts reduced to what conditions can tell apart (degrees compared with 1)."""
    return coarse_facts(facts(skeleton, system))


def count_mappings(model: Model, system: System, num_gpus: int, max_batch: int, space: Space) -> CountResult:
    """Count the mappings of `space` in closed form, with the count per value of each dimension."""
    start = time.perf_counter()
    skels = skeletons(model, num_gpus, max_batch, space)
    n_net = len(system.networks)
    breakdown: dict[str, dict[int | str, int]] = defaultdict(lambda: defaultdict(int))
    total = 0
    for sk in skels:
        known = _known(sk, system)
        flags = count_flag_combinations(space, known, n_net)
        n_il, n_mb = len(sk.interleavings), len(sk.microbatches)
        here = n_il * n_mb * flags
        total += here
        for name, value in (*sk.degrees.items(), ("batch", sk.batch)):
            breakdown[name][value] += here
        for il in sk.interleavings:
            breakdown["interleaving"][il] += n_mb * flags
        for mb in sk.microbatches:
            breakdown["microbatch"][mb] += n_il * flags
        for name, parts in flag_breakdown(space, known, n_net).items():
            for code, part in parts.items():
                breakdown[name][code] += n_il * n_mb * part
    return CountResult(space=space.name, num_gpus=num_gpus, max_batch=max_batch, mappings=total,
                       skeletons=len(skels), by_dimension=label_breakdown(space, breakdown),
                       seconds=time.perf_counter() - start)


def label_breakdown(space: Space, breakdown: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """A count per value of each dimension keyed by readable labels: dimensions in declaration
    order, values ascending (numbers for the skeleton and networks, choice names, off/on)."""
    out: dict[str, dict[str, int]] = {}
    for dim in DIMENSIONS:
        values = breakdown.get(dim.name, {})
        label = dim.label_of if dim.is_flag else str
        out[dim.name] = {label(v): values[v] for v in sorted(values)}
    return out
