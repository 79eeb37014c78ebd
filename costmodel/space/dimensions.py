"""The dimensions of a mapping, each declared once.

`DIMENSIONS` declares every axis of the mapping space, one `Dimension` each
(costmodel.space.dimension says what a declaration holds); `DEGREES` the parallel groups.

The Mapping schema (costmodel.inputs.mapping), the array encoding (costmodel.encoding), the
formulas' view (costmodel.evaluate), and in solver/ the space rules, count, enumeration,
CP-SAT variables, stores and reports all read `DIMENSIONS`. docs/mapping-space.md says how
to add one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

import costmodel.inputs.limits as limits
from costmodel.space.choices import CPComm, PipelineSchedule, Recompute, ShardingStage, TPComm, TPOverlap
from costmodel.space.degree_rules import (cp_fits, ep_fits, etp_default, etp_fits, interleaving_fits, pp_fits, seq_par_fits,
                                     shard_fits, tp_fits)
from costmodel.space.dimension import (BLOCK, MEMORY, NETWORK_CHECK, SURROGATE_AXIS, TIME_ONLY, Dimension, FitRule,
                                 Touches)


def subgroup_limit(group) -> int:
    """The largest power of two smaller than `group` that divides it (1 when none): the
    largest sub-group a space offers (the skeleton fact `dp_cp_pow2`)."""
    group = int(group)
    low = group & -group
    return max(1, low // 2 if low == group else low)
@dataclass(frozen=True)
class Degree:
    """One parallel degree of the ordered chain of groups: its name, the flag naming the
    network that carries its group, and the degrees whose product that group spans."""

    name: str
    net: str
    span: tuple[str, ...]
    in_split: bool = True
    """chosen by the split (tp, cp, ep, etp, pp); dp follows from the others and the GPU count"""
    limit: str | None = None
    """the Space field bounding it (`tp_max`), or None: bounded by the GPUs alone"""


DEGREES: tuple[Degree, ...] = (
    Degree("tp", "tp_net", ("tp",), limit="tp_max"),
    Degree("cp", "cp_net", ("tp", "cp"), limit="cp_max"),
    Degree("ep", "ep_net", ("etp", "ep")),
    Degree("etp", "etp_net", ("etp",), limit="tp_max"),
    Degree("pp", "pp_net", ("tp", "cp", "pp")),
    Degree("dp", "dp_net", ("tp", "cp", "pp", "dp"), in_split=False),
)
"""The parallel groups, innermost first. The dense groups nest: tp; tp·cp; tp·cp·pp;
tp·cp·pp·dp = N. Context parallelism sits next to tensor parallelism, as in Megatron-LM's
rank order tp-cp-ep-dp-pp (parallel_state.RankGenerator) and NeMo's recipes that keep tp·cp
inside an NVLink domain. The expert layers' groups are laid out by Megatron-LM's second,
expert rank generator (MoE parallel folding: megatron/core/parallel_state.py
`initialize_model_parallel`, `expert_decoder_rank_generator = RankGenerator(tp=
expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=expert_data_parallel_size,
pp=..., cp=1)`; Liu et al. 2025, arXiv 2504.14960) over the same tp·cp·dp GPUs of a pipeline
stage, expert tp (etp) innermost: an etp group is etp neighbouring GPUs, an ep group the
etp-strided GPUs of etp·ep neighbours, and the expert data-parallel group edp =
tp·cp·dp/(ep·etp) the rest. So the network carrying etp spans etp GPUs and the one carrying
ep spans etp·ep. NETWORK_GROUPS, GROUP_SPAN, SPLIT_DEGREES, SKELETON_FACTS and BlockKey are
derived from it."""
SPLIT_DEGREES: tuple[str, ...] = tuple(d.name for d in DEGREES if d.in_split)
"""The degrees a split chooses, in order: the (tp, cp, ep, etp, pp) of a skeleton and a block."""
GROUP_DEGREES: tuple[str, ...] = tuple(name for name in SPLIT_DEGREES if name != "pp")
"""The degrees one block's cost reads (a split's degrees but pp): (tp, cp, ep, etp)."""
DEGREE: dict[str, Degree] = {d.name: d for d in DEGREES}
CHAIN: tuple[str, ...] = DEGREES[-1].span
"""The degrees whose product is the GPU count (the outermost group's span: tp·cp·pp·dp = N);
the others (ep, etp) fold into a stage's GPUs and divide N without being factors of it."""


def data_parallel(num_gpus, degrees):
    """dp = N / the product of CHAIN's other degrees (tp·cp·pp): the GPUs the chain leaves.
    `degrees` maps a degree's name to its value (whole numbers, or numpy arrays of them as
    floats: the product is then taken as int64); a chain degree it does not hold is 1."""
    inner = math.prod(degrees.get(name, 1) for name in CHAIN if name != "dp")
    return num_gpus // (inner.astype(np.int64) if isinstance(inner, np.ndarray) else inner)


SKELETON_FACTS = (*(d.name for d in DEGREES), "dp_cp", "offload", "dp_cp_pow2")
"""What a flag's condition may test besides earlier flags: the split's degrees (tp, cp, ep,
etp, pp, dp, and dp_cp = dp·cp, the group gradients are reduced over; compared with 1) and
`offload` (1 when the system has an offload memory tier). `dp_cp_pow2` (subgroup_limit of
dp·cp) is read by no condition: it bounds a `subgroup` flag's codes."""


def skeleton_facts(degrees: dict, has_offload: bool) -> dict[str, int]:
    """The SKELETON_FACTS of a split: each degree of `degrees` (every name of DEGREES), dp·cp,
    offload, and dp·cp's largest offered sub-group."""
    dp_cp = degrees["dp"] * degrees["cp"]
    return {**{d.name: degrees[d.name] for d in DEGREES}, "dp_cp": dp_cp, "offload": int(has_offload),
            "dp_cp_pow2": subgroup_limit(dp_cp)}


@dataclass(frozen=True)
class Condition:
    """`subject op value`, e.g. dp > 1 or recompute != full. `subject` is a skeleton fact
    or the name of an earlier flag (compared by code)."""

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
        if (self.subject, self.op, self.value) == ("offload", ">", 0):
            return "the system has offload memory"
        shown = str(self.value)
        if self.subject in BY_NAME and BY_NAME[self.subject].choices is not None:
            shown = BY_NAME[self.subject].label_of(self.value)
        subject = "dp·cp" if self.subject == "dp_cp" else self.subject
        return f"{subject} {self.op} {shown}"



# ---- the rules any mapping must satisfy (costmodel.inputs.mapping.check_mapping_fits reads them) ----
def _network_exists(dim_name: str) -> FitRule:
    def fits(model, system, values) -> str | None:
        index = values[dim_name]
        if index >= len(system.networks):
            return (f"{BY_NAME[dim_name].field}: network {index} does not exist "
                    f"(system {system.name!r} has {len(system.networks)})")
        return None
    return fits


def _needs_offload(dim_name: str) -> FitRule:
    def fits(model, system, values) -> str | None:
        if values[dim_name] and system.offload is None:
            return f"{BY_NAME[dim_name].field}: system {system.name!r} has no offload memory (try --offload-gib)"
        return None
    return fits


_FULL = list(Recompute).index(Recompute.full)
_RS_AG = list(TPComm).index(TPComm.rs_ag)
_HAS_OFFLOAD = Condition("offload", ">", 0)

DIMENSIONS: tuple[Dimension, ...] = (
    # ---- the split and the batch, fixed by (tp, cp, ep, etp, pp) ----
    Dimension("tp", "tensor_par", "split", "tensor parallelism: each weight matrix is split tp ways",
              rule="1 .. tp_max; divides N, hidden, feedforward, attn_heads and kv_heads", fits=tp_fits,
              bound=limits.GPUS_SEARCH, touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK})),
    Dimension("cp", "context_par", "split", "context parallelism: the sequence is split over cp GPUs (ring "
              "attention, 2·cp load-balanced chunks)",
              rule="1 .. cp_max; divides N/tp; 2·cp divides seq_size", fits=cp_fits, bound=limits.GPUS_SEARCH,
              default=1, touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK})),
    Dimension("ep", "expert_par", "split", "expert parallelism: each MoE block's experts are split over ep GPUs "
              "of a stage's tp·cp·dp ones (MoE parallel folding; token all-to-all)",
              rule="1 .. experts; divides num_experts; ep·etp divides tp·cp·dp (1 for a dense model)",
              fits=ep_fits, bound=limits.GPUS_SEARCH, default=1,
              touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK})),
    Dimension("etp", "expert_tensor_par", "split", "expert tensor parallelism: each expert's width is split etp "
              "ways (Megatron-LM's --expert-tensor-parallel-size; a file's default is tp for an MoE model)",
              rule="1 .. tp_max; divides N and expert_feedforward; ep·etp divides tp·cp·dp (1 for a dense model)",
              fits=etp_fits, bound=limits.GPUS_SEARCH, default=etp_default,
              touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK})),
    Dimension("pp", "pipeline_par", "split", "pipeline parallelism: the blocks are split into pp stages",
              rule="1 .. blocks; divides N/(tp·cp) and num_blocks, or (full) pp > 2 divides num_blocks + 2: "
                   "the first and last stages one block lighter, or else (full) a short last chunk: chunks of "
                   "⌈num_blocks/(pp·il)⌉ blocks, the last one short", fits=pp_fits,
              bound=limits.GPUS_SEARCH, touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK})),
    Dimension("dp", "data_par", "split", "data parallelism: replicas of the pipeline",
              rule="N/(tp·cp·pp); tp·cp·pp·dp = N",
              bound=limits.GPUS_SEARCH, touches=frozenset({MEMORY, NETWORK_CHECK})),
    Dimension("batch", "batch_size", "split", "global batch, in sequences",
              rule="<= cap; largest multiple of dp <= cap (the max batch)", bound=limits.MAX_BATCH_SEARCH,
              touches=frozenset({MEMORY})),
    # ---- chosen given the split, independently of each other ----
    Dimension("interleaving", "pipeline_interleaving", "per_split", "model chunks per pipeline stage (interleaved 1F1B)",
              label="il", rule="divisors of a stage's share; 1 when pp = 1, else divides num_blocks/pp "
                               "(uneven stages: (num_blocks + 2)/pp; a short last chunk: pp·il chunks of "
                               "⌈num_blocks/(pp·il)⌉ blocks exceed num_blocks by at most one chunk)",
              fits=interleaving_fits, bound=limits.NUM_BLOCKS, default=1, touches=frozenset({MEMORY})),
    Dimension("microbatch", "microbatch_size", "per_split", "sequences per microbatch", label="mb",
              rule="divisors of batch/dp; divides batch/dp; microbatch·seq_size divisible by tp·cp", fits=seq_par_fits,
              bound=limits.MAX_BATCH_SEARCH, touches=frozenset({BLOCK, MEMORY})),
    # ---- flags, in enumeration order; conditions read only skeleton facts and earlier flags ----
    Dimension("recompute", "activation_recompute", "choice", "activation recomputation: full (store block inputs "
              "only), attn_only (recompute the attention core), none", choices=Recompute,
              touches=frozenset({BLOCK, MEMORY, SURROGATE_AXIS})),
    Dimension("tp_comm", "tensor_par_comm_type", "choice", label="tp-comm", meaning="TP communication: all-reduce, p2p reduce-scatter/"
              "all-gather, or rs_ag = sequence parallelism", choices=TPComm,
              touches=frozenset({BLOCK, MEMORY, SURROGATE_AXIS})),
    Dimension("tp_overlap", "tensor_par_overlap", "choice", label="tp-overlap", meaning="overlap TP communication with the neighbouring matrix "
              "multiply", choices=TPOverlap, free_when=(Condition("tp", ">", 1),),
              touches=frozenset({BLOCK, TIME_ONLY, SURROGATE_AXIS})),
    Dimension("cp_comm", "context_par_comm", "choice", label="cp-comm", meaning="context-parallel communication "
              "(Megatron-Core's --cp-comm-type): p2p K/V ring overlapped with the core, all_gather of K/V before "
              "the core (Llama 3), or a2a re-sharding sequence to heads (DeepSpeed-Ulysses)",
              choices=CPComm, free_when=(Condition("cp", ">", 1),),
              touches=frozenset({BLOCK, MEMORY, NETWORK_CHECK, SURROGATE_AXIS})),
    # (a2a's rule, cp divides kv_heads/tp, is a feasibility check of the exact model,
    # costmodel.evaluate.cp_comm_heads_fit, as a network's span is: a flag's freedom reads
    # skeleton facts only as `> 1`, so a `fits` rule here would break the product count)
    Dimension("zero", "sharding_stage", "choice", label="zero", meaning="ZeRO sharding stage over the dp group: 0 "
              "replicated, 1 optimizer state (distributed optimizer), 2 + gradients, 3 + parameters (FSDP)",
              choices=ShardingStage, free_when=(Condition("dp_cp", ">", 1),), touches=frozenset({MEMORY})),
    Dimension("shard", "sharding_group", "subgroup", label="shard", meaning="hybrid sharding (HSDP): ZeRO shards "
              "over groups of this many inner GPUs of dp·cp and replicates across them; all = dp·cp (file default)",
              free_when=(Condition("zero", "!=", 0),), fits=shard_fits, bound=limits.GPUS_SEARCH,
              touches=frozenset({MEMORY})),
    Dimension("seq_par_ag_redo", "seq_par_ag_redo", "switch", label="ag-redo", meaning="redo the sequence-parallel all-gather in backward "
              "instead of storing its output", free_when=(Condition("tp_comm", "==", _RS_AG), Condition("recompute", "!=", _FULL)),
              touches=frozenset({BLOCK, MEMORY, SURROGATE_AXIS})),
    Dimension("dp_overlap", "data_par_overlap", "switch", label="dp-overlap", meaning="overlap the DP gradient reduction "
              "(over dp·cp) with the backward pass", free_when=(Condition("dp_cp", ">", 1),),
              touches=frozenset({TIME_ONLY})),
    Dimension("weight_offload", "weight_offload", "switch", label="w-off", meaning="keep weights in offload memory, prefetching each block",
              free_when=(_HAS_OFFLOAD,), fits=_needs_offload("weight_offload"),
              touches=frozenset({BLOCK, MEMORY, SURROGATE_AXIS})),
    Dimension("activations_offload", "activations_offload", "switch", label="a-off", meaning="keep stored activations in offload memory",
              free_when=(_HAS_OFFLOAD, Condition("recompute", "!=", _FULL)),
              fits=_needs_offload("activations_offload"), touches=frozenset({BLOCK, MEMORY, SURROGATE_AXIS})),
    Dimension("optimizer_offload", "optimizer_offload", "switch", label="o-off", meaning="keep optimizer state in offload memory; the step "
              "streams it", free_when=(_HAS_OFFLOAD,), fits=_needs_offload("optimizer_offload"),
              touches=frozenset({MEMORY})),
    Dimension("sched", "pipeline_schedule", "choice", label="sched", meaning="pipeline schedule: 1f1b (interleaved when "
              "interleaving > 1) or zb-h1 (weight-gradient passes fill the bubble; Qi et al. 2024)",
              choices=PipelineSchedule, free_when=(Condition("pp", ">", 1),), touches=frozenset({MEMORY})),
    Dimension("tp_net", "tensor_par_net", "network", "network index carrying TP traffic",
              free_when=(Condition("tp", ">", 1),), fits=_network_exists("tp_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({BLOCK, TIME_ONLY, NETWORK_CHECK, SURROGATE_AXIS})),
    Dimension("cp_net", "context_par_net", "network", "network index carrying CP traffic (the K/V ring)",
              free_when=(Condition("cp", ">", 1),), fits=_network_exists("cp_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({BLOCK, TIME_ONLY, NETWORK_CHECK, SURROGATE_AXIS})),
    Dimension("ep_net", "expert_par_net", "network", "network index carrying EP traffic (the token all-to-all)",
              free_when=(Condition("ep", ">", 1),), fits=_network_exists("ep_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({BLOCK, TIME_ONLY, NETWORK_CHECK})),
    Dimension("etp_net", "expert_tensor_par_net", "network", "network index carrying expert TP traffic (the "
              "routed rows' all-gather and reduce-scatter)",
              free_when=(Condition("etp", ">", 1),), fits=_network_exists("etp_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({BLOCK, TIME_ONLY, NETWORK_CHECK})),
    Dimension("pp_net", "pipeline_par_net", "network", "network index carrying PP traffic",
              free_when=(Condition("pp", ">", 1),), fits=_network_exists("pp_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({TIME_ONLY, NETWORK_CHECK})),
    Dimension("dp_net", "data_par_net", "network", "network index carrying DP traffic",
              free_when=(Condition("dp", ">", 1),), fits=_network_exists("dp_net"), bound=limits.NETWORK_INDEX,
              touches=frozenset({TIME_ONLY, NETWORK_CHECK})),
)
BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}
FLAGS: tuple[Dimension, ...] = tuple(d for d in DIMENSIONS if d.is_flag)



def touching(effect: Touches, *, without: Touches | None = None) -> tuple[str, ...]:
    """The names of the dimensions that state `effect` (and not `without`), in declaration order."""
    return tuple(d.name for d in DIMENSIONS if effect in d.touches and (without is None or without not in d.touches))


NETWORK_GROUPS: tuple[tuple[str, str], ...] = tuple((d.name, d.net) for d in DEGREES)
"""Parallel groups, innermost first, each with the flag naming its network (DEGREES)."""
GROUP_SPAN: dict[str, tuple[str, ...]] = {d.name: d.span for d in DEGREES}
"""Which degrees' product each group spans (DEGREES)."""
SPLIT_TEXT = f"({', '.join(SPLIT_DEGREES)})"
"""The split's degrees as people read them in messages: "(tp, cp, ep, etp, pp)"."""
SPANS_TEXT = ", ".join("·".join(d.span) for d in DEGREES if "dp" not in d.span) + " and all GPUs"
"""The GPUs each group spans, as people read them: "tp, tp·cp, etp·ep, etp, tp·cp·pp and all GPUs"."""


class BlockKey(NamedTuple("BlockKeyFields", [*((name, int) for name in SPLIT_DEGREES), ("interleaving", int),
                                              ("microbatch", int)])):
    """A block of the search: the split's degrees (SPLIT_DEGREES: tp, cp, ep, etp, pp), the
    interleaving and the microbatch; every flag combination lies inside it."""

    __slots__ = ()

    @property
    def split(self) -> tuple[int, ...]:
        """The split's degrees, the key of its skeleton."""
        return tuple(self[:len(SPLIT_DEGREES)])


def _check_declaration() -> None:
    """Conditions may only read skeleton facts (as `> 1`, or offload) and earlier flags, so
    flags can be chosen in declaration order and flag tables cached per (tp > 1, cp > 1,
    ep > 1, etp > 1, pp > 1, dp > 1, dp·cp > 1)."""
    if SPLIT_DEGREES[-1] != "pp" or GROUP_DEGREES != SPLIT_DEGREES[:-1]:
        raise ValueError("the split's degrees end with pp: a block's group is the split less pp")
    for dim in DIMENSIONS:
        if len(dim.touches & {MEMORY, TIME_ONLY}) != 1:
            raise ValueError(f"{dim.name}: touches must state memory or time_only, exactly one")
    for degree in DEGREES:
        for name in (degree.name, degree.net):
            if NETWORK_CHECK not in BY_NAME[name].touches:
                raise ValueError(f"{name}: the network checks read every degree and its network (network_checks)")
    seen: set[str] = set()
    for dim in FLAGS:
        for cond in dim.free_when:
            if cond.subject in (*(d.name for d in DEGREES), "dp_cp") and (cond.op, cond.value) != (">", 1):
                raise ValueError(f"{dim.name}: skeleton conditions must read '{cond.subject} > 1'")
            if cond.subject not in SKELETON_FACTS and cond.subject not in seen:
                raise ValueError(f"{dim.name}: condition on {cond.subject!r}, which is not an earlier flag")
        seen.add(dim.name)


_check_declaration()
