"""A measured run as this tool's inputs: the nearest `Mapping` and the datatype, with every
setting the cost model cannot yet express named.

A run states its mapping in the framework's words; a `Mapping` has fewer. What does not map
one to one is mapped to the nearest expressible setting, and the gap is listed per run
("not expressible: ...") so a reader sees why a prediction may miss:

| the run | the mapping | gap listed |
| --- | --- | --- |
| its precision recipe | that recipe (costmodel.precision), datatype bfloat16, with its FP8/FP4 weight all-gather and BF16 first/last blocks as the run states them | — |
| Megatron-FSDP | ZeRO stage 3 (parameters all-gathered per block) | yes |
| activation offload of N blocks | every block's activations offloaded when the system has offload memory, else none | yes |
| full recompute of N blocks per chunk | full when N is at least half a chunk's blocks, else none | yes, unless N covers the chunk |
| selective recompute | attn_only when the modules are the attention core alone, else none | yes, unless core_attn alone |
| CUDA graphs | the problem's `cuda_graphs` (launch gaps removed where graphed) | — |
| the loss (fused or eager cross-entropy) | the problem's `fused_cross_entropy` | — |
| a pipeline layout, an unoverlapped parameter all-gather | not modelled | yes |
| sequence parallelism | tp_comm rs_ag (else ar); the all-gather redone in backward (Megatron-LM keeps the sharded input) | — |
| TP communication overlap | tp_overlap ring (tp > 1) | — |

Each parallel group runs on the innermost network that spans it (NVLink within a domain,
InfiniBand beyond), as NCCL would place it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ValidationError

from costmodel.choices import Recompute, TPComm, TPOverlap
from costmodel.dimensions import BY_NAME, GROUP_SPAN, NETWORK_GROUPS
from costmodel.errors import InputError
from costmodel.load import describe_validation_error
from costmodel.mapping import Mapping
from costmodel.model import Model
from costmodel.runs import Precision, Run
from costmodel.system import Datatype, System

__all__ = ["MappedRun", "datatype_for", "map_run", "network_for_span"]


@dataclass(frozen=True)
class MappedRun:
    """A run as the cost model takes it: the mapping, and what it could not say."""

    mapping: Mapping
    datatype: Datatype
    not_expressible: tuple[str, ...]


def datatype_for(precision: Precision) -> Datatype:
    """The datatype of a run's mapping: bfloat16, the high-precision type of every recipe; the
    recipe itself (the mapping's `precision`) says what is quantized."""
    return Datatype.bfloat16


def network_for_span(system: System, span: int) -> int:
    """The innermost network spanning `span` GPUs (the outermost when none does: the mapping is
    then infeasible and evaluate says why)."""
    for index, network in enumerate(system.networks):
        if network.size >= span:
            return index
    return len(system.networks) - 1


def _recompute(run: Run, model: Model, gaps: list[str]) -> Recompute:
    if run.recompute == "none":
        return Recompute.none
    if run.recompute == "selective":
        if set(run.recompute_modules) == {"core_attn"}:
            return Recompute.attn_only
        gaps.append(f"selective recompute of {', '.join(run.recompute_modules) or 'no modules'}: costed as none "
                    f"(only the attention core alone is expressible, as attn_only)")
        return Recompute.none
    chunk = model.num_blocks / (run.pp * run.interleaving)
    if run.recompute_blocks is None or run.recompute_blocks >= chunk:
        return Recompute.full
    nearest = Recompute.full if 2 * run.recompute_blocks >= chunk else Recompute.none
    gaps.append(f"full recompute of {run.recompute_blocks} of every {chunk:g} blocks (recompute_num_layers): costed "
                f"as {nearest.value}")
    return nearest


def _activation_offload(run: Run, model: Model, system: System, recompute: Recompute, gaps: list[str]) -> bool:
    if not run.activation_offload_blocks:
        return False
    stage = model.num_blocks / run.pp
    what = f"activation offload of {run.activation_offload_blocks} of {stage:g} blocks per stage"
    if system.offload is None:
        gaps.append(f"{what}: system {system.name!r} has no offload memory, costed as none")
        return False
    if recompute is Recompute.full:
        gaps.append(f"{what}: costed as none (full recompute stores only block inputs)")
        return False
    if run.activation_offload_blocks < stage:
        gaps.append(f"{what}: costed as every block's activations offloaded")
    return True


def _other_gaps(run: Run, gaps: list[str]) -> None:
    if run.megatron_fsdp:
        gaps.append("Megatron-FSDP: costed as ZeRO stage 3 (its double buffer and bucketed prefetch not modelled)")
    if run.pipeline_layout is not None:
        gaps.append(f"pipeline layout {run.pipeline_layout!r}: costed with the layout rule")
    if not run.param_gather_overlap and run.dp * run.cp > 1:
        gaps.append("parameter all-gather not overlapped: costed as overlapped with the gradient reduction")


def _expert_degrees(run: Run, model: Model, gaps: list[str]) -> tuple[int, int]:
    """(ep, etp) as the run ran them: its own etp, else Megatron-LM's default (tp: a gap when
    that is a guess that matters, tp > 1); both 1 for a dense model."""
    if not model.num_experts:
        return 1, 1
    if run.etp is not None:
        return run.ep, run.etp
    if run.tp > 1:
        gaps.append(f"expert tensor parallelism not stated: costed as tp ({run.tp}), Megatron-LM's default")
    return run.ep, run.tp


def map_run(run: Run, model: Model, system: System) -> MappedRun:
    """The mapping nearest to what `run` ran (model and system already loaded), its datatype,
    and the gaps. An InputError names the run when no mapping can say it (e.g. tp does not
    divide the heads)."""
    gaps: list[str] = []
    recompute = _recompute(run, model, gaps)
    offload = _activation_offload(run, model, system, recompute, gaps)
    _other_gaps(run, gaps)
    seq_par = run.uses_sequence_parallel and run.tp > 1
    replicas = run.dp * run.cp
    ep, etp = _expert_degrees(run, model, gaps)
    degrees = {"tp": run.tp, "cp": run.cp, "ep": ep, "etp": etp, "pp": run.pp, "dp": run.dp}
    spans = {BY_NAME[net].field: math.prod(degrees[factor] for factor in GROUP_SPAN[name])
             for name, net in NETWORK_GROUPS}
    fields = {
        "num_procs": run.num_gpus, "tensor_par": run.tp, "context_par": run.cp, "expert_par": ep,
        "expert_tensor_par": etp,
        "pipeline_par": run.pp, "data_par": run.dp, "batch_size": run.global_batch,
        "microbatch_size": run.microbatch, "pipeline_interleaving": run.interleaving,
        "datatype": datatype_for(run.precision), "fused_activation": run.fused_activation,
        "precision": run.precision,
        "low_precision_param_gather": run.low_precision_param_gather if run.precision is not Precision.bf16 else None,
        "bf16_first_last_blocks": run.bf16_first_last_blocks,
        "cuda_graphs": run.cuda_graphs, "fused_cross_entropy": run.fused_cross_entropy,
        "activation_recompute": recompute,
        "tensor_par_comm_type": TPComm.rs_ag if seq_par else TPComm.ar,
        "tensor_par_overlap": TPOverlap.ring if run.tp_comm_overlap and run.tp > 1 else TPOverlap.none,
        "seq_par_ag_redo": seq_par and recompute is not Recompute.full,
        "sharding_stage": run.sharding_stage if replicas > 1 else 0,
        "data_par_overlap": run.dp_overlap and replicas > 1,
        "activations_offload": offload,
        **{name: network_for_span(system, span) for name, span in spans.items()},
    }
    try:
        mapping = Mapping.model_validate(fields)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Mapping, f"run {run.name}")) from None
    return MappedRun(mapping, datatype_for(run.precision), tuple(gaps))
