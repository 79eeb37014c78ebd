"""The execution strategy: how one model is mapped onto `num_procs` GPUs.

The file format is Calculon's execution JSON, field for field; code reads the short
properties `tp`, `pp`, `dp`, ... so formulas stay legible.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator

import costmodel.limits as limits
from costmodel.errors import InputError
from costmodel.model import INPUT_CONFIG, Model, WholeNumber, within
from costmodel.system import Datatype, System


class Recompute(str, Enum):
    """Activation recomputation: store nothing but block inputs (full), recompute only the
    attention core (attn_only, "selective"), or store everything (none)."""

    full = "full"
    attn_only = "attn_only"
    none = "none"


class TPComm(str, Enum):
    """Tensor-parallel communication: all-reduce after each parallel region (ar); the same
    with the reduction split into reduce-scatter + all-gather point to point (p2p_rs_ag);
    or sequence parallelism, which keeps activations between regions split along the
    sequence and replaces each all-reduce by a reduce-scatter and an all-gather (rs_ag)."""

    ar = "ar"
    p2p_rs_ag = "p2p_rs_ag"
    rs_ag = "rs_ag"


class TPOverlap(str, Enum):
    """Overlap of TP communication with the neighbouring matrix multiply: none; ring (the
    collective decomposed into ring steps, each hidden behind a slice of the multiply); pipe
    (the multiply split into chunks pipelined with the communication)."""

    none = "none"
    ring = "ring"
    pipe = "pipe"


class AttentionType(str, Enum):
    multihead = "multihead"
    multiquery = "multiquery"


class Mapping(BaseModel):
    """One execution strategy. tp·pp·dp must equal num_procs."""

    model_config = INPUT_CONFIG

    num_procs: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        gt=0, description="GPUs used: tensor_par · pipeline_par · data_par.")
    tensor_par: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        gt=0, description="Tensor parallelism, tp: each matrix is split tp ways.")
    pipeline_par: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        gt=0, description="Pipeline parallelism, pp: blocks are split into pp stages.")
    data_par: Annotated[WholeNumber, within(limits.GPUS_SEARCH)] = Field(
        gt=0, description="Data parallelism, dp: replicas each taking batch/dp samples.")
    tensor_par_net: Annotated[WholeNumber, within(limits.NETWORK_INDEX)] = Field(
        0, ge=0, description="Index of the network carrying TP traffic.")
    pipeline_par_net: Annotated[WholeNumber, within(limits.NETWORK_INDEX)] = Field(
        0, ge=0, description="Index of the network carrying PP traffic.")
    data_par_net: Annotated[WholeNumber, within(limits.NETWORK_INDEX)] = Field(
        0, ge=0, description="Index of the network carrying DP traffic.")
    batch_size: Annotated[WholeNumber, within(limits.MAX_BATCH_SEARCH)] = Field(
        gt=0, description="Global batch, in sequences.")
    microbatch_size: Annotated[WholeNumber, within(limits.MAX_BATCH_SEARCH)] = Field(
        gt=0, description="Sequences per microbatch on one pipeline.")
    datatype: Datatype = Field(Datatype.bfloat16, description="Compute datatype.")
    fused_activation: bool = Field(True, description="GeLU fused into the preceding matrix multiply.")
    fused_attention: bool = Field(
        True, description="FlashAttention: the attention core is one kernel and the s×s scores never reach HBM "
                          "(false: four kernels through HBM, as Megatron-LM in 2022 and Calculon model it).")
    attention_type: AttentionType = Field(AttentionType.multihead, description="multihead, or multiquery (one K/V head).")
    activation_recompute: Recompute = Field(Recompute.none, description="full | attn_only | none.")
    pipeline_interleaving: Annotated[WholeNumber, within(limits.NUM_BLOCKS)] = Field(
        1, gt=0, description="Model chunks per pipeline stage (1 = plain 1F1B).")
    optimizer_sharding: bool = Field(False, description="Shard optimizer state across DP (ZeRO-1).")
    tensor_par_comm_type: TPComm = Field(TPComm.ar, description="ar | p2p_rs_ag | rs_ag (= sequence parallelism).")
    tensor_par_overlap: TPOverlap = Field(TPOverlap.none, description="none | ring | pipe; true/false read as ring/none.")
    seq_par_ag_redo: bool = Field(False, description="Redo the sequence-parallel all-gather in backward instead of storing it.")
    data_par_overlap: bool = Field(False, description="Overlap DP gradient reduction with the backward pass.")
    weight_offload: bool = Field(False, description="Keep weights in offload memory, prefetching each block.")
    activations_offload: bool = Field(False, description="Keep stored activations in offload memory.")
    optimizer_offload: bool = Field(False, description="Keep optimizer state in offload memory; the step streams it.")
    training: bool = Field(True, description="Training (forward, backward, optimizer). Only training is modelled.")

    @field_validator("tensor_par_overlap", mode="before")
    @classmethod
    def _overlap_from_bool(cls, value: object) -> object:
        # Older Calculon files say true/false; true meant ring-style overlap.
        if isinstance(value, bool):
            return TPOverlap.ring if value else TPOverlap.none
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "Mapping":
        if self.tensor_par * self.pipeline_par * self.data_par != self.num_procs:
            raise ValueError(
                f"tensor_par({self.tensor_par})·pipeline_par({self.pipeline_par})·data_par({self.data_par})"
                f"={self.tensor_par * self.pipeline_par * self.data_par} ≠ num_procs({self.num_procs})")
        if self.batch_size % self.data_par:
            raise ValueError(f"batch_size({self.batch_size}) is not divisible by data_par({self.data_par})")
        local = self.batch_size // self.data_par
        if local % self.microbatch_size:
            raise ValueError(
                f"microbatch_size({self.microbatch_size}) does not divide the local batch "
                f"batch_size/data_par = {self.batch_size}/{self.data_par} = {local}")
        if self.pipeline_par == 1 and self.pipeline_interleaving != 1:
            raise ValueError(f"pipeline_interleaving({self.pipeline_interleaving}) needs pipeline_par > 1")
        if not self.training:
            raise ValueError("training: false (inference) is not modelled; only training iterations are")
        return self

    # ---- the short vocabulary used by the formulas ----
    @property
    def tp(self) -> int:
        return self.tensor_par

    @property
    def pp(self) -> int:
        return self.pipeline_par

    @property
    def dp(self) -> int:
        return self.data_par

    @property
    def local_batch(self) -> int:
        return self.batch_size // self.data_par

    @property
    def num_microbatches(self) -> int:
        return self.local_batch // self.microbatch_size

    @property
    def seq_par(self) -> bool:
        return self.tensor_par_comm_type is TPComm.rs_ag


def check_mapping_fits(model: Model, system: System, mapping: Mapping) -> None:
    """Rules that tie a mapping to a model and a system; raises InputError naming every value."""
    tp, pp, il = mapping.tp, mapping.pp, mapping.pipeline_interleaving
    if model.attn_heads % tp:
        raise InputError(f"tensor_par({tp}) does not divide attn_heads({model.attn_heads})")
    if model.hidden % tp:
        raise InputError(f"tensor_par({tp}) does not divide hidden({model.hidden})")
    if model.feedforward % tp:
        raise InputError(f"tensor_par({tp}) does not divide feedforward({model.feedforward})")
    if model.num_blocks % pp:
        raise InputError(f"pipeline_par({pp}) does not divide num_blocks({model.num_blocks})")
    if (model.num_blocks // pp) % il:
        raise InputError(
            f"pipeline_interleaving({il}) does not divide num_blocks/pipeline_par = "
            f"{model.num_blocks}/{pp} = {model.num_blocks // pp}")
    if mapping.seq_par and (mapping.microbatch_size * model.seq_size) % tp:
        raise InputError(
            f"sequence parallelism splits microbatch_size·seq_size = {mapping.microbatch_size}·{model.seq_size} "
            f"tokens, which tensor_par({tp}) does not divide")
    for field in ("tensor_par_net", "pipeline_par_net", "data_par_net"):
        index = getattr(mapping, field)
        if index >= len(system.networks):
            raise InputError(f"{field}: network {index} does not exist (system {system.name!r} has {len(system.networks)})")
    system.compute_for(mapping.datatype)
    if system.offload is None:
        for field in ("weight_offload", "activations_offload", "optimizer_offload"):
            if getattr(mapping, field):
                raise InputError(f"{field}: system {system.name!r} has no offload memory (try --offload-gib)")
