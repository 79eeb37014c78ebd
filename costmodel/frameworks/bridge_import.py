"""Megatron-Bridge overrides as a run's fields and the mapping fields a run does not carry.

A field the overrides leave out takes its dataclass default at the pinned commits (tp, pp, cp,
ep 1; no sequence parallelism; no distributed optimizer; BF16 with fp32 gradient reduction;
the `alltoall` dispatcher is not a default: Megatron-Core's is `allgather`, which is not costed).
"""

from __future__ import annotations

from costmodel.errors import InputError
from costmodel.frameworks.common import PRECISION_OF_RECIPE, stated_stage_blocks
from costmodel.measured.run_bridge import BRIDGE_SYSTEMS, FLEX_BACKEND_SMS, SYSTEM_SMS
from costmodel.model import Model
from costmodel.precision import Precision
from costmodel.system import System

__all__ = ["bridge_settings", "system_sms"]

_CUDA_GRAPHS = {"none": "none", "transformer_engine": "per-layer", "local": "per-layer",
                "full_iteration": "full-iteration"}


def system_sms(system: System | None) -> int | None:
    """The GPU's streaming multiprocessors where Megatron-Bridge's rows name the system."""
    if system is None:
        return None
    by_name = {name: SYSTEM_SMS[dgx] for dgx, name in BRIDGE_SYSTEMS.items() if dgx in SYSTEM_SMS}
    return by_name.get(system.name)


def _degrees(o: dict, model: Model, where: str) -> tuple[dict, dict]:
    tp, pp, cp = (o.get(f"model.{name}_parallel_size") or 1 for name in ("tensor_model", "pipeline_model", "context"))
    if "comm_overlap.data_parallel_size" not in o or "train.global_batch_size" not in o:
        raise InputError(f"{where}: comm_overlap.data_parallel_size and train.global_batch_size must be given "
                         f"(the GPU count is tp·cp·pp·dp)")
    interleaving = o.get("model.virtual_pipeline_model_parallel_size") or 1
    fields = {"num_gpus": tp * cp * pp * o["comm_overlap.data_parallel_size"], "tp": tp, "pp": pp, "cp": cp,
              "ep": o.get("model.expert_model_parallel_size") or 1, "etp": o.get("model.expert_tensor_parallel_size"),
              "interleaving": interleaving, "seq_size": o.get("model.seq_length", model.seq_size),
              "microbatch": o.get("train.micro_batch_size") or 1, "global_batch": o["train.global_batch_size"],
              "sequence_parallel": bool(o.get("model.sequence_parallel")),
              "tp_comm_overlap": bool(o.get("comm_overlap.tp_comm_overlap")),
              "pp_comm_overlap": bool(o.get("comm_overlap.overlap_p2p_comm", interleaving > 1)),
              "pipeline_layout": o.get("model.pipeline_model_parallel_layout")}
    extras = stated_stage_blocks(o.get("model.num_layers_in_first_pipeline_stage"),
                                 o.get("model.num_layers_in_last_pipeline_stage"), model, pp, interleaving)
    if o.get("model.cp_comm_type"):
        extras["context_par_comm"] = o["model.cp_comm_type"]
    return fields, extras


def _memory(o: dict) -> tuple[dict, dict]:
    granularity = o.get("model.recompute_granularity") or "none"
    fields: dict = {"recompute": granularity}
    if granularity == "full" and o.get("model.recompute_method") == "block":
        fields["recompute_blocks"] = o.get("model.recompute_num_layers")
    if granularity == "selective":
        fields["recompute_modules"] = tuple(o.get("model.recompute_modules") or ("core_attn",))
    if o.get("model.cpu_offloading") and o.get("model.cpu_offloading_activations", True):
        fields["activation_offload_blocks"] = o.get("model.cpu_offloading_num_layers") or 0
    fsdp = bool(o.get("ddp.use_megatron_fsdp"))
    if fsdp:
        strategy = o.get("ddp.data_parallel_sharding_strategy", "no_shard")
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
    else:
        stage = 3 if o.get("dist.use_torch_fsdp2") else 1 if o.get("ddp.use_distributed_optimizer") else 0
    overlap = o.get("comm_overlap.overlap_grad_reduce", o.get("ddp.overlap_grad_reduce", False))
    gather = o.get("comm_overlap.overlap_param_gather", o.get("ddp.overlap_param_gather", False))
    fields.update(sharding_stage=stage, megatron_fsdp=fsdp and stage == 3, dp_overlap=bool(overlap),
                  param_gather_overlap=bool(gather) or stage == 0)
    extras = {"weight_offload": bool(o.get("model.cpu_offloading") and o.get("model.cpu_offloading_weights")),
              "optimizer_offload": bool(o.get("optimizer.optimizer_cpu_offload"))}
    instances = o.get("ddp.num_distributed_optimizer_instances") or 1
    if instances > 1:
        extras["sharding_group"] = o["comm_overlap.data_parallel_size"] * (o.get("model.context_parallel_size") or 1) \
            // instances
    return fields, extras


def _precision(o: dict, where: str) -> tuple[dict, dict]:
    if o.get("mixed_precision.fp8"):
        family, recipe = "fp8", o.get("mixed_precision.fp8_recipe", "delayed")
    elif o.get("mixed_precision.fp4"):
        family, recipe = "fp4", o.get("mixed_precision.fp4_recipe", "nvfp4")
    else:
        family, recipe = None, None
    if family is not None and (family, recipe) not in PRECISION_OF_RECIPE:
        raise InputError(f"{where}: mixed_precision.{family}_recipe={recipe}: not a recipe the cost model runs")
    precision = PRECISION_OF_RECIPE[(family, recipe)] if family else Precision.bf16
    fields = {"precision": precision,
              "low_precision_param_gather": bool(family and o.get(f"mixed_precision.{family}_param_gather")),
              "bf16_first_last_blocks": (o.get("mixed_precision.num_layers_at_start_in_bf16") or 0)
              if o.get("mixed_precision.first_last_layers_bf16") else 0,
              "grad_datatype": "float32" if o.get("mixed_precision.grad_reduce_in_fp32", True) else "16bit"}
    extras = {"datatype": "float16", "precision": None} if o.get("mixed_precision.fp16") else {}
    return fields, extras


def _kernels(o: dict, model: Model, system: System | None, where: str) -> dict:
    graphs = o.get("model.cuda_graph_impl") or "none"
    if graphs == "local" and o.get("model.cuda_graph_scope") == "full_iteration":
        graphs = "full_iteration"
    fields = {"cuda_graphs": _CUDA_GRAPHS[graphs],
              "fused_cross_entropy": bool(o.get("model.cross_entropy_loss_fusion")),
              "fused_activation": o.get("model.bias_activation_fusion", True)}
    if not model.num_experts:
        return fields
    dispatcher = o.get("model.moe_token_dispatcher_type", "allgather")
    if dispatcher == "allgather":
        raise InputError(f"{where}: model.moe_token_dispatcher_type=allgather is not costed: give alltoall or flex")
    overlap = bool(o.get("comm_overlap.overlap_moe_expert_parallel_comm"))
    fields.update(moe_dispatcher=dispatcher, moe_comm_overlap=overlap)
    backend = o.get("model.moe_flex_dispatcher_backend", "deepep")
    sms = o.get(f"model.moe_{backend}_num_sms") or FLEX_BACKEND_SMS.get(backend)
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
