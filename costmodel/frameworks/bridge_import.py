"""Megatron-Bridge overrides as a run's fields and the mapping fields a run does not carry.

A field the overrides leave out takes its dataclass default at the pinned commits (tp, pp, cp,
ep 1; no sequence parallelism; no distributed optimizer; BF16 with fp32 gradient reduction;
the `alltoall` dispatcher is not a default: Megatron-Core's is `allgather`, which is not costed).
"""

from __future__ import annotations

from costmodel.errors import InputError
from costmodel.frameworks.common import PRECISION_OF_RECIPE, stated_stage_blocks
from costmodel.measured.run_bridge import BRIDGE_SYSTEMS, FLEX_BACKEND_SMS, SYSTEM_SMS
from costmodel.inputs.kernels import MOE_FLEX_BACKENDS
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import System

__all__ = ["bridge_settings", "system_sms"]

_CUDA_GRAPHS = {"none": "none", "transformer_engine": "per-layer", "local": "per-layer",
                "full_iteration": "full-iteration"}


def system_sms(system: System | None) -> int | None:
    """The GPU's streaming multiprocessors where Megatron-Bridge's rows name the system."""
    if system is None:
        return None
    by_name = {name: SYSTEM_SMS[dgx] for dgx, name in BRIDGE_SYSTEMS.items() if dgx in SYSTEM_SMS}
    return by_name.get(system.name)


def _degrees(overrides: dict, model: Model, where: str) -> tuple[dict, dict]:
    tp, pp, cp = (overrides.get(f"model.{name}_parallel_size") or 1
                  for name in ("tensor_model", "pipeline_model", "context"))
    if "comm_overlap.data_parallel_size" not in overrides or "train.global_batch_size" not in overrides:
        raise InputError(f"{where}: comm_overlap.data_parallel_size and train.global_batch_size must be given "
                         f"(the GPU count is tp·cp·pp·dp)")
    interleaving = overrides.get("model.virtual_pipeline_model_parallel_size") or 1
    fields = {"num_gpus": tp * cp * pp * overrides["comm_overlap.data_parallel_size"], "tp": tp, "pp": pp, "cp": cp,
              "ep": overrides.get("model.expert_model_parallel_size") or 1,
              "etp": overrides.get("model.expert_tensor_parallel_size"),
              "interleaving": interleaving, "seq_size": overrides.get("model.seq_length", model.seq_size),
              "microbatch": overrides.get("train.micro_batch_size") or 1,
              "global_batch": overrides["train.global_batch_size"],
              "sequence_parallel": bool(overrides.get("model.sequence_parallel")),
              "tp_comm_overlap": bool(overrides.get("comm_overlap.tp_comm_overlap")),
              "pp_comm_overlap": bool(overrides.get("comm_overlap.overlap_p2p_comm", interleaving > 1)),
              "pipeline_layout": overrides.get("model.pipeline_model_parallel_layout")}
    extras = stated_stage_blocks(overrides.get("model.num_layers_in_first_pipeline_stage"),
                                 overrides.get("model.num_layers_in_last_pipeline_stage"), model, pp, interleaving)
    if overrides.get("model.cp_comm_type"):
        extras["context_par_comm"] = overrides["model.cp_comm_type"]
    return fields, extras


def _memory(overrides: dict) -> tuple[dict, dict]:
    granularity = overrides.get("model.recompute_granularity") or "none"
    fields: dict = {"recompute": granularity}
    if granularity == "full" and overrides.get("model.recompute_method") == "block":
        fields["recompute_blocks"] = overrides.get("model.recompute_num_layers")
    if granularity == "selective":
        fields["recompute_modules"] = tuple(overrides.get("model.recompute_modules") or ("core_attn",))
    if overrides.get("model.cpu_offloading") and overrides.get("model.cpu_offloading_activations", True):
        fields["activation_offload_blocks"] = overrides.get("model.cpu_offloading_num_layers") or 0
    fsdp = bool(overrides.get("ddp.use_megatron_fsdp"))
    if fsdp:
        strategy = overrides.get("ddp.data_parallel_sharding_strategy", "no_shard")
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
    else:
        stage = (3 if overrides.get("dist.use_torch_fsdp2") else 1 if overrides.get("ddp.use_distributed_optimizer")
                 else 0)
    overlap = overrides.get("comm_overlap.overlap_grad_reduce", overrides.get("ddp.overlap_grad_reduce", False))
    gather = overrides.get("comm_overlap.overlap_param_gather", overrides.get("ddp.overlap_param_gather", False))
    fields.update(sharding_stage=stage, megatron_fsdp=fsdp and stage == 3, dp_overlap=bool(overlap),
                  param_gather_overlap=bool(gather) or stage == 0)
    extras = {"weight_offload": bool(overrides.get("model.cpu_offloading")
                                     and overrides.get("model.cpu_offloading_weights")),
              "optimizer_offload": bool(overrides.get("optimizer.optimizer_cpu_offload"))}
    instances = overrides.get("ddp.num_distributed_optimizer_instances") or 1
    if instances > 1:
        extras["sharding_group"] = (overrides["comm_overlap.data_parallel_size"]
                                    * (overrides.get("model.context_parallel_size") or 1) // instances)
    return fields, extras


def _precision(overrides: dict, where: str) -> tuple[dict, dict]:
    if overrides.get("mixed_precision.fp8"):
        family, recipe = "fp8", overrides.get("mixed_precision.fp8_recipe", "delayed")
    elif overrides.get("mixed_precision.fp4"):
        family, recipe = "fp4", overrides.get("mixed_precision.fp4_recipe", "nvfp4")
    else:
        family, recipe = None, None
    if family is not None and (family, recipe) not in PRECISION_OF_RECIPE:
        raise InputError(f"{where}: mixed_precision.{family}_recipe={recipe}: not a recipe the cost model runs")
    precision = PRECISION_OF_RECIPE[(family, recipe)] if family else Precision.bf16
    fields = {"precision": precision,
              "low_precision_param_gather": bool(family and overrides.get(f"mixed_precision.{family}_param_gather")),
              "bf16_first_last_blocks": (overrides.get("mixed_precision.num_layers_at_start_in_bf16") or 0)
              if overrides.get("mixed_precision.first_last_layers_bf16") else 0,
              "grad_datatype": "float32" if overrides.get("mixed_precision.grad_reduce_in_fp32", True) else "16bit"}
    extras = {"datatype": "float16", "precision": None} if overrides.get("mixed_precision.fp16") else {}
    return fields, extras


def _kernels(overrides: dict, model: Model, system: System | None, where: str) -> dict:
    graphs = overrides.get("model.cuda_graph_impl") or "none"
    if graphs == "local" and overrides.get("model.cuda_graph_scope") == "full_iteration":
        graphs = "full_iteration"
    fields = {"cuda_graphs": _CUDA_GRAPHS[graphs],
              "fused_cross_entropy": bool(overrides.get("model.cross_entropy_loss_fusion")),
              "fused_activation": overrides.get("model.bias_activation_fusion", True)}
    if not model.num_experts:
        return fields
    dispatcher = overrides.get("model.moe_token_dispatcher_type", "allgather")
    if dispatcher == "allgather":
        raise InputError(f"{where}: model.moe_token_dispatcher_type=allgather is not costed: give alltoall or flex")
    overlap = bool(overrides.get("comm_overlap.overlap_moe_expert_parallel_comm"))
    fields.update(moe_dispatcher=dispatcher, moe_comm_overlap=overlap)
    backend = overrides.get("model.moe_flex_dispatcher_backend", "deepep")
    if dispatcher == "flex":
        if backend not in MOE_FLEX_BACKENDS:
            raise InputError(f"{where}: model.moe_flex_dispatcher_backend={backend} is not costed: give "
                             f"{' or '.join(MOE_FLEX_BACKENDS)}")
        fields["moe_flex_backend"] = backend
    sms = overrides.get(f"model.moe_{backend}_num_sms") or FLEX_BACKEND_SMS.get(backend)
    if dispatcher == "flex" and overlap and sms and system_sms(system):
        fields["moe_dispatcher_sm_share"] = sms / system_sms(system)
    return fields


def bridge_settings(overrides: dict, model: Model, system: System | None, where: str) -> tuple[dict, dict]:
    """(run fields, mapping extras) of parsed Megatron-Bridge overrides."""
    degrees, extras = _degrees(overrides, model, where)
    memory, memory_extras = _memory(overrides)
    precision, precision_extras = _precision(overrides, where)
    fields = {**degrees, **memory, **precision, **_kernels(overrides, model, system, where)}
    extras = {**extras, **memory_extras, **precision_extras,
              "fused_attention": overrides.get("model.attention_backend") != "unfused"}
    return fields, extras
