"""Mappings as columns of integers, so one call can score millions of them.

`MappingArrays` holds one numpy array per mapping dimension of costmodel.space.dimensions, under
the dimension's short name (`arrays.tp`, `arrays.recompute`); choices are stored as small
integer codes in the order their Enum declares them. The datatype and kernel switches are
per-problem constants, passed to the evaluator beside the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.space.dimensions import BY_NAME, DIMENSIONS
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.system import Datatype

NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)


def code(name: str, choice) -> int:
    """The integer code of a choice of dimension `name` (e.g. code("recompute", Recompute.full))."""
    return BY_NAME[name].code_of(choice)


@dataclass(frozen=True)
class MappingArrays:
    """N mappings of one model onto the same GPU count: `columns[name]` is the length-N
    array of dimension `name`, also readable as an attribute (`arrays.tp`)."""

    columns: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        if tuple(self.columns) != NAMES:
            missing = set(NAMES) - set(self.columns)
            extra = set(self.columns) - set(NAMES)
            raise ValueError(f"MappingArrays needs exactly the declared dimensions in order "
                             f"(missing {sorted(missing)}, extra {sorted(extra)})")

    @staticmethod
    def of(**columns) -> "MappingArrays":
        """From keyword columns (any order), each cast to its dimension's dtype."""
        return MappingArrays({name: np.asarray(columns[name]).astype(BY_NAME[name].dtype, copy=False)
                              for name in NAMES})

    def __getattr__(self, name: str) -> np.ndarray:
        if name == "columns":            # not yet set (unpickling): no recursion
            raise AttributeError(name)
        try:
            return self.columns[name]
        except KeyError:
            raise AttributeError(f"MappingArrays has no dimension {name!r}") from None

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def take(self, index) -> "MappingArrays":
        """The subset selected by an index array or boolean mask."""
        return MappingArrays({name: column[index] for name, column in self.columns.items()})

    @staticmethod
    def concatenate(parts: list["MappingArrays"]) -> "MappingArrays":
        return MappingArrays({name: np.concatenate([p.columns[name] for p in parts]) for name in NAMES})

    def to_mapping(self, row: int, datatype: Datatype, kernels: Kernels = Kernels()) -> Mapping:
        """The mapping in row `row` as a typed Mapping (Calculon field names)."""
        fields = {dim.field: dim.value_of(self.columns[dim.name][row]) for dim in DIMENSIONS}
        return Mapping(num_procs=int(self.tp[row] * self.cp[row] * self.pp[row] * self.dp[row]), datatype=datatype,
                       **kernels.mapping_settings, **fields)

    @staticmethod
    def from_mappings(mappings: list[Mapping], moe: bool = False) -> "MappingArrays":
        """Typed mappings as columns; an unstated expert tensor parallelism reads as the
        model's default (Mapping.with_model_defaults: tp with `moe`, else 1)."""
        mappings = [m.with_model_defaults(moe) for m in mappings]
        return MappingArrays({dim.name: np.array([dim.code_of(getattr(m, dim.field)) for m in mappings],
                                                 dtype=dim.dtype) for dim in DIMENSIONS})
