"""The mapping space, declared once: counting, enumeration, brute force and CP-SAT all read it.

A mapping of a model onto N GPUs has two kinds of dimensions:

* the **skeleton** — tp, pp, dp, global batch, pipeline interleaving and microbatch — tied
  together by divisibility rules (`skeletons` computes every valid (tp, pp) with its batch
  and the valid interleavings and microbatch sizes);
* the **flags** — recompute, optimizer sharding, TP communication, sequence-parallel
  all-gather redo, DP overlap, TP overlap, the three offloads and the network carrying each
  of tp, pp, dp. Each flag is a `FlagDimension` with a domain of integer codes (the codes of
  `costmodel.encoding`) and the conditions (`Condition`) under which it is free; when a
  condition fails the flag is pinned to its first code (off / none / network 0).

The rules are those of "The mapping space and how it is counted" in the project brief, which
reproduce Calculon's published counts exactly. Two named presets (`SPACES`):

* ``calculon-2023`` — TP overlap on/off (codes none, ring) and the quirk of that tool that
  the global batch is dp itself when dp alone exceeds the batch cap;
* ``full`` (default) — TP overlap none | ring | pipe and the strict cap: when dp exceeds the
  cap there is no valid batch, so no mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator, Literal

from costmodel.encoding import (
    RECOMPUTE_CHOICES, RECOMPUTE_FULL, TP_COMM_CHOICES, TP_COMM_RS_AG, TP_OVERLAP_CHOICES,
    TP_OVERLAP_NONE, TP_OVERLAP_PIPE, TP_OVERLAP_RING,
)
from costmodel.errors import InputError
from costmodel.model import Model
from costmodel.system import System
from solver.space.factor import divisors as factor_divisors

# Facts a condition may test besides earlier flags: tp, pp, dp (the skeleton) and `offload`
# (1 when the system has an offload memory tier, else 0).
SKELETON_FACTS = ("tp", "pp", "dp", "offload")


@dataclass(frozen=True)
class Condition:
    """`subject op value`, e.g. dp > 1 or recompute != full. `subject` is a skeleton fact
    (tp, pp, dp, offload) or the name of an earlier flag dimension (compared by code)."""

    subject: str
    op: Literal["==", "!=", ">"]
    value: int

    def holds(self, values: dict[str, int]) -> bool:
        return self.holds_for(values[self.subject])

    def holds_for(self, actual: int) -> bool:
        if self.op == "==":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        return actual > self.value

    def describe(self) -> str:
        names = {"recompute": RECOMPUTE_CHOICES, "tp_comm": TP_COMM_CHOICES}
        shown = names[self.subject][self.value].value if self.subject in names else str(self.value)
        if (self.subject, self.op, self.value) == ("offload", ">", 0):
            return "the system has offload memory"
        return f"{self.subject} {self.op} {shown}"


NETWORKS = "networks"
"""Domain marker: one code per network of the system (0 .. len(system.networks) - 1)."""


@dataclass(frozen=True)
class FlagDimension:
    """A flag of the mapping: a column of `MappingArrays` holding one of `codes`.

    Free (any code) when every condition in `free_when` holds, otherwise pinned to
    `codes[0]`. Conditions may only refer to skeleton facts and to flags declared earlier,
    so the flags can be chosen in declaration order."""

    name: str
    codes: tuple[int, ...] | Literal["networks"]
    free_when: tuple[Condition, ...]
    meaning: str
    labels: tuple[str, ...] = ()

    def domain(self, num_networks: int) -> tuple[int, ...]:
        return tuple(range(num_networks)) if self.codes == NETWORKS else self.codes

    def is_free(self, values: dict[str, int]) -> bool:
        return all(c.holds(values) for c in self.free_when)

    def domain_text(self) -> str:
        if self.codes == NETWORKS:
            return "0 .. networks-1"
        return " | ".join(self.labels) if self.labels else " | ".join(map(str, self.codes))

    def rule_text(self) -> str:
        return "always" if not self.free_when else "when " + " and ".join(c.describe() for c in self.free_when)


_OFF_ON = (0, 1)
_HAS_OFFLOAD = Condition("offload", ">", 0)


def _flag_dimensions(tp_overlap_codes: tuple[int, ...]) -> tuple[FlagDimension, ...]:
    """The flags in declaration (= enumeration) order."""
    return (
        FlagDimension("recompute", (0, 1, 2), (), "activation recomputation: full (store block inputs only), "
                      "attn_only (recompute the attention core), none", tuple(c.value for c in RECOMPUTE_CHOICES)),
        FlagDimension("tp_comm", (0, 1, 2), (), "TP communication: all-reduce, p2p reduce-scatter/all-gather, "
                      "or rs_ag = sequence parallelism", tuple(c.value for c in TP_COMM_CHOICES)),
        FlagDimension("tp_overlap", tp_overlap_codes, (Condition("tp", ">", 1),),
                      "overlap TP communication with the neighbouring matrix multiply",
                      tuple(TP_OVERLAP_CHOICES[c].value for c in tp_overlap_codes)),
        FlagDimension("optimizer_sharding", _OFF_ON, (Condition("dp", ">", 1),),
                      "shard optimizer state across the dp replicas (ZeRO-1)", ("off", "on")),
        FlagDimension("seq_par_ag_redo", _OFF_ON,
                      (Condition("tp_comm", "==", TP_COMM_RS_AG), Condition("recompute", "!=", RECOMPUTE_FULL)),
                      "redo the sequence-parallel all-gather in backward instead of storing its output", ("off", "on")),
        FlagDimension("dp_overlap", _OFF_ON, (Condition("dp", ">", 1),),
                      "overlap the DP gradient reduction with the backward pass", ("off", "on")),
        FlagDimension("weight_offload", _OFF_ON, (_HAS_OFFLOAD,),
                      "keep weights in offload memory, prefetching each block", ("off", "on")),
        FlagDimension("activations_offload", _OFF_ON, (_HAS_OFFLOAD, Condition("recompute", "!=", RECOMPUTE_FULL)),
                      "keep stored activations in offload memory", ("off", "on")),
        FlagDimension("optimizer_offload", _OFF_ON, (_HAS_OFFLOAD,),
                      "keep optimizer state in offload memory; the step streams it", ("off", "on")),
        FlagDimension("tp_net", NETWORKS, (Condition("tp", ">", 1),), "network index carrying TP traffic"),
        FlagDimension("pp_net", NETWORKS, (Condition("pp", ">", 1),), "network index carrying PP traffic"),
        FlagDimension("dp_net", NETWORKS, (Condition("dp", ">", 1),), "network index carrying DP traffic"),
    )


@dataclass(frozen=True)
class SkeletonDimension:
    """A skeleton dimension, described for people (its rule is code in `skeletons`)."""

    name: str
    domain_text: str
    rule_text: str
    meaning: str


@dataclass(frozen=True)
class Space:
    """A named mapping space: the skeleton rules plus the flag dimensions."""

    name: str
    summary: str
    tp_max: int
    """Largest tensor parallelism considered (Calculon's searches stop at 256)."""
    tp_overlap_codes: tuple[int, ...]
    """TP-overlap codes offered (into costmodel.encoding.TP_OVERLAP_CHOICES)."""
    batch_is_dp_above_cap: bool
    """Calculon-2023 quirk: when dp alone exceeds the batch cap, the global batch is dp (one
    sequence per replica) instead of there being no valid batch."""
    fused_activation: bool = True
    """GeLU fused into the preceding matrix multiply, a constant of the problem, not searched."""
    fused_attention: bool = True
    """FlashAttention-style attention core, a constant of the problem, not searched
    (`--attention unfused` makes the variant that passes the scores through HBM)."""

    def __post_init__(self) -> None:
        # The flag tables are cached per (tp > 1, pp > 1, dp > 1); a condition testing a
        # skeleton fact any other way would make that cache wrong, so refuse it here.
        names = set()
        for dim in self.flags:
            for cond in dim.free_when:
                if cond.subject in ("tp", "pp", "dp") and (cond.op, cond.value) != (">", 1):
                    raise ValueError(f"{dim.name}: skeleton conditions must read '{cond.subject} > 1'")
                if cond.subject not in SKELETON_FACTS and cond.subject not in names:
                    raise ValueError(f"{dim.name}: condition on {cond.subject!r}, which is not an earlier flag")
            names.add(dim.name)

    @property
    def kernels(self) -> dict[str, bool]:
        """The kernel choices every mapping of the space shares, as Mapping/Context keywords."""
        return {"fused_activation": self.fused_activation, "fused_attention": self.fused_attention}

    @property
    def flags(self) -> tuple[FlagDimension, ...]:
        return _flag_dimensions(self.tp_overlap_codes)

    def skeleton_dimensions(self) -> tuple[SkeletonDimension, ...]:
        quirk = ("; if dp > cap, batch = dp (calculon-2023 quirk)" if self.batch_is_dp_above_cap
                 else "; if dp > cap there is no batch and no mapping")
        return (
            SkeletonDimension("tp", f"1 .. {self.tp_max}", "divides N, hidden, feedforward and attn_heads",
                              "tensor parallelism: each weight matrix is split tp ways"),
            SkeletonDimension("pp", "1 .. blocks", "divides min(N/tp, num_blocks) and num_blocks",
                              "pipeline parallelism: the blocks are split into pp stages"),
            SkeletonDimension("dp", "N/(tp·pp)", "tp·pp·dp = N", "data parallelism: replicas of the pipeline"),
            SkeletonDimension("batch", "<= cap", "largest multiple of dp <= cap (the max batch)" + quirk,
                              "global batch, in sequences"),
            SkeletonDimension("interleaving", "divisors of blocks/pp", "1 when pp = 1, else divides num_blocks/pp",
                              "model chunks per pipeline stage (interleaved 1F1B)"),
            SkeletonDimension("microbatch", "divisors of batch/dp", "divides batch/dp; microbatch·seq_size divisible by tp",
                              "sequences per microbatch"),
        )

    def batch_for(self, dp: int, max_batch: int) -> int | None:
        """Global batch for `dp` replicas under the cap, or None when there is none."""
        if dp <= max_batch:
            return max_batch // dp * dp
        return dp if self.batch_is_dp_above_cap else None


SPACES: dict[str, Space] = {
    "full": Space(
        name="full", summary="Calculon's current enumeration: TP overlap none | ring | pipe, strict batch cap.",
        tp_max=256, tp_overlap_codes=(TP_OVERLAP_NONE, TP_OVERLAP_RING, TP_OVERLAP_PIPE), batch_is_dp_above_cap=False),
    "calculon-2023": Space(
        name="calculon-2023",
        summary="The space of the 2023 papers (reproduces 15,612,832 / 842,080): TP overlap on/off, batch = dp when dp > cap.",
        tp_max=256, tp_overlap_codes=(TP_OVERLAP_NONE, TP_OVERLAP_RING), batch_is_dp_above_cap=True),
}
DEFAULT_SPACE = "full"


ATTENTION_KERNELS = ("fused", "unfused")
"""How the attention core runs: one FlashAttention kernel, or four kernels through HBM."""


def get_space(name: str, *, attention: str = "fused") -> Space:
    """The preset called `name` with the attention kernel `attention`, or an InputError
    listing the presets."""
    if name not in SPACES:
        raise InputError(f"space {name!r} does not exist (choose from {', '.join(SPACES)})")
    if attention not in ATTENTION_KERNELS:
        raise InputError(f"attention {attention!r} does not exist (choose from {', '.join(ATTENTION_KERNELS)})")
    return replace(SPACES[name], fused_attention=attention == "fused")


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n, ascending (none for n < 1), by factorisation: instant for any
    n below 2^64 (solver.space.factor)."""
    return factor_divisors(n) if n >= 1 else ()


@dataclass(frozen=True)
class Skeleton:
    """One valid (tp, pp) split with its dp, global batch, and the valid interleavings and
    microbatch sizes; every flag combination is allowed on top of it."""

    tp: int
    pp: int
    dp: int
    batch: int
    interleavings: tuple[int, ...]
    microbatches: tuple[int, ...]

    @property
    def local_batch(self) -> int:
        return self.batch // self.dp


def skeletons(model: Model, num_gpus: int, max_batch: int, space: Space) -> list[Skeleton]:
    """Every valid (tp, pp) skeleton, in enumeration order (tp ascending, then pp ascending).
    Skeletons with no valid microbatch or batch are left out."""
    if num_gpus <= 0:
        raise InputError(f"gpus: {num_gpus} must be > 0")
    if max_batch <= 0:
        raise InputError(f"max batch: {max_batch} must be > 0")
    result = []
    for tp in divisors(num_gpus):
        if tp > space.tp_max or model.hidden % tp or model.attn_heads % tp or model.feedforward % tp:
            continue
        for pp in divisors(min(num_gpus // tp, model.num_blocks)):
            if model.num_blocks % pp or (num_gpus // tp) % pp:
                continue
            dp = num_gpus // (tp * pp)
            batch = space.batch_for(dp, max_batch)
            if batch is None:
                continue
            interleavings = (1,) if pp == 1 else divisors(model.num_blocks // pp)
            microbatches = tuple(m for m in divisors(batch // dp) if (m * model.seq_size) % tp == 0)
            if microbatches:
                result.append(Skeleton(tp, pp, dp, batch, interleavings, microbatches))
    return result


def facts(skeleton: Skeleton, system: System) -> dict[str, int]:
    """The skeleton facts conditions may test."""
    return {"tp": skeleton.tp, "pp": skeleton.pp, "dp": skeleton.dp, "offload": int(system.offload is not None)}


def iter_flag_combinations(space: Space, known: dict[str, int], num_networks: int) -> Iterator[tuple[int, ...]]:
    """Valid flag code tuples (in `space.flags` order), lexicographic in that order: built
    one flag at a time, each partial tuple extended by the codes its flag may take."""
    dims = space.flags
    position = {dim.name: i for i, dim in enumerate(dims)}
    combos: list[tuple[int, ...]] = [()]
    for dim in dims:
        domain = dim.domain(num_networks)
        if not all(c.holds(known) for c in dim.free_when if c.subject in known):
            combos = [combo + domain[:1] for combo in combos]
            continue
        on_flags = [(position[c.subject], c) for c in dim.free_when if c.subject not in known]
        combos = [combo + (code,)
                  for combo in combos
                  for code in (domain if all(c.holds_for(combo[i]) for i, c in on_flags) else domain[:1])]
    return iter(combos)


@lru_cache(maxsize=256)
def _flag_table_cached(space: Space, tp_gt1: bool, pp_gt1: bool, dp_gt1: bool, offload: bool,
                       num_networks: int) -> tuple[tuple[int, ...], ...]:
    known = {"tp": 1 + tp_gt1, "pp": 1 + pp_gt1, "dp": 1 + dp_gt1, "offload": int(offload)}
    return tuple(iter_flag_combinations(space, known, num_networks))


def flag_table(space: Space, skeleton: Skeleton, system: System) -> tuple[tuple[int, ...], ...]:
    """All valid flag combinations on a skeleton. Conditions only test tp, pp, dp against 1,
    so at most 8 tables per (space, system) exist; they are cached."""
    f = facts(skeleton, system)
    return _flag_table_cached(space, f["tp"] > 1, f["pp"] > 1, f["dp"] > 1, bool(f["offload"]), len(system.networks))
