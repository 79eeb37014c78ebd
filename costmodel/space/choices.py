"""The categorical choices of a mapping, as enums (their order is their code order in
costmodel.space.dimensions)."""

from __future__ import annotations

from enum import Enum


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


class CPComm(str, Enum):
    """Context-parallel communication, Megatron-Core's `--cp-comm-type` (TransformerEngine
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): p2p, the
    K/V ring overlapped with the attention core's steps (AttnFuncWithCPAndKVP2P; Liu et al.
    2023); all_gather, K and V all-gathered over the cp group before the core and dK, dV
    reduce-scattered after it, not overlapped (AttnFuncWithCPAndKVAllGather; Llama 3, Dubey
    et al. 2024 §3.3.2); a2a, DeepSpeed-Ulysses: all-to-alls re-shard Q, K, V from the
    sequence to the heads before the core and the output back after it
    (AttnFuncWithCPAndQKVOA2A; Jacobs et al. 2023)."""

    p2p = "p2p"
    all_gather = "all_gather"
    a2a = "a2a"


class ShardingStage(str, Enum):
    """How much of the training state is sharded over the data-parallel group (ZeRO,
    Rajbhandari et al. 2020 §5; PyTorch FSDP's SHARD_GRAD_OP is stage 2, FULL_SHARD stage 3):
    nothing (0, replicated); the optimizer state (1: ZeRO-1, Megatron-LM's distributed
    optimizer, Calculon's `optimizer_sharding`); and the gradients (2: reduce-scatter
    instead of all-reduce); and the parameters (3: all-gathered per block in forward and
    again in backward). The member names say what the stage adds; the values are the stage
    numbers people write."""

    none = "0"
    optimizer = "1"
    gradients = "2"
    parameters = "3"


class PipelineSchedule(str, Enum):
    """The pipeline schedule: 1F1B (interleaved over the chunks when pipeline_interleaving > 1,
    Narayanan et al. 2021), or ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
    2024, §3.1): backward split into the activation-gradient pass B and the weight-gradient
    pass W, the W passes deferred to fill the cool-down bubble, at 1F1B's peak memory.
    ZB-H1 is defined on the non-interleaved schedule; with interleaving > 1 it changes
    nothing (the interleaved 1F1B schedule runs, and ties go to 1f1b, enumerated first). A
    file's `interleaved` reads as 1f1b with pipeline_interleaving > 1."""

    one_f_one_b = "1f1b"
    zb_h1 = "zb-h1"


class AttentionType(str, Enum):
    """Calculon's name for the attention kind. The model carries it (`kv_heads`); a mapping
    file that states it is read as a setting of the problem (`model_with_attention_type`)."""

    multihead = "multihead"
    multiquery = "multiquery"
