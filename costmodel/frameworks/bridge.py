"""A mapping as Megatron-Bridge recipe overrides, and those overrides as a mapping.

The overrides are the ConfigContainer fields Megatron-Bridge's performance scripts set
(scripts/performance/utils/overrides.py), one `section.field=value` a line (values in YAML:
true, null, 8, [core_attn, mlp]), every field checked against its declared type at the pinned
commits (costmodel/data/framework-megatron-bridge.yaml). The GPU count travels as
`comm_overlap.data_parallel_size` (dp; num_gpus = tp·cp·pp·dp). docs/frameworks-megatron-bridge.md
gives the field table.
"""

from __future__ import annotations

import yaml

from costmodel.errors import InputError, InternalError
from costmodel.frameworks.bridge_import import bridge_settings, system_sms
from costmodel.frameworks.common import (FP8_FORMAT, RECIPE_OF_PRECISION, REDO_WORDS, Exported, Refusals, check_layout,
                                         cost_model_assumptions, effective_param_gather, mapping_from_run_fields,
                                         megatron_redoes_gather, recompute_of, sharding_of, short_chunk_layout,
                                         stage_layout)
from costmodel.frameworks.definitions import BRIDGE, check_field
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System

__all__ = ["bridge_overrides", "export_bridge", "import_bridge", "parse_overrides"]

_CUDA_GRAPHS = {"per-layer": {"model.cuda_graph_impl": "transformer_engine"},
                "full-iteration": {"model.cuda_graph_impl": "local", "model.cuda_graph_scope": "full_iteration"}}


def _parallelism(mapping: Mapping, model: Model, out: dict, refusals: Refusals) -> None:
    out.update({"model.tensor_model_parallel_size": mapping.tensor_par,
                "model.pipeline_model_parallel_size": mapping.pipeline_par,
                "model.context_parallel_size": mapping.context_par,
                "model.virtual_pipeline_model_parallel_size": mapping.pipeline_interleaving
                if mapping.pipeline_interleaving > 1 else None,
                "comm_overlap.data_parallel_size": mapping.data_par, "model.seq_length": model.seq_size,
                "train.micro_batch_size": mapping.microbatch_size, "train.global_batch_size": mapping.batch_size,
                "model.sequence_parallel": mapping.tensor_par > 1 and mapping.tensor_par_comm_type.value == "rs_ag",
                "comm_overlap.tp_comm_overlap": mapping.tensor_par > 1 and mapping.tensor_par_overlap.value == "ring"})
    if model.num_experts:
        out.update({"model.expert_model_parallel_size": mapping.expert_par,
                    "model.expert_tensor_parallel_size": mapping.expert_tensor_par or mapping.tensor_par})
    check_layout(mapping, model, refusals)
    layout, string = stage_layout(mapping, model), short_chunk_layout(mapping, model)
    if string is not None:
        out["model.pipeline_model_parallel_layout"] = string
    elif layout.uneven:
        out.update({"model.num_layers_in_first_pipeline_stage": layout.first,
                    "model.num_layers_in_last_pipeline_stage": layout.last})
    if mapping.context_par > 1:
        out["model.cp_comm_type"] = mapping.context_par_comm.value
    if mapping.tensor_par > 1 and mapping.tensor_par_comm_type.value == "p2p_rs_ag":
        refusals.refuse("tensor_par_comm_type", "p2p_rs_ag", "Megatron-Core has all-reduce or sequence parallelism")
    if mapping.tensor_par > 1 and mapping.tensor_par_overlap.value == "pipe":
        refusals.refuse("tensor_par_overlap", "pipe", "tp_comm_overlap runs Transformer Engine's userbuffer methods")
    if mapping.pipeline_schedule.value != "1f1b":
        refusals.refuse("pipeline_schedule", mapping.pipeline_schedule, "Megatron-Core has no zero-bubble schedule")


def _memory(mapping: Mapping, model: Model, out: dict, refusals: Refusals) -> None:
    granularity, blocks, modules = recompute_of(mapping, model)
    if granularity == "full":
        out.update({"model.recompute_granularity": "full", "model.recompute_method": "block" if blocks else "uniform",
                    "model.recompute_num_layers": blocks or 1})
    elif granularity == "selective":
        out.update({"model.recompute_granularity": "selective", "model.recompute_modules": list(modules)})
    if mapping.activations_offload:
        out.update({"model.cpu_offloading": True,
                    "model.cpu_offloading_num_layers": mapping.activation_offload_blocks
                    or stage_layout(mapping, model).first})
    if mapping.weight_offload:
        out.update({"model.cpu_offloading": True, "model.cpu_offloading_weights": True})
    if mapping.optimizer_offload:
        out["optimizer.optimizer_cpu_offload"] = True
    stage, fsdp, instances = sharding_of(mapping)
    out["ddp.use_distributed_optimizer"] = stage == 1
    if fsdp:
        out.update({"ddp.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": "optim_grads_params"})
    elif stage == 3:
        out["dist.use_torch_fsdp2"] = True
    elif stage == 2:
        refusals.refuse("sharding_stage", 2, "Megatron-Bridge's overrides shard gradients only with the parameters "
                                             "(Megatron-FSDP or PyTorch FSDP2)")
    if instances > 1 and stage == 1:
        out["ddp.num_distributed_optimizer_instances"] = instances
    elif instances > 1:
        refusals.refuse("sharding_group", mapping.sharding_group, "Megatron-Bridge's FSDP shards over the whole "
                                                            "data-parallel group")
    out["comm_overlap.overlap_grad_reduce"] = mapping.data_par_overlap
    if stage == 1:
        out["comm_overlap.overlap_param_gather"] = mapping.data_par_overlap
    if mapping.pipeline_interleaving > 1:
        out["comm_overlap.overlap_p2p_comm"] = mapping.pipeline_comm_overlap


def _precision(mapping: Mapping, out: dict, refusals: Refusals) -> None:
    datatype = mapping.datatype.value
    if datatype not in ("bfloat16", "float16"):
        refusals.refuse("datatype", datatype, "Megatron-Bridge's mixed-precision recipes run over BF16 or FP16")
    out[f"mixed_precision.{'bf16' if datatype != 'float16' else 'fp16'}"] = True
    recipe = RECIPE_OF_PRECISION.get(mapping.precision)
    if recipe is not None:
        family, name = recipe
        out.update({f"mixed_precision.{family}": FP8_FORMAT.get(mapping.precision, "hybrid") if family == "fp8"
                    else "e2m1",
                    f"mixed_precision.{family}_recipe": name,
                    f"mixed_precision.{family}_param_gather": effective_param_gather(mapping)})
    out.update({"mixed_precision.first_last_layers_bf16": mapping.bf16_first_last_blocks > 0,
                "mixed_precision.grad_reduce_in_fp32": mapping.grad_datatype == "float32"})
    if mapping.bf16_first_last_blocks:
        out.update({"mixed_precision.num_layers_at_start_in_bf16": mapping.bf16_first_last_blocks,
                    "mixed_precision.num_layers_at_end_in_bf16": mapping.bf16_first_last_blocks})
    if mapping.optimizer_state != "fp32":
        refusals.refuse("optimizer_state", mapping.optimizer_state, "optimizer.exp_avg_dtype is a torch.dtype, not an "
                                                              "override's text")


def _kernels(mapping: Mapping, model: Model, system: System, out: dict, refusals: Refusals) -> None:
    if model.num_experts:
        out.update({"model.moe_token_dispatcher_type": mapping.moe_dispatcher,
                    "comm_overlap.overlap_moe_expert_parallel_comm": mapping.moe_comm_overlap,
                    "comm_overlap.delay_wgrad_compute": mapping.moe_comm_overlap})
        if mapping.moe_dispatcher == "flex":
            out["model.moe_flex_dispatcher_backend"] = mapping.moe_flex_backend
    if mapping.moe_dispatcher_sm_share is not None:
        sms = system_sms(system)
        if sms is None or mapping.moe_dispatcher != "flex":
            refusals.refuse("moe_dispatcher_sm_share", mapping.moe_dispatcher_sm_share,
                            f"an SM count needs the flex dispatcher on a GPU of known SMs, not {system.name!r}")
        else:
            out[f"model.moe_{mapping.moe_flex_backend}_num_sms"] = round(mapping.moe_dispatcher_sm_share * sms)
    out.update(_CUDA_GRAPHS.get(mapping.cuda_graphs, {}))
    out.update({"model.cross_entropy_loss_fusion": mapping.fused_cross_entropy,
                "model.bias_activation_fusion": mapping.fused_activation})
    if not mapping.fused_attention:
        out["model.attention_backend"] = "unfused"


def bridge_overrides(mapping: Mapping, model: Model, system: System, refusals: Refusals) -> dict:
    """The overrides of `mapping`, field → value; refusals collected."""
    out: dict = {}
    _parallelism(mapping, model, out, refusals)
    _memory(mapping, model, out, refusals)
    _precision(mapping, out, refusals)
    _kernels(mapping, model, system, out, refusals)
    cost_model_assumptions(mapping, refusals, megatron_redoes_gather(mapping), REDO_WORDS)
    return out


def _value_text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def export_bridge(mapping: Mapping, model: Model, system: System, lossy: bool = False) -> Exported:
    """The recipe overrides for `mapping` (an InputError naming what Megatron-Bridge cannot
    express, unless lossy)."""
    refusals = Refusals("Megatron-Bridge")
    overrides = bridge_overrides(mapping, model, system, refusals)
    for name, value in overrides.items():
        if not check_field(BRIDGE, name, value, "export"):
            raise InternalError(f"exported Megatron-Bridge field {name} is not one a mapping sets")
    return refusals.finish([f"{name}={_value_text(value)}" for name, value in overrides.items()], lossy)


def parse_overrides(text: str, where: str) -> dict:
    """`section.field=value` lines (comments and blank lines skipped) → field → value, each field
    checked against Megatron-Bridge's definitions."""
    out = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise InputError(f"{where}: line {number}: {line!r} is not section.field=value")
        name = name.strip().removeprefix("recipe.")
        parsed = yaml.safe_load(value) if value.strip() else None
        check_field(BRIDGE, name, parsed, f"{where}: line {number}")
        out[name] = parsed
    return out


def import_bridge(text: str, model: Model, system: System, where: str) -> Mapping:
    """The mapping that Megatron-Bridge overrides run."""
    fields, extras = bridge_settings(parse_overrides(text, where), model, system, where)
    return mapping_from_run_fields(fields, extras, model, system, where)

