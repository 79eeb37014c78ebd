"""A measured run as this tool's inputs: the nearest `Mapping` and the datatype, with every
setting the cost model cannot yet express named.

A run states its mapping in the framework's words; a `Mapping` has fewer. What does not map
one to one is mapped to the nearest expressible setting, and the gap is listed per run
("not expressible: ...") so a reader sees why a prediction may miss:

| the run | the mapping | gap listed |
| --- | --- | --- |
| its precision recipe | that recipe (costmodel.inputs.precision), datatype bfloat16, with its FP8/FP4 weight all-gather and BF16 first/last blocks as the run states them | — |
| Megatron-FSDP | ZeRO stage 3 with its gradient double buffer (`megatron_fsdp`) | — |
| activation offload of N blocks | N of each stage's blocks offloaded (`activation_offload_blocks`) when the system has offload memory, else none | only without offload memory, or with full recompute |
| full recompute of N blocks per chunk | full, the first N of each chunk (`recompute_blocks`) | — |
| selective recompute | attn_only with the modules (`recompute_modules`: core_attn, layernorm, mlp, moe_act, mla_up_proj) | yes, for other modules |
| CUDA graphs | the problem's `cuda_graphs` (launch gaps removed where graphed) | — |
| the loss (fused or eager cross-entropy) | the problem's `fused_cross_entropy` | — |
| a pipeline layout (Megatron-LM's layout string) | first and last stage blocks (`pipeline_first/last_stage_blocks`) when the middle stages are equal and only the first stage's first and the last stage's last chunk are shorter (costmodel.terms.pipeline_layout); else the layout rule | only when not expressed |
| an unoverlapped parameter all-gather | not modelled | yes |
| sequence parallelism | tp_comm rs_ag (else ar); the all-gather redone in backward (Megatron-LM keeps the sharded input) | — |
| TP communication overlap | tp_overlap ring (tp > 1) | — |
| pipeline send overlap (`overlap_p2p_comm`) | `pipeline_comm_overlap`: as stated, else on when interleaving > 1 (Megatron-Bridge's rule) | — |
| a model with multi-token prediction whose blocks the layout rule cannot lay out | first and last stage blocks as Megatron-LM's MTP layouts: the embedding, each MTP module and the loss count as a block (`mtp_layout`) | yes |

Each parallel group runs on the innermost network that spans it (NVLink within a domain,
InfiniBand beyond), as NCCL would place it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import ValidationError

from costmodel.space.choices import Recompute, TPComm, TPOverlap
from costmodel.space.dimensions import BY_NAME, DEGREES, GROUP_SPAN, NETWORK_GROUPS
from costmodel.errors import InputError
from costmodel.inputs.load import describe_validation_error
from costmodel.inputs.mapping import Mapping
from costmodel.terms.memory_features import FEATURE_MODULES
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.space.layout import layout_problem, stage_blocks
from costmodel.terms.pipeline_layout import layout_chunks, stage_layout
from costmodel.measured.runs import Precision, Run
from costmodel.inputs.system import Datatype, System

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


def _recompute(run: Run, model: Model, gaps: list[str]) -> tuple[Recompute, dict]:
    """The recompute setting and the memory-feature fields that refine it."""
    if run.recompute == "none":
        return Recompute.none, {}
    if run.recompute == "selective":
        known = tuple(module for module in run.recompute_modules if module in FEATURE_MODULES)
        unknown = [module for module in run.recompute_modules if module not in FEATURE_MODULES]
        if unknown:
            gaps.append(f"selective recompute of {', '.join(unknown)}: not costed (only {', '.join(FEATURE_MODULES)} "
                        f"are)")
        if "moe_act" in known and not model.num_experts:
            known = tuple(module for module in known if module != "moe_act")
        if "mla_up_proj" in known and model.latent_attention is None:
            known = tuple(module for module in known if module != "mla_up_proj")
        if not known:
            return Recompute.none, {}
        # core_attn alone is attn_only as the searched spaces cost it
        return Recompute.attn_only, {} if known == ("core_attn",) else {"recompute_modules": known}
    stage = min(stage_blocks(ScalarOps, model.num_blocks, run.pp, interleaving=run.interleaving))
    chunk = int(stage) // run.interleaving
    if run.recompute_blocks is None or run.recompute_blocks >= chunk:
        return Recompute.full, {}
    return Recompute.full, {"recompute_blocks": run.recompute_blocks}


def _activation_offload(run: Run, model: Model, system: System, recompute: Recompute, gaps: list[str]) -> dict:
    """The activations_offload switch and, for N of a stage's blocks, activation_offload_blocks."""
    if not run.activation_offload_blocks:
        return {"activations_offload": False}
    stage = int(min(stage_blocks(ScalarOps, model.num_blocks, run.pp, interleaving=run.interleaving)))
    what = f"activation offload of {run.activation_offload_blocks} of {stage} blocks per stage"
    if system.offload is None:
        gaps.append(f"{what}: system {system.name!r} has no offload memory, costed as none")
        return {"activations_offload": False}
    if recompute is Recompute.full:
        gaps.append(f"{what}: costed as none (full recompute stores only block inputs)")
        return {"activations_offload": False}
    if run.activation_offload_blocks < stage:
        return {"activations_offload": True, "activation_offload_blocks": run.activation_offload_blocks}
    return {"activations_offload": True}


def _other_gaps(run: Run, gaps: list[str]) -> None:
    if not run.param_gather_overlap and run.dp * run.cp > 1:
        gaps.append("parameter all-gather not overlapped: costed as overlapped with the gradient reduction")


def mtp_layout(model: Model, pp: int, interleaving: int) -> tuple[int, int] | None:
    """(first, last) stage blocks for a model with multi-token prediction whose blocks the
    layout rule cannot lay out: the embedding, the loss and each MTP module count as a block
    (Megatron-Bridge's DeepSeek-V3 layouts end in 'tmL': t a block, m the MTP module, L the
    loss), so each stage holds (L + 2 + mtp)/pp of them; None when that does not divide either."""
    if not model.mtp_blocks or pp < 2 or layout_problem(model.num_blocks, pp, interleaving) is None:
        return None
    per_stage, remainder = divmod(model.num_blocks + 2 + model.mtp_blocks, pp)
    first, last = per_stage - 1, per_stage - 1 - model.mtp_blocks
    if remainder or last < 1 or layout_problem(model.num_blocks, pp, interleaving, first, last) is not None:
        return None
    return first, last


def _stated_layout(run: Run, model: Model, gaps: list[str]) -> tuple[int, int] | None:
    """(first, last) stage blocks of the run's explicit pipeline layout when the cost model
    expresses it (costmodel.terms.pipeline_layout.stage_layout) and its blocks are the model's,
    None when that is the layout rule's own (Megatron-Bridge's DeepSeek-V3 layouts: a short last
    chunk); else None, the layout rule, and a gap."""
    layout = stage_layout(run.pipeline_layout, run.pp, run.interleaving)
    if layout is not None:
        first, last = layout
        middle = (model.num_blocks - first - last) / (run.pp - 2)
        if middle == int(sum(layout_chunks(run.pipeline_layout, run.pp, run.interleaving)[1])) and \
                layout_problem(model.num_blocks, run.pp, run.interleaving, first, last) is None:
            ruled = layout_problem(model.num_blocks, run.pp, run.interleaving) is None and layout == tuple(
                stage_blocks(ScalarOps, model.num_blocks, run.pp, interleaving=run.interleaving)[::2])
            return None if ruled else layout
    gaps.append(f"pipeline layout {run.pipeline_layout!r}: costed with the layout rule")
    return None


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
    recompute, recompute_fields = _recompute(run, model, gaps)
    offload_fields = _activation_offload(run, model, system, recompute, gaps)
    _other_gaps(run, gaps)
    layout = mtp_layout(model, run.pp, run.interleaving) if run.pipeline_layout is None else None
    if run.pipeline_layout is not None:
        layout = _stated_layout(run, model, gaps)
    elif layout is not None:
        gaps.append(f"{model.num_blocks} blocks and {model.mtp_blocks} MTP module(s) on pp {run.pp}: first stage "
                    f"{layout[0]} blocks, last {layout[1]} (embedding, MTP and loss counted as blocks; the MTP "
                    f"modules are costed on the last stage)")
    seq_par = run.uses_sequence_parallel and run.tp > 1
    replicas = run.dp * run.cp
    ep, etp = _expert_degrees(run, model, gaps)
    stated = {"tp": run.tp, "cp": run.cp, "ep": ep, "etp": etp, "pp": run.pp, "dp": run.dp}
    # (a degree a run cannot state takes its file default)
    degrees = {d.name: stated.get(d.name, BY_NAME[d.name].default) for d in DEGREES}
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
        "moe_dispatcher": run.moe_dispatcher, "moe_flex_backend": run.moe_flex_backend,
        "moe_comm_overlap": run.moe_comm_overlap,
        "moe_dispatcher_sm_share": run.moe_dispatcher_sm_share,
        "grad_datatype": run.grad_datatype,
        # Megatron-Bridge's CommOverlapConfig turns overlap_p2p_comm on whenever vp > 1
        "pipeline_comm_overlap": run.interleaving > 1 if run.pp_comm_overlap is None else run.pp_comm_overlap,
        "activation_recompute": recompute,
        "tensor_par_comm_type": TPComm.rs_ag if seq_par else TPComm.ar,
        "tensor_par_overlap": TPOverlap.ring if run.tp_comm_overlap and run.tp > 1 else TPOverlap.none,
        "seq_par_ag_redo": seq_par and recompute is not Recompute.full,
        "sharding_stage": run.sharding_stage if replicas > 1 else 0,
        "data_par_overlap": run.dp_overlap and replicas > 1,
        "megatron_fsdp": run.megatron_fsdp and replicas > 1,
        **recompute_fields, **offload_fields,
        **({"pipeline_first_stage_blocks": layout[0], "pipeline_last_stage_blocks": layout[1]} if layout else {}),
        **{name: network_for_span(system, span) for name, span in spans.items()},
    }
    try:
        mapping = Mapping.model_validate(fields)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Mapping, f"run {run.name}")) from None
    return MappedRun(mapping, datatype_for(run.precision), tuple(gaps))
