"""A mapping as Megatron-LM's command-line arguments, and those arguments as a mapping.

The export is a launch line: `torchrun --nnodes N --nproc-per-node G pretrain_gpt.py` and the
arguments, one per line; every flag is one of Megatron-LM's own at the pinned commit
(costmodel/data/framework-megatron-lm.yaml) and the text is parsed back with a parser built
from those definitions before it is returned. The import reads such a launch line, a launch
script's (shell line continuations and comments allowed), or a file of arguments with the GPU
count given as `WORLD_SIZE=N`. docs/frameworks-megatron-lm.md gives the field table.
"""

from __future__ import annotations

import argparse
import shlex

from costmodel.errors import InputError, InternalError
from costmodel.frameworks.common import (FP8_FORMAT, RECIPE_OF_PRECISION, REDO_WORDS, Exported, Refusals, check_layout,
                                         cost_model_assumptions, effective_param_gather, mapping_from_run_fields,
                                         megatron_redoes_gather, moe_dispatcher_text, recompute_of, sharding_of,
                                         short_chunk_layout, stage_layout)
from costmodel.frameworks.definitions import megatron_parser
from costmodel.frameworks.megatron_import import megatron_settings
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System

__all__ = ["export_megatron", "import_megatron", "megatron_arguments", "megatron_run_fields"]

GPUS_PER_NODE = 8
"""GPUs a launch line puts on each node (torchrun --nproc-per-node): eight, as in a DGX/HGX node."""
CUDA_GRAPH_IMPL = {"per-layer": "transformer_engine", "full-iteration": "full_iteration"}


def _degrees(mapping: Mapping, model: Model, out: list, refusals: Refusals) -> None:
    out += [("--tensor-model-parallel-size", mapping.tensor_par),
            ("--pipeline-model-parallel-size", mapping.pipeline_par),
            ("--context-parallel-size", mapping.context_par)]
    if model.num_experts:
        out += [("--expert-model-parallel-size", mapping.expert_par),
                ("--expert-tensor-parallel-size", mapping.expert_tensor_par or mapping.tensor_par)]
    if mapping.pipeline_interleaving > 1:
        out.append(("--num-virtual-stages-per-pipeline-rank", mapping.pipeline_interleaving))
    check_layout(mapping, model, refusals)
    layout, string = stage_layout(mapping, model), short_chunk_layout(mapping, model)
    if string is not None:
        out.append(("--pipeline-model-parallel-layout", string))
    elif layout.uneven:
        out += [("--decoder-first-pipeline-num-layers", layout.first),
                ("--decoder-last-pipeline-num-layers", layout.last)]
    out += [("--micro-batch-size", mapping.microbatch_size), ("--global-batch-size", mapping.batch_size),
            ("--seq-length", model.seq_size)]
    comm = mapping.tensor_par_comm_type.value
    if mapping.tensor_par > 1 and comm == "rs_ag":
        out.append(("--sequence-parallel",))
    elif mapping.tensor_par > 1 and comm == "p2p_rs_ag":
        refusals.refuse("tensor_par_comm_type", comm, "Megatron-LM has all-reduce or sequence parallelism, not a "
                                                      "point-to-point reduce-scatter/all-gather")
    if mapping.tensor_par > 1 and mapping.tensor_par_overlap.value == "ring":
        out.append(("--tp-comm-overlap",))
    elif mapping.tensor_par > 1 and mapping.tensor_par_overlap.value == "pipe":
        refusals.refuse("tensor_par_overlap", "pipe", "--tp-comm-overlap runs Transformer Engine's userbuffer "
                                                      "methods; a pipelined split needs a --tp-comm-overlap-cfg file")
    if mapping.context_par > 1:
        out.append(("--cp-comm-type", mapping.context_par_comm.value))


def _recompute_and_offload(mapping: Mapping, model: Model, out: list, refusals: Refusals) -> None:
    granularity, blocks, modules = recompute_of(mapping, model)
    if granularity == "full" and blocks is None:
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif granularity == "full":
        out += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                ("--recompute-num-layers", blocks)]
    elif granularity == "selective":
        out += [("--recompute-granularity", "selective"), ("--recompute-modules", *modules)]
    if mapping.activations_offload:
        blocks = mapping.activation_offload_blocks or stage_layout(mapping, model).first
        if blocks >= model.num_blocks:
            refusals.refuse("activations_offload", True, f"--cpu-offloading-num-layers takes fewer than the model's "
                                                         f"{model.num_blocks} layers")
        out.append(("--cpu-offloading-num-layers", blocks))
    if mapping.weight_offload:
        refusals.refuse("weight_offload", True, "cpu_offloading_weights has no command-line flag")
    if mapping.optimizer_offload:
        out.append(("--optimizer-cpu-offload",))


def _sharding_and_overlaps(mapping: Mapping, out: list, refusals: Refusals) -> None:
    stage, fsdp, instances = sharding_of(mapping)
    if stage == 1:
        out.append(("--use-distributed-optimizer",))
    elif fsdp:
        out += [("--use-megatron-fsdp",), ("--data-parallel-sharding-strategy", "optim_grads_params")]
    elif stage > 1:
        out += [("--use-torch-fsdp2",)] + ([("--torch-fsdp2-no-reshard-after-forward",)] if stage == 2 else [])
    if instances > 1 and (stage == 1 or fsdp):
        # HSDP: the distributed optimizer's copies; Megatron-FSDP replicates its shards across them
        out.append(("--num-distributed-optimizer-instances", instances))
        out += [("--outer-dp-sharding-strategy", "no_shard")] if fsdp else []
    elif instances > 1:
        refusals.refuse("sharding_group", mapping.sharding_group,
                        "PyTorch FSDP2 in Megatron-LM shards over the whole data-parallel group (Megatron-FSDP, "
                        "megatron_fsdp, has HSDP)")
    if mapping.data_par_overlap:
        out.append(("--overlap-grad-reduce",))
        if stage == 1:
            out.append(("--overlap-param-gather",))
    if mapping.pipeline_interleaving > 1 and not mapping.pipeline_comm_overlap:
        out.append(("--no-overlap-p2p-communication",))
    if mapping.pipeline_schedule.value != "1f1b":
        refusals.refuse("pipeline_schedule", mapping.pipeline_schedule,
                        "Megatron-LM has no zero-bubble schedule flag of that name")


def _precision(mapping: Mapping, out: list, refusals: Refusals) -> None:
    datatype = mapping.datatype.value
    if datatype == "float8":
        refusals.refuse("datatype", datatype, "Megatron-LM quantizes by a recipe (--fp8-recipe), not every tensor")
    out += [("--bf16",)] if datatype in ("bfloat16", "float8") else [("--fp16",)] if datatype == "float16" else []
    recipe = RECIPE_OF_PRECISION.get(mapping.precision)
    if recipe is not None and recipe[0] == "fp8":
        out += [("--fp8-format", FP8_FORMAT.get(mapping.precision, "hybrid")), ("--fp8-recipe", recipe[1])]
    elif recipe is not None:
        out += [("--fp4-format", "e2m1"), ("--fp4-recipe", recipe[1])]
    if effective_param_gather(mapping):
        out.append((f"--{recipe[0]}-param-gather",))
    if mapping.bf16_first_last_blocks:
        out += [("--first-last-layers-bf16",), ("--num-layers-at-start-in-bf16", mapping.bf16_first_last_blocks),
                ("--num-layers-at-end-in-bf16", mapping.bf16_first_last_blocks)]
    if mapping.optimizer_state == "bf16":
        out += [("--use-precision-aware-optimizer",), ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if mapping.grad_datatype == "16bit":
        out.append(("--grad-reduce-in-bf16",))


def _kernels(mapping: Mapping, model: Model, out: list) -> None:
    if model.num_experts:
        out.append(("--moe-token-dispatcher-type", moe_dispatcher_text(mapping)))
        if mapping.moe_dispatcher == "flex":
            out.append(("--moe-flex-dispatcher-backend", mapping.moe_flex_backend))
        if mapping.moe_comm_overlap:
            out += [("--overlap-moe-expert-parallel-comm",), ("--delay-wgrad-compute",)]
    if mapping.cuda_graphs != "none":
        out.append(("--cuda-graph-impl", CUDA_GRAPH_IMPL[mapping.cuda_graphs]))
    if mapping.fused_cross_entropy:
        out.append(("--cross-entropy-loss-fusion",))
    if not mapping.fused_activation:
        out.append(("--no-bias-swiglu-fusion",) if model.gated else ("--no-bias-gelu-fusion",))
    if not mapping.fused_attention:
        out.append(("--attention-backend", "unfused"))


def megatron_arguments(mapping: Mapping, model: Model, refusals: Refusals) -> list[tuple]:
    """The mapping's Megatron-LM arguments, each a flag and its values; refusals collected."""
    out: list[tuple] = []
    _degrees(mapping, model, out, refusals)
    _recompute_and_offload(mapping, model, out, refusals)
    _sharding_and_overlaps(mapping, out, refusals)
    _precision(mapping, out, refusals)
    _kernels(mapping, model, out)
    cost_model_assumptions(mapping, refusals, megatron_redoes_gather(mapping), REDO_WORDS)
    return out


def export_megatron(mapping: Mapping, model: Model, lossy: bool = False) -> Exported:
    """The launch line for `mapping` (an InputError naming what Megatron-LM cannot express,
    unless lossy)."""
    refusals = Refusals("Megatron-LM")
    arguments = megatron_arguments(mapping, model, refusals)
    flat = [str(token) for argument in arguments for token in argument]
    _, unknown = megatron_parser().parse_known_args(flat)
    if unknown:
        raise InternalError(f"exported Megatron-LM arguments not in the pinned definitions: {unknown}")
    per_node = GPUS_PER_NODE if mapping.num_procs % GPUS_PER_NODE == 0 else mapping.num_procs
    lines = [f"torchrun --nnodes {mapping.num_procs // per_node} --nproc-per-node {per_node} pretrain_gpt.py \\"]
    lines += [f"    {' '.join(str(token) for token in argument)}" + (" \\" if index < len(arguments) - 1 else "")
              for index, argument in enumerate(arguments)]
    return refusals.finish(lines, lossy)


def _launch_tokens(text: str, where: str) -> tuple[list[str], int | None]:
    """Megatron-LM's arguments of a launch line or file, and the GPU count it states."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    tokens = [token for token in tokens if token != "\n"]
    variable = next((token for token in tokens if "$" in token), None)
    if variable is not None:
        raise InputError(f"{where}: {variable!r}: a shell variable; give its value")
    world = next((int(token.split("=", 1)[1]) for token in tokens if token.startswith("WORLD_SIZE=")), None)
    script = next((index for index, token in enumerate(tokens) if token.endswith(".py")), None)
    if script is None:
        return [token for token in tokens if not token.startswith("WORLD_SIZE=")], world
    launcher = argparse.ArgumentParser(add_help=False)
    launcher.add_argument("--nnodes", type=int, default=1)
    launcher.add_argument("--nproc-per-node", "--nproc_per_node", dest="per_node", type=int)
    known, _ = launcher.parse_known_args(tokens[:script])
    if known.per_node is not None:
        world = known.nnodes * known.per_node
    return tokens[script + 1:], world


def megatron_run_fields(text: str, model: Model, where: str) -> tuple[dict, dict]:
    """(run fields, mapping extras) of a Megatron-LM launch line or argument file; an
    InputError names an argument Megatron-LM (at the pinned commit) or this importer does not know."""
    tokens, world = _launch_tokens(text, where)
    args, unknown = megatron_parser().parse_known_args(tokens)
    if unknown:
        raise InputError(f"{where}: unknown Megatron-LM argument {unknown[0]!r} (not in the pinned definitions "
                         f"this project reads)")
    if world is None:
        raise InputError(f"{where}: the GPU count is not stated: give the launch line (torchrun --nnodes N "
                         f"--nproc-per-node G ...) or WORLD_SIZE=N")
    return megatron_settings(args, model, world, where)


def import_megatron(text: str, model: Model, system: System, where: str) -> Mapping:
    """The mapping a Megatron-LM launch line or argument file runs."""
    fields, extras = megatron_run_fields(text, model, where)
    return mapping_from_run_fields(fields, extras, model, system, where)
