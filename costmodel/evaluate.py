"""Evaluate mappings: one at a time with an explanation, or many at once as arrays.

    evaluate(model, system, mapping)                  -> Evaluation (every term named)
    evaluate_arrays(model, system, arrays, datatype)  -> ArrayEvaluation (numpy columns)

Both run the same formulas (costmodel.terms.iteration) on different backends (costmodel.ops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from costmodel.terms.context import Context
from costmodel.space.dimensions import (BLOCK, CHAIN, DIMENSIONS, GROUP_SPAN, NETWORK_CHECK, NETWORK_GROUPS, TIME_ONLY,
                                  touching)
from costmodel.encoding import MappingArrays
from costmodel.inputs.kernels import Kernels
from costmodel.terms.block_terms import KindBlocks, kind_block_terms
from costmodel.terms.stage_costs import without_layers
from costmodel.terms.iteration import (IterationTerms, MemoryTerms, TimeTerms, iteration_terms, iteration_time_s,
                                       stage_memory_terms)
from costmodel.inputs.mapping import Mapping, check_mapping_fits, model_with_attention_type
from costmodel.inputs.model import Model, ModelFlops
from costmodel.ops import ArrayOps, ScalarOps, distinct_rows, spread
from costmodel.terms.published_flops import Throughput, throughput
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB


def group_spans(m) -> tuple[tuple[str, object, object, object], ...]:
    """(name, degree, GPUs spanned, network index) of each parallel group of `m` (a mapping's
    formula view: scalars or arrays)."""
    out = []
    for degree_name, net_name in NETWORK_GROUPS:
        span = 1.0
        for factor in GROUP_SPAN[degree_name]:
            span = span * getattr(m, factor)
        out.append((degree_name, getattr(m, degree_name), span, getattr(m, net_name)))
    return tuple(out)


def network_checks(c: Context, m, xp) -> dict:
    """Each parallel group of more than one GPU must fit in the network that carries it (a
    group of one fits any): the GPUs a group spans are its degrees' product (GROUP_SPAN, from
    costmodel.space.dimensions.DEGREES): tp for TP, tp·cp for CP, etp·ep for EP, etp for expert TP,
    tp·cp·pp for PP, tp·cp·pp·dp (all GPUs) for DP; one check `<degree>_network` each. A
    network marked must_be_filled, when a group of more than one GPU uses it, must be spanned
    whole by the widest such group on it (`network<k>_filled`)."""
    spans = group_spans(m)
    checks = {}
    for name, degree, span, net in spans:
        checks[f"{name}_network"] = (degree == 1) | (span <= xp.pick(c.net.size, net))
    for k, must_fill in enumerate(c.net.must_fill):
        if not must_fill:
            continue
        widest = 0.0
        for _, degree, span, net in spans:
            widest = xp.maximum(widest, xp.where((degree > 1) & (net == k), span, 0.0))
        checks[f"network{k}_filled"] = (widest == 0.0) | (widest >= c.net.size[k])
    return checks


def cp_comm_heads_fit(c: Context, m):
    """Ulysses (cp_comm = a2a) gives each cp rank whole key/value heads of its tp rank's share:
    cp divides kv_heads/tp (TE AttnFuncWithCPAndQKVOA2A: "The number of heads needs to be
    divisible by CP size"). A feasibility check, as a network's span is, not a `fits` rule: the
    space offers a2a wherever cp > 1 and the exact model refuses the mappings it cannot run."""
    return np.logical_not(m.cp_comm_a2a) | (m.cp == 1) | (c.model.kv_heads % (m.tp * m.cp) == 0)


STRUCTURE_DIMENSIONS = touching(NETWORK_CHECK)
"""The dimensions the structural checks (`structural_checks`) read (the declaration's
`network_check`): every degree, the network carrying it, and the CP communication (Ulysses'
heads split)."""


def structural_checks(c: Context, m, xp) -> dict:
    """The checks that read the mapping alone, no term of it: each group fits the network
    that carries it, and Ulysses' heads split."""
    checks = network_checks(c, m, xp)
    checks["cp_comm_heads"] = cp_comm_heads_fit(c, m)
    return checks


def _feasibility(c: Context, m, terms: IterationTerms, xp) -> dict:
    checks = structural_checks(c, m, xp)
    checks["hbm_capacity"] = terms.hbm_bytes <= c.memory.hbm_capacity_bytes
    checks["offload_capacity"] = terms.offload_bytes <= c.memory.offload_capacity_bytes
    return checks


# ---------------------------------------------------------------- one mapping, explained
@dataclass(frozen=True)
class Evaluation:
    """The exact model's verdict on one mapping, term by term (SI units)."""

    mapping: Mapping
    feasible: bool
    reasons: tuple[str, ...]        # why it is infeasible; empty when feasible
    iteration_time_s: float
    sample_rate: float              # sequences per second
    mfu: float                      # model FLOP (no recompute) / (time · GPUs · matrix peak)
    hfu: float                      # hardware FLOP (with recompute) / same
    time: TimeTerms                 # breakdown summing to iteration_time_s
    memory: MemoryTerms             # per GPU of the first stage
    hbm_bytes: float
    offload_bytes: float
    offload_bytes_per_s_needed: float = field(default=0.0)
    flops: ModelFlops | None = None  # the MFU numerator per token, term by term
    throughput: Throughput | None = None  # tokens/s and model TFLOP/s per GPU as published tables count them

    def to_dict(self) -> dict:
        """JSON-ready, SI units, with the fields the CLI contract names."""
        return {
            "feasible": self.feasible,
            "reasons": list(self.reasons),
            "iteration_time_s": self.iteration_time_s,
            "sample_rate": self.sample_rate,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "time": self.time.as_dict(),
            "memory": {"hbm_bytes": self.hbm_bytes, "offload_bytes": self.offload_bytes, **self.memory.as_dict()},
            "offload_bytes_per_s_needed": self.offload_bytes_per_s_needed,
            "model_flops_per_token": None if self.flops is None else {
                "matrix": self.flops.matrix_per_token, "attention": self.flops.attention_per_token,
                "total": self.flops.per_token, "attention_halved_by_causal_mask": True},
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "mapping": self.mapping.model_dump(mode="json"),
        }


BLOCK_DIMENSIONS = touching(BLOCK)
"""The dimensions a block's terms (costmodel.terms.block_terms) read (the declaration's
`block`): mappings equal in these share
one block. The view block_terms gets holds nothing else, so a formula that came to read
another dimension fails loudly instead of being shared wrongly."""


TIME_ONLY_DIMENSIONS = touching(TIME_ONLY)
"""Dimensions that change a mapping's time, never its HBM or offload bytes (the declaration's
`time_only`: what overlaps
and which network a group's traffic takes): mappings equal in every other dimension hold
the same memory, so the capacity checks are decided once for all of them (`memory_in_context`;
tests/conftest.py assert_block_floors_below_exact checks it on every block of several spaces)."""


def structure_fits(c: Context, arrays: MappingArrays) -> np.ndarray:
    """Whether each mapping passes every structural check (`structural_checks`)."""
    return np.logical_and.reduce(list(structural_checks(c, array_fields(arrays), ArrayOps).values()))


# How each dimension appears in the formulas' view, worked out once from the declaration.
_VIEW = tuple((dim.name, dim.field, dim.kind,
               tuple(f"{dim.name}_{member.value}".replace("-", "_") for member in dim.choices)
               if dim.kind == "choice" else ())
              for dim in DIMENSIONS)
_CODE_OF = {dim.name: dim.code_of for dim in DIMENSIONS}
_BLOCK_VIEW_NAMES = frozenset(
    [view_name for name, _, kind, predicates in _VIEW if name in BLOCK_DIMENSIONS
     for view_name in (predicates if kind == "choice" else (name,))]
    + ["seq_par", "offload_blocks", "recompute_blocks", "recompute_modules", "first_stage_blocks",
       "last_stage_blocks"])
"""What block_terms sees of a mapping: BLOCK_DIMENSIONS as the formulas' view names them, and
the derived and per-file names the view always holds (formula_view)."""


def formula_view(codes: dict, as_float, as_index) -> SimpleNamespace:
    """The formulas' view of one mapping or many (`codes`: each dimension's code by short
    name): whole numbers as floats, network indices as indices, switches as Booleans, and
    for each choice one Boolean per member, `<dimension>_<member>` (`recompute_full`,
    `tp_comm_rs_ag`, `tp_overlap_ring`, `zero_3`, `sched_zb_h1`: a '-' in a value reads '_'). Two derived names: `num_procs` = tp·cp·pp·dp and
    `seq_par` = tp_comm_rs_ag (sequence parallelism). `first_stage_blocks` and `last_stage_blocks`
    are None: the stages' blocks follow pp by the layout rule (costmodel.space.layout); one
    mapping's view may state them (`_scalar_fields`)."""
    view = {}
    for name, _, kind, predicates in _VIEW:
        value = codes[name]
        if kind == "choice":
            for code, predicate in enumerate(predicates):
                view[predicate] = value == code
        elif kind == "network":
            view[name] = as_index(value)
        elif kind == "switch":
            view[name] = value
        else:                               # numbers and a subgroup's size (0: the whole group)
            view[name] = as_float(value)
    view["num_procs"] = math.prod(view[name] for name in CHAIN)
    for dim in DIMENSIONS:       # a subgroup's code 0 is its whole group (SUBGROUP_CODES): dp·cp
        if dim.kind == "subgroup":
            view[dim.name] = view[dim.name] + (view[dim.name] == 0) * view["dp"] * view["cp"]
    view["seq_par"] = view["tp_comm_rs_ag"]
    view["first_stage_blocks"] = view["last_stage_blocks"] = None
    # The memory features one mapping file may state (costmodel.terms.memory_features); None and
    # False are the searched spaces' costing.
    view["offload_blocks"] = view["recompute_blocks"] = view["recompute_modules"] = None
    view["megatron_fsdp"] = False
    return SimpleNamespace(**view)


def _scalar_fields(mapping: Mapping, moe: bool = False) -> SimpleNamespace:
    """One mapping's view, with the stages' blocks and the memory features its file states
    (None: pp's rule, and the dimensions' costing); an unstated expert tensor parallelism reads
    as the model's default (tp with `moe`, else 1)."""
    mapping = mapping.with_model_defaults(moe)
    view = formula_view({name: _CODE_OF[name](getattr(mapping, field)) for name, field, _, _ in _VIEW}, float, int)
    view.first_stage_blocks = mapping.pipeline_first_stage_blocks
    view.last_stage_blocks = mapping.pipeline_last_stage_blocks
    view.offload_blocks = mapping.activation_offload_blocks
    view.recompute_blocks = mapping.recompute_blocks
    view.recompute_modules = None if mapping.recompute_modules is None else frozenset(mapping.recompute_modules)
    view.megatron_fsdp = mapping.megatron_fsdp
    return view


def _reasons(checks: dict, terms: IterationTerms, c: Context, m) -> tuple[str, ...]:
    reasons = []
    for name, degree, span, net in group_spans(m):
        if not checks[f"{name}_network"]:
            reasons.append(f"network: a {name} group spans {span:g} GPUs > network {net} size {c.net.size[net]:g}")
    for key, ok in checks.items():
        if key.endswith("_filled") and not ok:
            k = int(key.removeprefix("network").removesuffix("_filled"))
            reasons.append(f"network: network {k} must be filled ({c.net.size[k]:g} GPUs) by the group using it")
    if not checks["cp_comm_heads"]:
        reasons.append(f"cp_comm: a2a needs kv_heads({c.model.kv_heads:g})/tensor_par({m.tp:g}) divisible by "
                       f"context_par({m.cp:g}): all-to-all gives each cp rank whole heads")
    if not checks["hbm_capacity"]:
        reasons.append(f"hbm: needs {terms.hbm_bytes / GiB:.1f} GiB > {c.memory.hbm_capacity_bytes / GiB:.1f} GiB")
    if not checks["offload_capacity"]:
        reasons.append(f"offload: needs {terms.offload_bytes / GiB:.1f} GiB > "
                       f"{c.memory.offload_capacity_bytes / GiB:.1f} GiB")
    return tuple(reasons)


_CONTEXTS: dict[tuple, tuple[Model, System, Context]] = {}


def _context_for(model: Model, system: System, mapping: Mapping) -> Context:
    """The problem constants, built once per (model, system, datatype, ...) object seen
    recently: evaluating many mappings of one problem one by one stays cheap."""
    key = (id(model), id(system), mapping.datatype, mapping.kernels)
    hit = _CONTEXTS.get(key)
    if hit is not None and hit[0] is model and hit[1] is system:
        return hit[2]
    c = Context.build(model, system, mapping.datatype, mapping.kernels)
    if len(_CONTEXTS) >= 16:
        _CONTEXTS.clear()
    _CONTEXTS[key] = (model, system, c)
    return c


def evaluate(model: Model, system: System, mapping: Mapping) -> Evaluation:
    """Time and memory of one mapping, with every term named. Raises InputError if the
    mapping does not fit the model or system (divisibility, unknown network, datatype), or
    states an attention_type the model contradicts."""
    model = model_with_attention_type(model, mapping)
    mapping = mapping.with_model_defaults(bool(model.num_experts))
    check_mapping_fits(model, system, mapping)
    return evaluate_in_context(_context_for(model, system, mapping), mapping)


def evaluate_in_context(c: Context, mapping: Mapping) -> Evaluation:
    """`evaluate` with the problem constants already built (for repeated calls)."""
    mapping = mapping.with_model_defaults(c.model.experts > 0)
    m = _scalar_fields(mapping)
    terms = iteration_terms(c, m, ScalarOps)
    checks = _feasibility(c, m, terms, ScalarOps)
    reasons = _reasons(checks, terms, c, m)
    return Evaluation(
        mapping=mapping, feasible=not reasons, reasons=reasons,
        iteration_time_s=terms.iteration_s, sample_rate=terms.sample_rate, mfu=terms.mfu, hfu=terms.hfu,
        time=TimeTerms.of(terms), memory=MemoryTerms.of(terms),
        hbm_bytes=terms.hbm_bytes, offload_bytes=terms.offload_bytes,
        offload_bytes_per_s_needed=terms.offload_bytes_per_s_needed, flops=c.model.model_flops,
        throughput=throughput(c, mapping.tp, mapping.batch_size, mapping.num_procs, terms.iteration_s,
                              mapping.datatype.value),
    )


# ---------------------------------------------------------------- many mappings at once
@dataclass(frozen=True)
class ArrayEvaluation:
    """The exact model over N mappings: each attribute is a numpy array of length N."""

    iteration_time_s: np.ndarray
    feasible: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    sample_rate: np.ndarray
    hbm_bytes: np.ndarray
    offload_bytes: np.ndarray
    weights_bytes: np.ndarray
    weight_grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    terms: IterationTerms           # every named term, as in Evaluation (arrays)
    checks: dict[str, np.ndarray]   # every feasibility check, True where it passes


def array_fields(arrays: MappingArrays) -> SimpleNamespace:
    """The formulas' view of many mappings (see `formula_view`)."""
    return formula_view(arrays.columns, lambda a: a.astype(np.float64), lambda a: a.astype(np.intp))


def evaluate_arrays(model: Model, system: System, arrays: MappingArrays, datatype: Datatype,
                    kernels: Kernels = Kernels()) -> ArrayEvaluation:
    """Score every mapping in `arrays` (all valid for `model` on the same GPU count)."""
    c = Context.build(model, system, datatype, kernels)
    return evaluate_arrays_in_context(c, arrays)




def distinct_block_terms(c: Context, arrays: MappingArrays, memo: dict | None = None) -> KindBlocks:
    """kind_block_terms (each block kind's terms and their mean, without their layer records:
    stage_costs.without_layers) of every mapping in `arrays`, computed once per distinct
    combination of BLOCK_DIMENSIONS and spread back: a block of the search holds thousands of mappings
    (every ZeRO stage, schedule, DP network...) and a few dozen distinct blocks. `memo`:
    terms already computed in context `c`, by their distinct combinations (searches of one
    problem at several GPU counts meet the same blocks)."""
    first, inverse, identity = distinct_rows([arrays.columns[name] for name in BLOCK_DIMENSIONS])
    terms = None if memo is None else memo.get(identity)
    if terms is None:
        view = vars(array_fields(arrays.take(first)))
        terms = without_layers(kind_block_terms(c, SimpleNamespace(**{name: value for name, value in view.items()
                                                                     if name in _BLOCK_VIEW_NAMES}), ArrayOps,
                                                  with_mtp=True))
        if memo is not None:
            memo[identity] = terms
    return spread(terms, inverse, len(first))


def memory_in_context(c: Context, arrays: MappingArrays, block_memo: dict | None = None) -> tuple:
    """(HBM bytes, offload bytes) of each mapping from the memory terms alone
    (costmodel.terms.iteration.stage_memory_terms): evaluate_arrays_in_context's `hbm_bytes` and
    `offload_bytes`, the same sums on the same parts."""
    mem = stage_memory_terms(c, array_fields(arrays), ArrayOps, distinct_block_terms(c, arrays, block_memo))
    return mem.hbm_bytes, mem.offload_bytes


def capacity_fits(c: Context, hbm_bytes, offload_bytes):
    """The exact model's capacity checks (`hbm_capacity` and `offload_capacity`) of these bytes."""
    return (hbm_bytes <= c.memory.hbm_capacity_bytes) & (offload_bytes <= c.memory.offload_capacity_bytes)


def iteration_time_in_context(c: Context, arrays: MappingArrays, block_memo: dict | None = None) -> np.ndarray:
    """Each mapping's exact iteration time (s), evaluate_arrays_in_context's `iteration_time_s`,
    without the memory terms and the checks (costmodel.terms.iteration.iteration_time_s): what
    a search scores once it has decided capacity and structure per class of mappings."""
    m = array_fields(arrays)
    seconds = iteration_time_s(c, m, ArrayOps, distinct_block_terms(c, arrays, block_memo))
    return np.broadcast_to(seconds, (len(arrays),))


def evaluate_arrays_in_context(c: Context, arrays: MappingArrays, block_memo: dict | None = None) -> ArrayEvaluation:
    """evaluate_arrays in a built context; `block_memo`: see distinct_block_terms."""
    m = array_fields(arrays)
    terms = iteration_terms(c, m, ArrayOps, distinct_block_terms(c, arrays, block_memo))
    checks = _feasibility(c, m, terms, ArrayOps)
    feasible = np.logical_and.reduce(list(checks.values()))
    return ArrayEvaluation(
        iteration_time_s=terms.iteration_s, feasible=feasible, mfu=terms.mfu, hfu=terms.hfu,
        sample_rate=terms.sample_rate, hbm_bytes=terms.hbm_bytes, offload_bytes=terms.offload_bytes,
        weights_bytes=terms.weights_bytes, weight_grads_bytes=terms.weight_grads_bytes,
        optimizer_bytes=terms.optimizer_bytes, activations_bytes=terms.activations_bytes,
        terms=terms, checks=checks,
    )
