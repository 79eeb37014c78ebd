"""Megatron-LM's parsed arguments as a run's fields and the mapping fields a run does not carry.

An argument left out takes Megatron-LM's default at the pinned commit: no sequence parallelism,
no distributed optimizer (ZeRO stage 0), no gradient-reduce or parameter-gather overlap, the
pipeline sends overlapped under an interleaved schedule (--no-overlap-p2p-communication turns
that off), fp32 main gradients, the `delayed` FP8 recipe, the `allgather` dispatcher (which the
cost model does not cost), unfused cross-entropy, fused bias-activation.
"""

from __future__ import annotations

import argparse

from costmodel.errors import InputError
from costmodel.frameworks.common import PRECISION_OF_RECIPE, stated_stage_blocks
from costmodel.inputs.kernels import MOE_FLEX_BACKENDS
from costmodel.inputs.model import Model
from costmodel.inputs.precision import Precision

__all__ = ["megatron_settings"]

_CUDA_GRAPHS = {None: "none", "none": "none", "local": "per-layer", "transformer_engine": "per-layer",
                "full_iteration": "full-iteration"}


def _check_model(args: argparse.Namespace, model: Model, where: str) -> None:
    """The model's shape where the arguments state it: a launch file for another model is refused."""
    for flag, stated, own in (("--num-layers", args.num_layers, model.num_blocks),
                              ("--hidden-size", args.hidden_size, model.hidden),
                              ("--num-attention-heads", args.num_attention_heads, model.attn_heads)):
        if stated is not None and stated != own:
            raise InputError(f"{where}: {flag} {stated} is not the model's ({own}, {model.name})")


def _degrees(args: argparse.Namespace, model: Model, where: str) -> tuple[dict, dict]:
    pp = args.pipeline_model_parallel_size or 1
    interleaving = args.num_virtual_stages_per_pipeline_rank or 1
    if args.num_layers_per_virtual_pipeline_stage:
        interleaving = model.num_blocks // (pp * args.num_layers_per_virtual_pipeline_stage)
    for flag, value in (("--micro-batch-size", args.micro_batch_size), ("--global-batch-size", args.global_batch_size),
                        ("--seq-length", args.seq_length)):
        if value is None:
            raise InputError(f"{where}: {flag} is not given (Megatron-LM needs it)")
    fields = {"tp": args.tensor_model_parallel_size or 1, "pp": pp, "cp": args.context_parallel_size or 1,
              "ep": args.expert_model_parallel_size or 1, "etp": args.expert_tensor_parallel_size,
              "interleaving": interleaving, "microbatch": args.micro_batch_size,
              "global_batch": args.global_batch_size, "seq_size": args.seq_length,
              "sequence_parallel": args.sequence_parallel, "tp_comm_overlap": args.tp_comm_overlap,
              "pp_comm_overlap": interleaving > 1 and args.overlap_p2p_communication,
              "pipeline_layout": args.pipeline_model_parallel_layout}
    extras = stated_stage_blocks(args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers,
                                 model, pp, interleaving)
    if args.cp_comm_type:
        kinds = set(args.cp_comm_type)
        if len(kinds) > 1 or not kinds <= {"p2p", "all_gather", "a2a"}:
            raise InputError(f"{where}: --cp-comm-type {' '.join(args.cp_comm_type)}: the cost model takes one of "
                             f"p2p, all_gather, a2a for every layer")
        extras["context_par_comm"] = kinds.pop()
    return fields, extras


def _memory(args: argparse.Namespace, where: str) -> tuple[dict, dict]:
    fields: dict = {"recompute": args.recompute_granularity or "none"}
    grouped = args.recompute_method == "uniform" and (args.recompute_num_layers or 1) > 1
    if args.recompute_granularity == "full" and grouped:
        raise InputError(f"{where}: --recompute-method uniform --recompute-num-layers {args.recompute_num_layers}: "
                         f"the cost model recomputes block by block (uniform 1) or the first N blocks (block N)")
    if args.recompute_granularity == "full" and args.recompute_method == "block":
        fields["recompute_blocks"] = args.recompute_num_layers
    if args.recompute_granularity == "selective":
        fields["recompute_modules"] = tuple(args.recompute_modules or ("core_attn",))
    fields["activation_offload_blocks"] = args.cpu_offloading_num_layers or 0
    if args.use_megatron_fsdp:
        strategy = args.data_parallel_sharding_strategy or "optim_grads_params"   # Megatron-LM's default
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[strategy]
        fields.update(sharding_stage=stage, megatron_fsdp=stage == 3)
    else:
        fsdp2 = 3 if args.torch_fsdp2_reshard_after_forward else 2
        fields["sharding_stage"] = fsdp2 if args.use_torch_fsdp2 else 1 if args.use_distributed_optimizer else 0
    fields.update(dp_overlap=args.overlap_grad_reduce,
                  param_gather_overlap=args.overlap_param_gather or fields["sharding_stage"] == 0)
    extras = {"optimizer_offload": args.optimizer_cpu_offload}
    return fields, extras


def _precision(args: argparse.Namespace, where: str) -> tuple[dict, dict]:
    if args.fp8_format:
        precision = PRECISION_OF_RECIPE[("fp8", args.fp8_recipe or "delayed")]
    elif args.fp4_format:
        precision = PRECISION_OF_RECIPE[("fp4", args.fp4_recipe or "nvfp4")]
    else:
        precision = Precision.bf16
    quantized = precision is not Precision.bf16
    fields = {"precision": precision, "low_precision_param_gather": quantized and (args.fp8_param_gather
                                                                                    or args.fp4_param_gather),
              "grad_datatype": "16bit" if args.grad_reduce_in_bf16 else "float32"}
    if args.first_last_layers_bf16:
        start, end = args.num_layers_at_start_in_bf16 or 1, args.num_layers_at_end_in_bf16 or 1
        if start != end:
            raise InputError(f"{where}: --num-layers-at-start-in-bf16 {start} and --num-layers-at-end-in-bf16 {end}: "
                             f"the cost model keeps as many blocks in BF16 at each end")
        fields["bf16_first_last_blocks"] = start
    extras: dict = {}
    if not args.bf16:
        extras.update(datatype="float16" if args.fp16 else "float32", precision=None)
        if quantized:
            raise InputError(f"{where}: an FP8/FP4 recipe without --bf16: the cost model runs recipes over BF16")
    if args.use_precision_aware_optimizer and args.exp_avg_dtype == "bf16" and args.exp_avg_sq_dtype == "bf16":
        extras["optimizer_state"] = "bf16"
    return fields, extras


def _kernels(args: argparse.Namespace, model: Model, where: str) -> dict:
    fields = {"cuda_graphs": _CUDA_GRAPHS[args.cuda_graph_impl], "fused_cross_entropy": args.cross_entropy_loss_fusion,
              "fused_activation": args.bias_swiglu_fusion if model.gated else args.bias_gelu_fusion}
    if model.num_experts:
        dispatcher = args.moe_token_dispatcher_type or "allgather"
        if dispatcher == "allgather":
            raise InputError(f"{where}: --moe-token-dispatcher-type allgather (Megatron-LM's default) is not costed: "
                             f"give alltoall or flex")
        fields.update(moe_dispatcher=dispatcher, moe_comm_overlap=args.overlap_moe_expert_parallel_comm)
        backend = getattr(args, "moe_flex_dispatcher_backend", None) or "deepep"
        if dispatcher == "flex":
            if backend not in MOE_FLEX_BACKENDS:
                raise InputError(f"{where}: --moe-flex-dispatcher-backend {backend} is not costed: give "
                                 f"{' or '.join(MOE_FLEX_BACKENDS)}")
            fields["moe_flex_backend"] = backend
    return fields


def megatron_settings(args: argparse.Namespace, model: Model, world: int, where: str) -> tuple[dict, dict]:
    """(run fields, mapping extras) of parsed Megatron-LM arguments on `world` GPUs."""
    _check_model(args, model, where)
    degrees, extras = _degrees(args, model, where)
    memory, memory_extras = _memory(args, where)
    precision, precision_extras = _precision(args, where)
    fields = {"num_gpus": world, **degrees, **memory, **precision, **_kernels(args, model, where)}
    extras = {**extras, **memory_extras, **precision_extras,
              "fused_attention": args.attention_backend != "unfused"}
    if args.num_distributed_optimizer_instances and args.num_distributed_optimizer_instances > 1:
        group = world // (fields["tp"] * fields["pp"])
        extras["sharding_group"] = group // args.num_distributed_optimizer_instances
    return fields, extras
