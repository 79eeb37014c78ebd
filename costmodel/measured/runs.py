"""Measured training runs: whole steps the cost model is checked (and later fitted) against.

A run is one measured training configuration: the model, the system, the GPU count, the
mapping as the framework ran it (in the framework's words: Megatron-LM's
`recompute_num_layers`, Megatron-FSDP, `cpu_offloading_num_layers`, CUDA graphs, a pipeline
layout), the precision recipe, and what was measured — the step time and, where known, the
peak memory — with its source. Many of these settings are more than a `Mapping` can say
today; costmodel.measured.run_mapping maps each run onto the nearest mapping and names every gap.

    costmodel.measured.runs         the schema (this module)
    costmodel.measured.run_files    reading run files: this project's, Megatron-Bridge's published rows,
                           single-GPU iterations
    costmodel.measured.run_mapping  a run as this tool's inputs (model, system, Mapping), gaps named
    costmodel.measured.run_scoring  predicted against measured, by row and summarised

docs/training-runs.md documents the file format field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

import costmodel.inputs.limits as limits
from costmodel.space.dimensions import data_parallel
from costmodel.inputs.kernels import CudaGraphs, GradDatatype, MoeDispatcher, MoeFlexBackend
from costmodel.inputs.limits import Bound
from costmodel.inputs.model import INPUT_CONFIG, Model, RealNumber, WholeNumber, within
from costmodel.inputs.precision import Precision   # the recipes (costmodel.inputs.precision), read by runs

__all__ = ["PROBLEMS_DIR", "CudaGraphs", "Precision", "RecomputeGranularity", "Run", "software_order"]

PROBLEMS_DIR = Path(__file__).resolve().parents[2] / "problems"
"""The project's problems/ folder: a run's model or system given by name resolves there
(problems/models/<name>.yaml or <name>/config.json, problems/systems/<name>.yaml), and
Megatron-Bridge rows take their workload settings from problems/runs/."""


_BLOCKS_OR_NONE = Bound(0, limits.NUM_BLOCKS.high, "0 (none) up to the deepest model's blocks")

RecomputeGranularity = Literal["none", "full", "selective"]
"""Megatron-LM's `--recompute-granularity`: none; full (a block stores only its input and
recomputes its forward in backward; with `recompute_blocks`, only that many blocks of each
pipeline chunk, `--recompute-method block`); selective (the modules of `recompute_modules`)."""



class Run(BaseModel):
    """One measured training configuration and what was measured. dp = num_gpus/(tp·cp·pp)."""

    model_config = INPUT_CONFIG

    name: str = Field(min_length=1, description="A label, unique in its file (a row id).")
    model: str | Model = Field(
        description="The model: a file (YAML/JSON or a Hugging Face config.json, relative to the run file), a name "
                    "of problems/models (`llama-3.1-70b`), or an inline model.")
    system: str = Field(description="The system: a file (relative to the run file) or a name of problems/systems "
                                    "(`h100-80g-nvl8`).")
    num_gpus: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(gt=0, description="GPUs used.")
    seq_size: Annotated[WholeNumber, within(limits.SEQ_SIZE)] = Field(
        gt=0, description="Training sequence length, tokens (replaces the model file's).")
    global_batch: Annotated[WholeNumber, within(limits.MAX_BATCH_SEARCH)] = Field(
        gt=0, description="Sequences per step.")
    microbatch: Annotated[WholeNumber, within(limits.MAX_BATCH_SEARCH)] = Field(
        1, gt=0, description="Sequences per microbatch.")
    tp: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(1, gt=0, description="Tensor parallelism.")
    cp: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(1, gt=0, description="Context parallelism.")
    pp: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(1, gt=0, description="Pipeline parallelism.")
    ep: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        1, gt=0, description="Expert parallelism (mixture-of-experts models; 1 for dense).")
    etp: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] | None = Field(
        None, gt=0, description="Expert tensor parallelism (Megatron's --expert-tensor-parallel-size; "
                                "mixture-of-experts models). Default: tp, Megatron-LM's default.")
    interleaving: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] = Field(
        1, gt=0, description="Virtual pipeline stages per GPU (Megatron's VP); 1 without interleaving.")
    sequence_parallel: bool | None = Field(
        None, description="Megatron's sequence parallelism (reduce-scatter/all-gather TP communication). "
                          "Default: on when tp > 1, as Megatron-Bridge's performance recipes set it.")
    tp_comm_overlap: bool = Field(False, description="TP communication overlapped with the GEMMs (Transformer "
                                                     "Engine userbuffers, `tp_comm_overlap`).")
    pp_comm_overlap: bool | None = Field(
        None, description="Pipeline sends overlapped with compute (Megatron's `overlap_p2p_comm`, interleaved "
                          "schedules only). Default: as Megatron-Bridge sets it, on whenever interleaving > 1 "
                          "(CommOverlapConfig).")
    recompute: RecomputeGranularity = Field("none", description="Activation recomputation: none | full | selective.")
    recompute_blocks: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] | None = Field(
        None, gt=0, description="With full recompute: blocks recomputed per pipeline chunk (Megatron's "
                                "recompute_method=block, recompute_num_layers); default every block.")
    recompute_modules: tuple[str, ...] = Field(
        (), description="With selective recompute: the modules recomputed (Megatron's recompute_modules, e.g. "
                        "core_attn, mlp, moe_act).")
    sharding_stage: Literal[0, 1, 2, 3] = Field(
        1, description="ZeRO stage over the data-parallel group: 0 replicated, 1 the distributed optimizer "
                       "(Megatron-Bridge's default), 2 + gradients, 3 + parameters.")
    megatron_fsdp: bool = Field(False, description="Megatron-FSDP (optimizer, gradients and parameters sharded, "
                                                   "`optim_grads_params`); implies sharding_stage 3.")
    dp_overlap: bool = Field(True, description="Gradient reduction overlapped with backward (overlap_grad_reduce).")
    param_gather_overlap: bool = Field(
        True, description="The distributed optimizer's parameter all-gather overlapped with the next forward "
                          "(overlap_param_gather).")
    activation_offload_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] = Field(
        0, ge=0, description="Blocks whose activations are offloaded to host memory (Megatron's "
                             "cpu_offloading_num_layers); 0: none.")
    cuda_graphs: CudaGraphs = Field("none", description="CUDA graphs: none | per-layer | full-iteration.")
    grad_datatype: GradDatatype = Field(
        "float32", description="Gradients kept and reduced in float32 (Megatron's grad_reduce_in_fp32) or 16bit.")
    moe_dispatcher: MoeDispatcher = Field(
        "alltoall", description="Megatron-LM's moe_token_dispatcher_type: alltoall, or flex (DeepEP / HybridEP).")
    moe_flex_backend: MoeFlexBackend = Field(
        "deepep", description="With the flex dispatcher: Megatron-LM's moe_flex_dispatcher_backend, deepep or hybridep.")
    moe_comm_overlap: bool = Field(
        False, description="Megatron-LM's overlap_moe_expert_parallel_comm (Megatron-Bridge's moe_a2a_overlap).")
    moe_dispatcher_sm_share: float | None = Field(
        None, gt=0, lt=1, description="The share of the GPU's SMs the flex dispatcher's kernels hold (DeepEP / "
                                      "HybridEP num_sms over the GPU's SMs); default: the network's processor_usage.")
    mtp_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] | None = Field(
        None, ge=0, description="Multi-token prediction modules the run trained (replaces the model file's); "
                                "default: the model's.")
    router_load_balancing: Literal["none", "aux_loss", "seq_aux_loss", "global_aux_loss"] | None = Field(
        None, description="The router's load-balancing loss the run trained with (replaces the model file's); "
                          "default: the model's.")
    pipeline_layout: str | None = Field(
        None, description="An explicit pipeline layout (Megatron's pipeline_model_parallel_layout, e.g. "
                          "'Et*2|(t*2|)*34,t*3|(t*2|)*3,tL'); default: the layout rule.")
    precision: Precision = Field(Precision.bf16, description="The precision recipe (see Precision).")
    precision_stated: bool = Field(
        True, description="False where the source does not state the precision and it was inferred.")
    low_precision_param_gather: bool = Field(
        False, description="Weights kept and all-gathered in FP8/FP4 beside their main copy (fp8_param_gather).")
    bf16_first_last_blocks: Annotated[WholeNumber, within(_BLOCKS_OR_NONE)] = Field(
        0, ge=0, description="Blocks at each end of the model kept in BF16 under an FP8/FP4 recipe.")
    fused_activation: bool = Field(True, description="The MLP's activation fused into its GEMM (false: eager "
                                                     "PyTorch, its own pass).")
    fused_cross_entropy: bool = Field(
        True, description="The loss as Megatron-LM's fused vocab-parallel cross-entropy; false: eager PyTorch's "
                          "log-softmax and NLL on fp32 logits.")
    step_time_s: RealNumber | None = Field(
        None, gt=0, description="Measured time of one training step (iteration), seconds; None: not published.")
    peak_memory_bytes: RealNumber | None = Field(
        None, gt=0, description="Measured peak memory per GPU, bytes (the allocator's peak), where known.")
    published_tflops_per_gpu: RealNumber | None = Field(
        None, gt=0, description="Model TFLOP/s per GPU as the source counts them (for reference).")
    software: str | None = Field(
        None, description="The software release that ran it (e.g. NVIDIA's container '26.04.01'); among runs of "
                          "one configuration the newest is scored.")
    configuration: str | None = Field(
        None, description="Runs with the same configuration are one setup measured by several software "
                          "releases; default: the run's name.")
    source: str = Field("", description="Where the numbers come from (file, table, line, commit).")
    notes: str = Field("", description="Anything a reader of the numbers should know.")

    @model_validator(mode="after")
    def _consistent(self) -> "Run":
        split = self.tp * self.cp * self.pp
        if self.num_gpus % split:
            raise ValueError(f"tp({self.tp})·cp({self.cp})·pp({self.pp})={split} does not divide "
                             f"num_gpus({self.num_gpus})")
        per_step = self.dp * self.microbatch
        if self.global_batch % per_step:
            raise ValueError(f"global_batch({self.global_batch}) is not a multiple of dp({self.dp})·"
                             f"microbatch({self.microbatch}) = {per_step}")
        if self.pp == 1 and self.interleaving != 1:
            raise ValueError(f"interleaving({self.interleaving}) needs pp > 1")
        if self.recompute_blocks is not None and self.recompute != "full":
            raise ValueError(f"recompute_blocks({self.recompute_blocks}) needs recompute: full, not {self.recompute}")
        if self.recompute_modules and self.recompute != "selective":
            raise ValueError(f"recompute_modules needs recompute: selective, not {self.recompute}")
        if self.megatron_fsdp and self.sharding_stage != 3:
            raise ValueError(f"megatron_fsdp shards parameters: sharding_stage must be 3, not {self.sharding_stage}")
        if self.precision is Precision.bf16 and (self.low_precision_param_gather or self.bf16_first_last_blocks):
            raise ValueError("low_precision_param_gather and bf16_first_last_blocks need an FP8 or FP4 precision")
        return self

    @property
    def dp(self) -> int:
        """Data parallelism: num_gpus / (tp·cp·pp), the GPUs the declaration's CHAIN leaves."""
        return data_parallel(self.num_gpus, {"tp": self.tp, "cp": self.cp, "pp": self.pp})

    @property
    def uses_sequence_parallel(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def configuration_key(self) -> str:
        return self.configuration or self.name

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_size


def software_order(software: str | None) -> tuple:
    """A sort key for release names: '26.04.01' after '26.04' after '25.11'; numbers compare as
    numbers, and a run that names no release sorts first."""
    if software is None:
        return ()
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in software.replace("-", ".").split("."))
