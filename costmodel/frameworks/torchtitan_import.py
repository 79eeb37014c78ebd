"""torchtitan's job fields as a run's fields and the mapping fields a run does not carry.

A field the TOML leaves out takes JobConfig's default at the pinned commit; two of them matter:
`activation_checkpoint.mode` defaults to `selective` (per-op or per-layer-period checkpointing,
which the cost model does not cost: give full or none) and the first and last pipeline stages
default to one block fewer each (`pipeline_parallel_first/last_stage_less_layers` = 1).
"""

from __future__ import annotations

from costmodel.errors import InputError
from costmodel.frameworks.common import stated_stage_blocks
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision

__all__ = ["torchtitan_settings"]

_ROTATE = {"alltoall": "p2p", "allgather": "all_gather"}
_SCHEDULES = {"1F1B": False, "Interleaved1F1B": True}


def _pipeline(job: dict, model: Model, pp: int, where: str) -> tuple[int, dict]:
    """(interleaving, stated first/last stage blocks)."""
    if pp == 1:
        return 1, {}
    schedule = job.get("parallelism.pipeline_parallel_schedule", "1F1B")
    if schedule not in _SCHEDULES:
        raise InputError(f"{where}: parallelism.pipeline_parallel_schedule = {schedule!r}: the cost model runs "
                         f"{' or '.join(_SCHEDULES)}")
    less_first = job.get("parallelism.pipeline_parallel_first_stage_less_layers", 1)
    less_last = job.get("parallelism.pipeline_parallel_last_stage_less_layers", 1)
    per_stage = job.get("parallelism.pipeline_parallel_layers_per_stage")
    weighted = model.num_blocks + less_first + less_last
    if per_stage is None and _SCHEDULES[schedule]:
        raise InputError(f"{where}: parallelism.pipeline_parallel_layers_per_stage must be given with {schedule}")
    stages = weighted // per_stage if per_stage else pp
    if weighted != stages * (per_stage or weighted // pp) or stages % pp:
        raise InputError(f"{where}: {model.num_blocks} blocks + {less_first} + {less_last} (the stages' "
                         f"less_layers) do not fill {pp} pipeline stages evenly")
    interleaving = stages // pp
    base = weighted // pp
    return interleaving, stated_stage_blocks(base - less_first, base - less_last, model, pp, interleaving)


def _precision(job: dict, where: str) -> tuple[dict, dict]:
    converters = job.get("model.converters", [])
    precision, gather = Precision.bf16, False
    if "quantize.linear.float8" in converters:
        recipe = job.get("quantize.linear.float8.recipe_name")
        if recipe != "tensorwise":
            raise InputError(f"{where}: quantize.linear.float8.recipe_name = {recipe!r}: the cost model runs "
                             f"tensorwise (FP8 per-tensor scaling)")
        precision = Precision.fp8_tensorwise
        gather = bool(job.get("quantize.linear.float8.enable_fsdp_float8_all_gather", False))
    elif "quantize.linear.mx" in converters:
        precision = Precision.mxfp8
    extras = {}
    if job.get("training.mixed_precision_param", "bfloat16") == "float32":
        extras.update(datatype="float32", precision=None)
    return {"precision": precision, "low_precision_param_gather": gather, "grad_datatype": "float32"}, extras


def torchtitan_settings(job: dict, model: Model, where: str) -> tuple[dict, dict]:
    """(run fields, mapping extras) of a torchtitan job's fields (dotted names)."""
    tp = job.get("parallelism.tensor_parallel_degree", 1)
    cp = job.get("parallelism.context_parallel_degree", 1)
    pp = job.get("parallelism.pipeline_parallel_degree", 1)
    replicate = job.get("parallelism.data_parallel_replicate_degree", 1)
    shard = job.get("parallelism.data_parallel_shard_degree", -1)
    if shard < 1:
        raise InputError(f"{where}: parallelism.data_parallel_shard_degree = {shard}: give the degree (the GPU "
                         f"count is replicate·shard·cp·tp·pp)")
    dp = replicate * shard
    mode = job.get("activation_checkpoint.mode", "selective")
    if mode not in ("full", "none"):
        raise InputError(f"{where}: activation_checkpoint.mode = {mode!r} is not costed: give full or none")
    interleaving, extras = _pipeline(job, model, pp, where)
    fsdp = shard * cp > 1
    stage = (2 if job.get("parallelism.fsdp_reshard_after_forward") == "never" else 3) if fsdp else 0
    if fsdp and replicate > 1:
        extras["sharding_group"] = shard * cp
    per_rank = job.get("training.local_batch_size", 8)
    microbatch = job.get("parallelism.pipeline_parallel_microbatch_size", 1) if pp > 1 else per_rank
    global_batch = job.get("training.global_batch_size", -1)
    components = job.get("compile.components", ["model", "loss"]) if job.get("compile.enable", False) else []
    fields = {"num_gpus": dp * cp * tp * pp, "tp": tp, "cp": cp, "pp": pp, "interleaving": interleaving,
              "ep": job.get("parallelism.expert_parallel_degree", 1),
              "etp": job.get("parallelism.expert_tensor_parallel_degree", 1) if model.num_experts else None,
              "seq_size": job.get("training.seq_len", 2048), "microbatch": microbatch,
              "global_batch": global_batch if global_batch > 0 else per_rank * dp,
              "sequence_parallel": tp > 1, "tp_comm_overlap": bool(job.get("parallelism.enable_async_tensor_parallel")),
              "pp_comm_overlap": False, "recompute": mode, "sharding_stage": stage, "dp_overlap": True,
              "moe_dispatcher": "flex" if job.get("parallelism.expert_parallel_comm_backend") == "deepep"
              else "alltoall",
              "fused_activation": "model" in components, "fused_cross_entropy": "loss" in components}
    precision, precision_extras = _precision(job, where)
    offload = bool(job.get("training.enable_cpu_offload"))
    # autograd keeps the sequence-parallel all-gather's output for backward: no redo
    extras.update(weight_offload=offload, optimizer_offload=offload, seq_par_ag_redo=False, **precision_extras)
    if cp > 1:
        extras["context_par_comm"] = _ROTATE[job.get("parallelism.context_parallel_rotate_method", "allgather")]
    return {**fields, **precision}, extras
