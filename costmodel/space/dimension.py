"""What a declared dimension of the mapping space holds (costmodel.space.dimensions declares them).

A `Dimension` says everything the rest of the code needs to know about one axis of the
mapping space:

* `name` — the one short name used inside: `MappingArrays` columns, the formulas' view
  (`m.tp`, `m.weight_offload`), count breakdowns, CSV and report columns, CP-SAT variable
  names (`tp[8]`, `recompute[full]`);
* `field` — Calculon's execution-file field (`tensor_par`), used only at the file boundary;
* `kind` — how values are encoded: a whole number (`split` for tp/cp/ep/etp/pp/dp/batch, fixed
  by the (tp, cp, ep, etp, pp) split; `per_split` for interleaving and microbatch, chosen given the split), a
  `choice` among an Enum's members (code i = i-th member), an on/off `switch`, or the index
  of a `network`;
* `free_when` — for flags (choice, switch, network): the conditions under which any code
  may be taken; otherwise the flag is pinned to its first code (off / none / network 0);
* `fits` — the rule any mapping of a model must satisfy in this dimension (divisibility,
  an existing network, ...), as a function returning the reason it does not, or None;
* `meaning`, `rule`, `label` — for people (`mapsat spaces`, docs, table headers);
* `touches` — what the dimension affects (`Touches`): a block's compute, memory or time only,
  a network check, an axis of the surrogate's block grid. The exact model's sharing
  (`costmodel.evaluate` BLOCK_DIMENSIONS, TIME_ONLY_DIMENSIONS, STRUCTURE_DIMENSIONS) and the
  surrogate's tables (solver.search.cpsat.block_tables BLOCK_FLAGS and network axes) read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import Callable, Literal, Protocol

import numpy as np

from costmodel.inputs.limits import Bound

Kind = Literal["split", "per_split", "choice", "switch", "network", "subgroup"]


class FreeCondition(Protocol):
    """One condition of a flag's freedom (costmodel.space.dimensions.Condition: `subject op value`)."""

    def holds(self, values: dict[str, int]) -> bool: ...

    def describe(self) -> str: ...


class Touches(Enum):
    """What a dimension affects. Every dimension states `memory` or `time_only`, not both."""

    block = "a block's compute"
    """costmodel.terms' block terms read it: mappings equal in every `block` dimension share one
    block (BLOCK_DIMENSIONS)."""
    memory = "memory"
    """it may change a mapping's HBM or offload bytes."""
    time_only = "time only"
    """it changes a mapping's time, never its bytes (what overlaps, which network a group
    takes): the capacity checks are decided once across its values (TIME_ONLY_DIMENSIONS)."""
    network_check = "a network check"
    """the structural checks (`costmodel.evaluate.structural_checks`: a group fits its network,
    Ulysses' heads split) read it (STRUCTURE_DIMENSIONS)."""
    surrogate_axis = "a surrogate axis"
    """an axis of the surrogate's block grid (solver.search.cpsat.block_tables): the tables keep
    one entry per code of it, or minimise over it where it is time only or network-checked.
    A block dimension that is not one (ep_net, etp_net) is chosen per group instead."""


BLOCK, MEMORY, TIME_ONLY, NETWORK_CHECK, SURROGATE_AXIS = Touches
FLAG_KINDS = ("choice", "switch", "network", "subgroup")
SUBGROUP_CODES: tuple[int, ...] = (0, *(1 << k for k in range(1, 24)))
"""A `subgroup` flag's codes: 0 is the whole group (dp·cp), any other code the size of the
sub-group itself; a space offers the powers of two that divide the group and are smaller
(`subgroup_limit`), a mapping file any divisor."""


FitRule = Callable[[object, object, dict], "str | None"]
"""fits(model, system, values) -> why the value of this dimension does not fit, or None.
`values` maps every dimension's name to its value (enum members for choices)."""


@dataclass(frozen=True)
class Dimension:
    name: str
    field: str
    kind: Kind
    meaning: str
    label: str = ""
    choices: type[Enum] | None = None
    free_when: tuple[FreeCondition, ...] = ()
    rule: str = ""
    fits: FitRule | None = None
    bound: Bound | None = None
    """For numbers (and network indices): the range a file may give (costmodel.inputs.limits)."""
    touches: frozenset[Touches] = frozenset()
    """What the dimension affects (Touches)."""
    default: object = ...
    """For numbers: the value a mapping file may leave out (`...`: it must be given), or a
    function (values by short name, whether the model has experts) -> the value, where the
    model decides (etp; costmodel.inputs.mapping.Mapping.with_model_defaults)."""

    @property
    def model_decides(self) -> bool:
        """Whether a file may leave this number to the model (its default is a function)."""
        return callable(self.default)

    @property
    def is_flag(self) -> bool:
        return self.kind in FLAG_KINDS

    @property
    def header(self) -> str:
        """Short column header for tables."""
        return self.label or self.name

    def codes(self, num_networks: int) -> tuple[int, ...]:
        """Every code of a flag (choices in declaration order, off/on, network indices)."""
        if self.kind == "choice":
            return tuple(range(len(self.choices)))
        if self.kind == "switch":
            return (0, 1)
        if self.kind == "network":
            return tuple(range(num_networks))
        if self.kind == "subgroup":
            return SUBGROUP_CODES
        raise ValueError(f"{self.name} is not a flag")

    def label_of(self, code: int) -> str:
        """How people read a code: the choice's name, off/on, the network index, the number."""
        if self.kind == "choice":
            return list(self.choices)[code].value
        if self.kind == "switch":
            return "on" if code else "off"
        if self.kind == "subgroup" and not code:
            return "all"
        return str(code)

    def value_of(self, code):
        """The Mapping field's value for a code (an Enum member, a bool, an int, None for a
        subgroup's whole group)."""
        if self.kind == "choice":
            return list(self.choices)[int(code)]
        if self.kind == "switch":
            return bool(code)
        if self.kind == "subgroup":
            return int(code) or None
        return int(code)

    def code_of(self, value) -> int:
        """The integer code of a Mapping field's value (a choice by member or by its text)."""
        if self.kind == "choice":
            return _choice_codes(self.choices)[value]
        if self.kind == "subgroup" and value is None:
            return 0
        return int(value)

    def codes_at(self, domain: tuple[int, ...], facts: dict) -> tuple[int, ...]:
        """`domain` less the codes a skeleton with `facts` cannot take (a subgroup's sizes
        above `dp_cp_pow2`; all when the facts do not say)."""
        if self.kind != "subgroup" or "dp_cp_pow2" not in facts:
            return domain
        return tuple(code for code in domain if code <= facts["dp_cp_pow2"])

    @property
    def dtype(self) -> type:
        """numpy dtype of the column in MappingArrays."""
        return {"split": np.int64, "per_split": np.int64, "choice": np.int8, "switch": np.bool_,
                "network": np.int8, "subgroup": np.int32}[self.kind]

    def is_free(self, values: dict[str, int]) -> bool:
        return all(c.holds(values) for c in self.free_when)

    def domain_text(self) -> str:
        if self.kind == "network":
            return "0 .. networks-1"
        if self.kind == "subgroup":
            return "all | powers of two 2 .. below dp·cp dividing it"
        if self.kind in ("choice", "switch"):
            return " | ".join(self.label_of(c) for c in self.codes(0))
        return self.rule.split(";")[0]

    def rule_text(self) -> str:
        if not self.is_flag:
            return self.rule
        return "always" if not self.free_when else "when " + " and ".join(c.describe() for c in self.free_when)


@cache
def _choice_codes(choices: type[Enum]) -> dict:
    """Member (and its text) -> code, for one choice enum."""
    return {**{m: i for i, m in enumerate(choices)}, **{m.value: i for i, m in enumerate(choices)}}
