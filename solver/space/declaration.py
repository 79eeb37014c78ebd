"""The mapping space: which values each dimension of costmodel.space.dimensions may take for a
model on N GPUs, under a named preset. Counting, enumeration, brute force and CP-SAT all
read it.

A mapping has two kinds of dimensions (costmodel.space.dimensions declares both):

* the **skeleton** — tp, cp, ep, etp, pp, dp and the global batch, fixed by the (tp, cp, ep, etp, pp) split, and the
  pipeline interleaving and microbatch, chosen given the split independently of each other
  (`skeletons` computes every valid split with its valid interleavings and microbatches,
  using each dimension's declared `fits` rule and the space's own rules below);
* the **flags** — every choice, switch and network dimension, free when its declared
  conditions hold and otherwise pinned to its first code.

The rules are those of "The mapping space and how it is counted" in the project brief, which
reproduce Calculon's published counts exactly. Two named presets (`SPACES`):

* ``calculon-2023`` — TP overlap on/off (codes none, ring), optimizer sharding on/off
  (ZeRO stages 0 and 1), the 1F1B schedule only, and the quirk of that tool that the global batch is dp itself when
  dp alone exceeds the batch cap;
* ``calculon-current`` — Calculon's current enumeration (what ``full`` was before ZeRO-2/3 and ZB-H1):
  ``full`` with ZeRO stages 0/1 and 1F1B only; the paper batches that state no space use it;
* ``full`` (default) — TP overlap none | ring | pipe, ZeRO stages 0-3, 1F1B or ZB-H1, and the strict cap:
  when dp exceeds the cap there is no valid batch, so no mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, make_dataclass

from costmodel.space.choices import PipelineSchedule, ShardingStage, TPOverlap
from costmodel.space.dimensions import (BY_NAME, CHAIN, DEGREE, DEGREES, DIMENSIONS, FLAGS, GROUP_DEGREES, SKELETON_FACTS,
                                  SPLIT_DEGREES, Condition, Dimension, skeleton_facts)
from costmodel.errors import InputError
from costmodel.inputs.model import Model
from costmodel.space.layout import layout_interleavings
from costmodel.inputs.system import System
from solver.space.factor import divisors as factor_divisors

__all__ = ["SKELETON_FACTS", "Condition", "FlagDimension", "Skeleton", "Space", "SPACES", "get_space", "skeletons",
           "divisors"]


@dataclass(frozen=True)
class FlagDimension:
    """A flag as a space offers it: its declaration and, where the space offers fewer, the
    codes it offers (the first stays the pinned value)."""

    dim: Dimension
    offered: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return self.dim.name

    @property
    def free_when(self) -> tuple[Condition, ...]:
        return self.dim.free_when

    @property
    def meaning(self) -> str:
        return self.dim.meaning

    def domain(self, num_networks: int, facts: dict | None = None) -> tuple[int, ...]:
        """The codes offered; on a skeleton with `facts`, those it can take."""
        domain = self.offered if self.offered is not None else self.dim.codes(num_networks)
        return domain if facts is None else self.dim.codes_at(domain, facts)

    def is_free(self, values: dict[str, int]) -> bool:
        return self.dim.is_free(values)

    def label_of(self, code: int) -> str:
        return self.dim.label_of(code)

    def domain_text(self) -> str:
        if self.offered is None:
            return self.dim.domain_text()
        return " | ".join(self.dim.label_of(c) for c in self.offered)

    def rule_text(self) -> str:
        return self.dim.rule_text()


@dataclass(frozen=True)
class SkeletonDimension:
    """A skeleton dimension, described for people (its rule is code in `skeletons`)."""

    name: str
    domain_text: str
    rule_text: str
    meaning: str


@dataclass(frozen=True)
class Space:
    """A named mapping space: the skeleton rules plus the flags, some offering fewer codes."""

    name: str
    summary: str
    tp_max: int
    """Largest tensor parallelism considered (Calculon's searches stop at 256)."""
    cp_max: int
    """Largest context parallelism considered (1: none, as in Calculon's spaces)."""
    uneven_stages: bool
    """Whether pp may leave the blocks uneven (costmodel.space.layout's rule: pp > 2
    dividing num_blocks + 2, else a short last chunk); the Calculon presets ask pp to divide them."""
    offered: tuple[tuple[str, tuple[int, ...]], ...]
    """Flags that offer fewer codes than they declare: (name, codes offered)."""
    batch_is_dp_above_cap: bool
    """Calculon-2023 quirk: when dp alone exceeds the batch cap, the global batch is dp (one
    sequence per replica) instead of there being no valid batch."""
    pins: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Dimensions the user fixed (`--fix`, solver.space.pins): (name, the values — numbers,
    or a flag's codes — it may take). Every mapping outside is left out of the space."""

    def admits(self, name: str, value: int) -> bool:
        """Whether the pins let dimension `name` take `value`."""
        for pinned, allowed in self.pins:
            if pinned == name:
                return value in allowed
        return True

    def limit(self, degree: str) -> int | None:
        """The largest value the space considers for `degree` (its declared Degree.limit field:
        tp_max, cp_max), or None."""
        field = DEGREE[degree].limit
        return getattr(self, field) if field else None

    @property
    def flags(self) -> tuple[FlagDimension, ...]:
        offered = dict(self.offered)
        return tuple(FlagDimension(dim, offered.get(dim.name)) for dim in FLAGS)

    def codes(self, name: str, *, pinned: bool = True) -> tuple[int, ...]:
        """The codes flag `name` may take in this space: those it offers (a network flag's on
        one network), less those its pins refuse unless `pinned` is False. The CP-SAT tables
        take the best over them (`--fix cp_comm=p2p` bounds with the ring alone)."""
        domain = next(f.domain(1) for f in self.flags if f.name == name)
        return tuple(code for code in domain if not pinned or self.admits(name, code))

    def skeleton_dimensions(self) -> tuple[SkeletonDimension, ...]:
        quirk = ("; if dp > cap, batch = dp (calculon-2023 quirk)" if self.batch_is_dp_above_cap
                 else "; if dp > cap there is no batch and no mapping")
        out = []
        for dim in DIMENSIONS:
            if dim.is_flag:
                continue
            domain, _, rule = dim.rule.partition("; ")
            domain = domain.replace("tp_max", str(self.tp_max)).replace("cp_max", str(self.cp_max))
            out.append(SkeletonDimension(dim.name, domain, rule + (quirk if dim.name == "batch" else ""), dim.meaning))
        return tuple(out)

    def batch_for(self, dp: int, max_batch: int) -> int | None:
        """Global batch for `dp` replicas under the cap, or None when there is none."""
        if dp <= max_batch:
            return max_batch // dp * dp
        return dp if self.batch_is_dp_above_cap else None


CP_MAX = 64
"""`full` considers context parallelism up to 64: Llama 3 405B trained 131K-token sequences
with cp = 16 (Dubey et al. 2024, Table 4), and Megatron-LM's long-context recipes go to 32;
a larger ring spends more on its steps' kernel launches and transfers than it saves."""
_CODE = BY_NAME["tp_overlap"].code_of
_ZERO = BY_NAME["zero"].code_of
_WHOLE_GROUP = ("shard", (0,))          # no hybrid sharding in the Calculon presets
SPACES: dict[str, Space] = {
    "full": Space(
        name="full", summary="Calculon's current enumeration: TP overlap none | ring | pipe, strict batch cap; "
                             "plus ZeRO sharding stages 0-3, 1F1B or ZB-H1, context parallelism up to 64, "
                             "uneven pipeline stages.",
        tp_max=256, cp_max=CP_MAX, uneven_stages=True, offered=(), batch_is_dp_above_cap=False),
    "calculon-current": Space(
        name="calculon-current", summary="Calculon's current enumeration, as `full` was before ZeRO-2/3 and ZB-H1 joined it: "
                                 "TP overlap none | ring | pipe, ZeRO stages 0/1, 1F1B, strict batch cap.",
        tp_max=256, cp_max=1, uneven_stages=False, offered=(("zero", (_ZERO(ShardingStage.none), _ZERO(ShardingStage.optimizer))),
                             ("sched", (BY_NAME["sched"].code_of(PipelineSchedule.one_f_one_b),)), _WHOLE_GROUP),
        batch_is_dp_above_cap=False),
    "calculon-2023": Space(
        name="calculon-2023",
        summary="The space of the 2023 papers (reproduces 15,612,832 / 842,080): TP overlap on/off, batch = dp when dp > cap.",
        tp_max=256, cp_max=1, uneven_stages=False, offered=(("tp_overlap", (_CODE(TPOverlap.none), _CODE(TPOverlap.ring))),
                             ("zero", (_ZERO(ShardingStage.none), _ZERO(ShardingStage.optimizer))),
                             ("sched", (BY_NAME["sched"].code_of(PipelineSchedule.one_f_one_b),)), _WHOLE_GROUP),
        batch_is_dp_above_cap=True),
}
DEFAULT_SPACE = "full"


def get_space(name: str) -> Space:
    """The preset called `name`, or an InputError listing the presets."""
    if name not in SPACES:
        raise InputError(f"space {name!r} does not exist (choose from {', '.join(SPACES)})")
    return SPACES[name]


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n, ascending (none for n < 1), by factorisation: instant for any
    n below 2^64 (solver.space.factor)."""
    return factor_divisors(n) if n >= 1 else ()


class _SkeletonParts:
    """What every Skeleton has besides its degrees (the fields are made from DEGREES below)."""

    @property
    def local_batch(self) -> int:
        return self.batch // self.dp

    @property
    def split(self) -> tuple[int, ...]:
        """The split's degrees (costmodel.space.dimensions.SPLIT_DEGREES): what identifies the
        skeleton (dp and batch follow)."""
        return tuple(getattr(self, name) for name in SPLIT_DEGREES)

    @property
    def group(self) -> tuple[int, ...]:
        """The degrees one block's cost reads (costmodel.space.dimensions.GROUP_DEGREES)."""
        return tuple(getattr(self, name) for name in GROUP_DEGREES)

    @property
    def degrees(self) -> dict[str, int]:
        """Every degree by name (DEGREES: the split's and dp)."""
        return {d.name: getattr(self, d.name) for d in DEGREES}


Skeleton = make_dataclass(
    "Skeleton", [*((d.name, int) for d in DEGREES), ("batch", int), ("interleavings", tuple[int, ...]),
                 ("microbatches", tuple[int, ...])], bases=(_SkeletonParts,), frozen=True)
Skeleton.__doc__ = """One valid split (SPLIT_DEGREES) with its dp, global batch, and the valid
interleavings and microbatch sizes; every flag combination is allowed on top of it. Its fields
are the degrees of costmodel.space.dimensions.DEGREES, in order, then batch, interleavings and
microbatches."""
Skeleton.__module__ = __name__

_PP, _IL = BY_NAME["pp"], BY_NAME["interleaving"]


def _degree_values(name: str, chosen: dict[str, int], model: Model, num_gpus: int, space: Space):
    """The values degree `name` may take after the degrees `chosen` (earlier in SPLIT_DEGREES):
    a divisor of the GPUs the chain leaves (CHAIN: tp·cp·pp·dp = N), or of N for a degree
    that folds into a stage (ep, etp), up to its space limit, that its declared `fits` rule
    (read on what is chosen so far) and the pins admit."""
    room = num_gpus
    if name in CHAIN:
        room //= math.prod(value for degree, value in chosen.items() if degree in CHAIN)
    limit = space.limit(name)
    dim = BY_NAME[name]
    for value in divisors(room):
        if limit is not None and value > limit:
            break
        if space.admits(name, value) and not (dim.fits and dim.fits(model, None, {**chosen, name: value})):
            yield value


def skeletons(model: Model, num_gpus: int, max_batch: int, space: Space) -> list[Skeleton]:
    """Every valid skeleton, in enumeration order (SPLIT_DEGREES lexicographic: tp ascending,
    then cp, ep, etp, pp). Each degree is a divisor of what the chain leaves (tp·cp·pp·dp = N;
    ep and etp, which fold into a stage's GPUs, of N) within its space limit (tp, etp <=
    tp_max, cp <= cp_max) and obeys its declared `fits` rule: tp divides the heads and widths,
    2·cp divides seq_size, ep divides num_experts and etp expert_feedforward (both 1 for a dense
    model), ep·etp divides tp·cp·dp (MoE parallel folding, checked once dp is known), pp lays the
    blocks out by the layout rule (`stage_interleavings`, with the interleavings valid on it);
    microbatches divide the local batch and, a rule of the space for every TP communication
    (Calculon's), split a GPU's microbatch·seq_size/cp tokens evenly over tp. Skeletons with no
    valid microbatch or batch are left out."""
    if num_gpus <= 0:
        raise InputError(f"gpus: {num_gpus} must be > 0")
    if max_batch <= 0:
        raise InputError(f"max batch: {max_batch} must be > 0")
    result = []

    def extend(chosen: dict[str, int]) -> None:
        if len(chosen) < len(SPLIT_DEGREES):
            name = SPLIT_DEGREES[len(chosen)]
            for value in _degree_values(name, chosen, model, num_gpus, space):
                extend({**chosen, name: value})
            return
        interleavings = stage_interleavings(model, chosen["pp"], space)
        if not interleavings:
            return
        dp = num_gpus // math.prod(chosen[name] for name in CHAIN if name != "dp")
        degrees = {**chosen, "dp": dp}
        batch = space.batch_for(dp, max_batch)
        if (batch is None or not (space.admits("dp", dp) and space.admits("batch", batch))
                or any(BY_NAME[name].fits and BY_NAME[name].fits(model, None, degrees) for name in SPLIT_DEGREES)):
            return
        interleavings = tuple(v for v in interleavings if space.admits("interleaving", v))
        microbatches = tuple(m for m in divisors(batch // dp)
                             if (m * model.seq_size) % (degrees["tp"] * degrees["cp"]) == 0
                             and space.admits("microbatch", m))
        if interleavings and microbatches:
            result.append(Skeleton(**degrees, batch=batch, interleavings=interleavings, microbatches=microbatches))

    extend({})
    return result


def stage_interleavings(model: Model, pp: int, space: Space) -> tuple[int, ...]:
    """The interleavings valid with pp stages (none when pp itself is not): pp's and interleaving's
    declared rules (`layout_interleavings`), and even stages only where the space asks for them."""
    blocks = model.num_blocks
    if pp > blocks or _PP.fits(model, None, {"pp": pp}) or (blocks % pp and not space.uneven_stages):
        return ()
    return tuple(v for v in layout_interleavings(blocks, pp)
                 if not _IL.fits(model, None, {"pp": pp, "interleaving": v}))


def facts(skeleton: Skeleton, system: System) -> dict[str, int]:
    """The skeleton facts conditions may test (costmodel.space.dimensions.skeleton_facts)."""
    return skeleton_facts(skeleton.degrees, system.offload is not None)


def coarse_facts(f: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """Skeleton facts reduced to what conditions can tell apart (each degree compared with 1)."""
    exact = ("offload", "dp_cp_pow2")          # (dp_cp_pow2 bounds a subgroup's codes)
    return tuple(sorted({**{k: min(v, 2) for k, v in f.items() if k not in exact},
                         **{k: f[k] for k in exact if k in f}}.items()))
