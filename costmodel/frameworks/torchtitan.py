"""A mapping as a torchtitan job TOML, and such a TOML as a mapping.

torchtitan runs FSDP2 over `data_parallel_shard_degree` (with cp folded in), replicates over
`data_parallel_replicate_degree` (HSDP), and applies tensor parallelism with sequence-parallel
norms; it has no ZeRO-1 or ZeRO-2 outside FSDP, no activation offload, no FP8 delayed or block
scaling, no CUDA graphs. What it cannot run is refused naming the dimension. The fields are
checked against JobConfig at the pinned commit (costmodel/data/framework-torchtitan.yaml): the
last with TOML job files. docs/frameworks-torchtitan.md gives the field table.
"""

from __future__ import annotations

import tomllib

from costmodel.errors import InputError, InternalError
from costmodel.frameworks.common import (Exported, Refusals, check_layout, cost_model_assumptions,
                                         effective_param_gather, mapping_from_run_fields, recompute_of, sharding_of,
                                         stage_layout)
from costmodel.frameworks.definitions import TORCHTITAN, check_field
from costmodel.frameworks.torchtitan_import import torchtitan_settings
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import System

__all__ = ["export_torchtitan", "import_torchtitan", "torchtitan_fields", "torchtitan_run_fields"]

ROTATE = {"p2p": "alltoall", "all_gather": "allgather"}
"""context_par_comm → context_parallel_rotate_method: the K/V ring (torchtitan passes the shards
round the ring by all-to-all) or K/V all-gathered."""
CONVERTERS = {Precision.fp8_tensorwise: ("quantize.linear.float8", "tensorwise"),
              Precision.mxfp8: ("quantize.linear.mx", "mxfp8_cublas")}


def _pipeline(mapping: Mapping, model: Model, out: dict, refusals: Refusals) -> None:
    if mapping.pipeline_par == 1:
        return
    check_layout(mapping, model, refusals)
    layout = stage_layout(mapping, model)
    base = max(layout.first, layout.middle, layout.last)
    if mapping.pipeline_par > 2 and layout.middle != base:
        refusals.refuse("pipeline_first_stage_blocks", layout.first, "torchtitan's first and last stages hold at "
                                                                     "most a middle stage's blocks")
    out.update({"parallelism.pipeline_parallel_degree": mapping.pipeline_par,
                "parallelism.pipeline_parallel_schedule": "1F1B" if mapping.pipeline_interleaving == 1
                else "Interleaved1F1B",
                "parallelism.pipeline_parallel_layers_per_stage": base // mapping.pipeline_interleaving,
                "parallelism.pipeline_parallel_first_stage_less_layers": base - layout.first,
                "parallelism.pipeline_parallel_last_stage_less_layers": base - layout.last,
                "parallelism.pipeline_parallel_microbatch_size": mapping.microbatch_size})
    if mapping.pipeline_schedule.value != "1f1b":
        refusals.refuse("pipeline_schedule", mapping.pipeline_schedule, "torchtitan's zero-bubble schedules are "
                                                                  "ZBVZeroBubble and InterleavedZeroBubble, not ZB-H1")
    if mapping.pipeline_interleaving > 1 and mapping.pipeline_comm_overlap:
        refusals.refuse("pipeline_comm_overlap", True, "torchtitan has no setting for it")


def _data_parallel(mapping: Mapping, out: dict, refusals: Refusals) -> None:
    stage, fsdp, instances = sharding_of(mapping)
    group = mapping.data_par * mapping.context_par
    if stage in (1, 2) or (stage == 0 and mapping.context_par > 1):
        refusals.refuse("sharding_stage", stage, "torchtitan has no ZeRO-1 or ZeRO-2 apart from FSDP (and FSDP "
                                                 "shards over cp)" if stage else "torchtitan shards over the cp group")
    if fsdp:
        refusals.refuse("megatron_fsdp", True, "torchtitan runs PyTorch FSDP2")
    if instances > 1 and stage != 3:
        refusals.refuse("sharding_group", mapping.sharding_group, "torchtitan's HSDP groups are FSDP's (stage 3)")
    shard = group // instances if stage == 3 else 1
    if shard % mapping.context_par:
        refusals.refuse("sharding_group", mapping.sharding_group, f"torchtitan's shard group holds the cp group "
                                                            f"({mapping.context_par}) whole")
    out.update({"parallelism.data_parallel_replicate_degree": group // shard if stage == 3 else mapping.data_par,
                "parallelism.data_parallel_shard_degree": max(shard // mapping.context_par, 1)})
    if stage == 3:
        out["parallelism.fsdp_reshard_after_forward"] = "always"
    if group > 1 and not mapping.data_par_overlap:
        refusals.refuse("data_par_overlap", False, "torchtitan always overlaps the gradient reduction")


def _model_parallel(mapping: Mapping, model: Model, out: dict, refusals: Refusals) -> None:
    out.update({"parallelism.tensor_parallel_degree": mapping.tensor_par,
                "parallelism.context_parallel_degree": mapping.context_par})
    if mapping.tensor_par > 1 and mapping.tensor_par_comm_type.value != "rs_ag":
        refusals.refuse("tensor_par_comm_type", mapping.tensor_par_comm_type, "torchtitan's tensor parallelism keeps "
                                                                        "the norms sequence-parallel (rs_ag)")
    if mapping.tensor_par > 1:
        out["parallelism.enable_async_tensor_parallel"] = mapping.tensor_par_overlap.value == "ring"
        if mapping.tensor_par_overlap.value == "pipe":
            refusals.refuse("tensor_par_overlap", "pipe", "torchtitan's async TP decomposes the collective (ring)")
    if mapping.context_par > 1:
        if mapping.context_par_comm.value not in ROTATE:
            refusals.refuse("context_par_comm", mapping.context_par_comm, "torchtitan rotates K/V (ring or all-gather)")
        out["parallelism.context_parallel_rotate_method"] = ROTATE.get(mapping.context_par_comm.value, "allgather")
    if model.num_experts:
        out.update({"parallelism.expert_parallel_degree": mapping.expert_par,
                    "parallelism.expert_tensor_parallel_degree": mapping.expert_tensor_par or mapping.tensor_par,
                    "parallelism.expert_parallel_comm_backend": "deepep" if mapping.moe_dispatcher == "flex"
                    else "standard"})
        if mapping.moe_comm_overlap:
            refusals.refuse("moe_comm_overlap", True, "torchtitan overlaps expert dispatch only inside DualPipeV")
        if mapping.moe_dispatcher == "flex" and mapping.moe_flex_backend != "deepep":
            refusals.refuse("moe_flex_backend", mapping.moe_flex_backend, "torchtitan's flex backend is DeepEP")


def _batch_and_memory(mapping: Mapping, model: Model, out: dict, refusals: Refusals) -> None:
    per_rank = mapping.batch_size // mapping.data_par
    out.update({"training.seq_len": model.seq_size, "training.global_batch_size": mapping.batch_size,
                "training.local_batch_size": per_rank if mapping.pipeline_par > 1 else mapping.microbatch_size})
    granularity, blocks, modules = recompute_of(mapping, model)
    if granularity == "selective" or blocks is not None:
        what = f"attn_only of {', '.join(modules)}" if granularity == "selective" else f"full of {blocks} blocks"
        refusals.refuse("activation_recompute", what,
                        "torchtitan recomputes whole blocks (full) or by op or layer period (selective), not "
                        "Megatron-LM's modules or the first N blocks")
    out["activation_checkpoint.mode"] = "full" if granularity == "full" else "none"
    offload = (mapping.weight_offload, mapping.optimizer_offload)
    if mapping.activations_offload:
        refusals.refuse("activations_offload", True, "torchtitan offloads no activations")
    if any(offload) and not (all(offload) and sharding_of(mapping)[0] == 3):
        refusals.refuse("weight_offload" if not mapping.weight_offload else "optimizer_offload", False,
                        "torchtitan's enable_cpu_offload moves FSDP's parameters, gradients and optimizer together")
    out["training.enable_cpu_offload"] = all(offload)


def _precision(mapping: Mapping, out: dict, refusals: Refusals) -> None:
    if mapping.datatype.value not in ("bfloat16", "float32"):
        refusals.refuse("datatype", mapping.datatype, "torchtitan's parameters run in bfloat16 or float32")
    out.update({"training.mixed_precision_param": "float32" if mapping.datatype.value == "float32" else "bfloat16",
                "training.mixed_precision_reduce": "float32"})
    if mapping.grad_datatype != "float32":
        refusals.refuse("grad_datatype", mapping.grad_datatype, "torchtitan reduces gradients in float32")
    quantized = mapping.precision not in (None, Precision.bf16)
    if quantized and mapping.precision not in CONVERTERS:
        refusals.refuse("precision", mapping.precision, "torchtitan runs FP8 tensorwise or rowwise and MXFP8 linears")
    converter = CONVERTERS.get(mapping.precision)
    out["model.converters"] = [converter[0]] if converter else []
    if converter:
        out[f"{converter[0]}.recipe_name"] = converter[1]
    if converter and converter[0].endswith("float8"):
        out["quantize.linear.float8.enable_fsdp_float8_all_gather"] = effective_param_gather(mapping)
    elif quantized and effective_param_gather(mapping):
        refusals.refuse("low_precision_param_gather", True, "torchtitan all-gathers FP8 weights only for float8")
    if mapping.bf16_first_last_blocks:
        refusals.refuse("bf16_first_last_blocks", mapping.bf16_first_last_blocks, "torchtitan filters linears by name")
    if mapping.optimizer_state != "fp32":
        refusals.refuse("optimizer_state", mapping.optimizer_state, "torchtitan keeps Adam's moments in fp32")


def _kernels(mapping: Mapping, out: dict, refusals: Refusals) -> None:
    if mapping.cuda_graphs != "none":
        refusals.refuse("cuda_graphs", mapping.cuda_graphs, "torchtitan captures no CUDA graphs")
    if not mapping.fused_attention:
        refusals.refuse("fused_attention", False, "torchtitan's attention is SDPA / FlexAttention")
    async_tp = out.get("parallelism.enable_async_tensor_parallel", False)
    if async_tp and not mapping.fused_activation:
        refusals.refuse("fused_activation", False, "torchtitan's async tensor parallelism compiles the model, "
                                                   "which fuses the activation")
    wanted = (("model", mapping.fused_activation or async_tp), ("loss", mapping.fused_cross_entropy))
    components = [name for name, on in wanted if on]
    out.update({"compile.enable": bool(components), "compile.components": components})


def torchtitan_fields(mapping: Mapping, model: Model, refusals: Refusals) -> dict:
    """The TOML fields of `mapping`, dotted name → value; refusals collected."""
    out: dict = {}
    _model_parallel(mapping, model, out, refusals)
    _data_parallel(mapping, out, refusals)
    _pipeline(mapping, model, out, refusals)
    _batch_and_memory(mapping, model, out, refusals)
    _precision(mapping, out, refusals)
    _kernels(mapping, out, refusals)
    cost_model_assumptions(mapping, refusals, False, "torchtitan's sequence-parallel all-gather output is "
                                                    "saved for backward by autograd (full checkpointing reruns it)")
    return out


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)


def export_torchtitan(mapping: Mapping, model: Model, lossy: bool = False) -> Exported:
    """The job TOML's sections for `mapping` (an InputError naming what torchtitan cannot run,
    unless lossy); launch it on mapping.num_procs GPUs (NGPU)."""
    refusals = Refusals("torchtitan")
    fields = torchtitan_fields(mapping, model, refusals)
    sections: dict[str, list[str]] = {}
    for name, value in fields.items():
        if not check_field(TORCHTITAN, name, value, "export"):
            raise InternalError(f"exported torchtitan field {name} is not one a mapping sets")
        section, key = name.rsplit(".", 1)
        sections.setdefault(section, []).append(f"{key} = {_toml_value(value)}")
    lines = [f"# NGPU={mapping.num_procs}"]
    for section, keys in sections.items():
        lines += ["", f"[{section}]", *keys]
    return refusals.finish(lines, lossy)


def _flatten(table: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def torchtitan_run_fields(text: str, model: Model, where: str) -> tuple[dict, dict]:
    """(run fields, mapping extras) of a torchtitan job TOML; an unknown field is an error naming it."""
    try:
        fields = _flatten(tomllib.loads(text))
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{where}: not a TOML file ({err})") from None
    used = {name: value for name, value in fields.items() if check_field(TORCHTITAN, name, value, where)}
    return torchtitan_settings(used, model, where)


def import_torchtitan(text: str, model: Model, system: System, where: str) -> Mapping:
    """The mapping a torchtitan job TOML runs."""
    run_fields, extras = torchtitan_run_fields(text, model, where)
    return mapping_from_run_fields(run_fields, extras, model, system, where)
