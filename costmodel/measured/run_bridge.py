"""Megatron-Bridge's published pre-training rows, read as they are published.

The rows file (problems/runs/megatron-bridge-pretraining.json, one record per row of
NVIDIA-NeMo/Megatron-Bridge's docs/performance-summary.md and its archive) states the table's
cells: system, GPUs, precision, global and micro batch, sequence, tp, pp, cp, vp, ep, the
Megatron-FSDP group, and the measured tokens/s per GPU. From them:

    step time = gbs · seq / (tokens_per_s_per_gpu · num_gpus)      (s)
    dp        = num_gpus / (tp · pp · cp)

The table does not state how memory was saved. The performance scripts' workload presets
did (activation offload of N blocks, recompute of N blocks, CUDA graphs); they were read per
row at the release that ran it and written to problems/runs/megatron-bridge-workload-settings.yaml
(path, preset and commit cited). A preset whose parallelism differs from the table's row is
recorded but not applied: that row ran other settings, which were not published.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodel.errors import InputError
from costmodel.inputs.kernels import MoeDispatcher, MoeFlexBackend
from costmodel.inputs.load import describe_validation_error, read_document
from costmodel.measured.runs import PROBLEMS_DIR, CudaGraphs, Precision, Run

__all__ = ["BRIDGE_MODELS", "BRIDGE_SYSTEMS", "WORKLOAD_SETTINGS", "BridgeRow", "WorkloadSettings",
           "bridge_configuration", "bridge_runs", "bridge_step_time_s", "is_bridge_rows", "load_workload_settings",
           "published_configuration"]

WORKLOAD_SETTINGS = PROBLEMS_DIR / "runs" / "megatron-bridge-workload-settings.yaml"

BRIDGE_MODELS = {"llama3_8b": "llama-3.1-8b", "llama3_70b": "llama-3.1-70b", "llama31_405b": "llama-3.1-405b",
                 "deepseek_v3": "deepseek-v3", "gpt_oss_120b": "gpt-oss-120b"}
"""Model keys of the rows → model names of problems/models. Llama 3 8B and 70B have the
architecture of Llama 3.1 8B and 70B in every field the cost model reads (hidden, layers,
heads, key/value heads, feed-forward, vocabulary 128,256, untied embeddings); Llama 3.1 adds
only RoPE scaling for a 128k context, which costs nothing more at sequence 8,192. The
mixture-of-experts models read problems/models/deepseek-v3 and gpt-oss-120b (their Hugging
Face config.json); `mapsat validate` and the training-runs benchmark still score the dense
rows only (costmodel.measured.run_scoring.split_dense)."""
ROUTER_LOSS_OFF = {("deepseek_v3", "25.09")}
"""Rows whose model trained without its load-balancing loss: 25.09's DeepSeek-V3 (Megatron-Bridge r0.1.0,
684a686: DeepSeekV3Provider, src/megatron/bridge/models/deepseek/deepseek_provider.py l.163-189, sets
seq_aux_loss but no moe_aux_loss_coeff, so Megatron-Core's 0.0 stands and the router skips the loss,
router.py is_aux_loss_enabled; v0.2.0's DeepSeekV3ModelProvider sets 1e-4, l.184, as the later bridges)."""

BRIDGE_SYSTEMS = {"DGX-H100": "h100-80g-nvl8", "DGX-B200": "b200-180g-nvl8", "DGX-GB200": "gb200-186g-nvl72"}

FLEX_BACKEND_SMS = {"deepep": 20, "hybridep": 32}
"""SMs the flex dispatcher's kernels hold, by backend, as the rows ran them: DeepEP at
Megatron-LM's default (megatron/core/transformer/moe/fused_a2a.py sets DeepEP's Buffer.set_num_sms
from moe_deepep_num_sms, "historical default 20", transformer_config.py; no DeepSeek-V3 preset
overrides it), HybridEP at 32 (Megatron-Bridge scripts/performance/utils/overrides.py sets
moe_hybridep_num_sms = 32 whenever the backend is hybridep, v0.4.2; the 26.08 GPT-OSS full-iteration
settings likewise, perf_recipes/gpt_oss/common.py)."""

SYSTEM_SMS = {"DGX-H100": 132, "DGX-B200": 148, "DGX-GB200": 148}
"""Streaming multiprocessors per GPU: H100 SXM5 132 (NVIDIA H100 Tensor Core GPU
Architecture whitepaper, 2022); B200 148, two dies of 74 enabled (Chips and Cheese, "Nvidia's
B200: Keeping the CUDA Juggernaut Rolling", 2025), the same GPU in GB200."""

_PRECISIONS = {"BF16": Precision.bf16, "FP8-CS": Precision.fp8_tensorwise, "MXFP8": Precision.mxfp8,
               "NVFP4": Precision.nvfp4}
# 25.09's table states no precision; the rows' `precision_inferred` reads its footnote.
_INFERRED = (("FP8 per-tensor", Precision.fp8_tensorwise), ("MXFP8", Precision.mxfp8),
             ("FP8 blockwise", Precision.fp8_blockwise))
_MARKS = ("tokens_per_s_per_gpu", "table_row", "model_key")


class BridgeRow(BaseModel):
    """The fields of one published row this project reads (the file has more: the row
    verbatim, the recipe of that name today, notes)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)

    id: str
    container: str
    system: str
    model_key: str
    num_gpus: int = Field(gt=0)
    precision_norm: str | None
    precision_inferred: str | None
    gbs: int = Field(gt=0)
    mbs: int = Field(gt=0)
    seq: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    cp: int = Field(gt=0)
    vp: int | None = Field(gt=0)
    ep: int | None = Field(gt=0)
    etp: int | None = Field(None, gt=0)
    fsdp: int | None = Field(ge=0)
    tokens_per_s_per_gpu: float | None = Field(gt=0)
    tflops_per_gpu: float | None = Field(gt=0)
    source: str
    notes: str = ""
    mtp: bool | None = None

    @property
    def precision_label(self) -> str:
        """The precision as published, or as inferred (marked) where the table states none."""
        return self.precision_norm or f"{self.precision_inferred} [inferred]"


class WorkloadSettings(BaseModel):
    """What Megatron-Bridge's performance scripts set for some rows, beyond the table."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rows: tuple[str, ...] = Field(description="Ids of the rows these settings belong to.")
    applies: bool = Field(description="False when the preset's parallelism differs from the table's (beyond the "
                                      "global batch): the row ran other settings.")
    ref: str = Field(description="The Megatron-Bridge release (tag or branch) read.")
    commit: str = Field(description="Its commit.")
    path: str = Field(description="The file read.")
    preset: str = Field(description="The preset (or perf_matrix entry) of the row's model, GPU and precision.")
    preset_parallelism: dict[str, Any] = Field(description="The preset's own parallelism and batch.")
    differs_from_table: tuple[str, ...] = Field(description="Preset fields that differ from the table's row.")
    megatron_fsdp: bool
    activation_offload_blocks: int = Field(ge=0, description="cpu_offloading_num_layers (0: none).")
    recompute_blocks: int | None = Field(description="recompute_num_layers with recompute_method block.")
    recompute_modules: tuple[str, ...]
    cuda_graphs: CudaGraphs
    tp_comm_overlap: bool
    sequence_parallel: bool
    low_precision_param_gather: bool = Field(description="fp8_param_gather (fp4_param_gather for NVFP4).")
    bf16_first_last_blocks: int = Field(ge=0)
    overlap_param_gather: bool
    microbatch: int | None = Field(None, gt=0, description="The row's micro-batch where its MBS cell contradicts its "
                                   "own GA cell (GA = GBS / (MBS · DP)) and the preset agrees with GA; none: the "
                                   "table's MBS.")
    expert_tensor_parallel: int | None = Field(
        None, gt=0, description="expert_tensor_parallel_size (mixture-of-experts rows; the row's etp cell wins).")
    moe_dispatcher: MoeDispatcher | None = Field(
        None, description="moe_token_dispatcher_type as the run set it: flex where the preset names a flex backend "
                          "the GPU takes (apply_flex_dispatcher_backend), else alltoall; None for dense rows.")
    moe_flex_backend: MoeFlexBackend | None = Field(None, description="moe_flex_dispatcher_backend (deepep, hybridep).")
    moe_comm_overlap: bool = Field(False, description="moe_a2a_overlap: overlap_moe_expert_parallel_comm and "
                                                      "delay_wgrad_compute.")
    pipeline_layout: str | None = Field(
        None, description="pipeline_model_parallel_layout as set (a layout list written as Megatron's string).")
    grad_reduce_in_fp32: bool | None = Field(
        None, description="grad_reduce_in_fp32 as set (False: gradients kept and reduced in BF16); None: not "
                          "recorded, costed as float32.")
    notes: str = ""


class _SettingsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    releases: dict[str, dict[str, str]] = Field(description="Container → the release read and its commit.")
    settings: tuple[WorkloadSettings, ...]


def load_workload_settings(path: Path = WORKLOAD_SETTINGS) -> dict[str, WorkloadSettings]:
    """The extracted workload settings by row id (an InputError if the file is malformed)."""
    data = read_document(path)
    try:
        parsed = _SettingsFile.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, _SettingsFile, str(path))) from None
    by_row: dict[str, WorkloadSettings] = {}
    for entry in parsed.settings:
        for row in entry.rows:
            if row in by_row:
                raise InputError(f"{path}: row {row!r} has two entries")
            by_row[row] = entry
    return by_row


def is_bridge_rows(data: Any) -> bool:
    """True for Megatron-Bridge's rows file: a list of records with its marks."""
    return (isinstance(data, list) and bool(data) and isinstance(data[0], dict)
            and all(mark in data[0] for mark in _MARKS))


def bridge_step_time_s(gbs: int, seq: int, tokens_per_s_per_gpu: float, num_gpus: int) -> float:
    """One step's time from the published throughput: its gbs·seq tokens at
    tokens_per_s_per_gpu on each of num_gpus GPUs."""
    return gbs * seq / (tokens_per_s_per_gpu * num_gpus)


def published_configuration(row: BridgeRow) -> str:
    """The row's cells as published: 58 distinct among the 96 rows (37 dense), the count the
    data's README gives. It tells 'EP n/a' from 'EP 1' and a missing FSDP column from
    'FSDP 0', which are the same setup."""
    return (f"{row.model_key} {row.system} {row.num_gpus} {row.precision_label} gbs{row.gbs} mbs{row.mbs} "
            f"seq{row.seq} tp{row.tp} pp{row.pp} cp{row.cp} vp{row.vp} ep{row.ep} fsdp{row.fsdp}")


def bridge_configuration(row: BridgeRow) -> str:
    """The setup a row measured, the same whichever release ran it: the published cells with
    'n/a' read as 1 (VP, EP) and a missing FSDP column as 0. The 96 rows hold 51 (31 dense):
    the table's formatting alone splits five dense setups into eleven published ones (Llama
    3.1 405B on GB200 in FP8-CS, MXFP8 and NVFP4 and on H100, Llama 3 70B on GB200 in FP8-CS,
    published with 'EP 1' or 'n/a', with or without an FSDP column). A precision the table
    does not state (25.09) stays apart from a stated one."""
    return (f"{row.model_key} {row.system} {row.num_gpus} GPUs {row.precision_label} gbs {row.gbs} mbs {row.mbs} "
            f"seq {row.seq} tp {row.tp} pp {row.pp} cp {row.cp} vp {row.vp or 1} ep {row.ep or 1} "
            f"fsdp {row.fsdp or 0}")


def _precision(row: BridgeRow, source: str) -> Precision:
    if row.precision_norm is not None:
        if row.precision_norm not in _PRECISIONS:
            raise InputError(f"{source}: field 'precision_norm' {row.precision_norm!r}: not one of "
                             f"{', '.join(_PRECISIONS)}")
        return _PRECISIONS[row.precision_norm]
    for prefix, precision in _INFERRED:
        if (row.precision_inferred or "").startswith(prefix):
            return precision
    raise InputError(f"{source}: field 'precision_inferred' {row.precision_inferred!r}: neither a stated nor a "
                     f"recognised inferred precision")


def dispatcher_sm_share(system: str, settings: WorkloadSettings) -> float | None:
    """The share of the GPU's SMs the flex dispatcher held while it overlapped compute
    (FLEX_BACKEND_SMS over SYSTEM_SMS); None unless the row ran the flex dispatcher with
    moe_a2a_overlap on a system of known SM count."""
    if settings.moe_dispatcher != "flex" or not settings.moe_comm_overlap:
        return None
    sms = FLEX_BACKEND_SMS.get(settings.moe_flex_backend or "")
    total = SYSTEM_SMS.get(system)
    return None if sms is None or total is None else sms / total


def _settings_fields(row: BridgeRow, settings: WorkloadSettings | None) -> tuple[dict, list[str]]:
    """The run fields the workload settings give this row, and notes."""
    if settings is None:
        return {}, ["no workload settings extracted for this row"]
    cited = f"workload settings: {settings.path} {settings.preset} at {settings.ref} ({settings.commit[:12]})"
    fields: dict[str, Any] = {"tp_comm_overlap": settings.tp_comm_overlap and row.tp > 1,
                              "low_precision_param_gather": settings.low_precision_param_gather,
                              "bf16_first_last_blocks": settings.bf16_first_last_blocks}
    if settings.grad_reduce_in_fp32 is not None:      # benchmark-wide: set whatever the preset
        fields.update(grad_datatype="float32" if settings.grad_reduce_in_fp32 else "16bit")
    if not settings.applies:
        return fields, [f"{cited}, not applied: its {', '.join(settings.differs_from_table)} differ from the table"]
    fields.update(activation_offload_blocks=settings.activation_offload_blocks, cuda_graphs=settings.cuda_graphs,
                  param_gather_overlap=settings.overlap_param_gather)
    if settings.recompute_blocks is not None:
        fields.update(recompute="full", recompute_blocks=settings.recompute_blocks)
    elif settings.recompute_modules:
        fields.update(recompute="selective", recompute_modules=settings.recompute_modules)
    if settings.moe_dispatcher is not None:
        fields.update(moe_dispatcher=settings.moe_dispatcher, moe_comm_overlap=settings.moe_comm_overlap)
        if settings.moe_dispatcher == "flex" and settings.moe_flex_backend is not None:
            fields.update(moe_flex_backend=settings.moe_flex_backend)
        share = dispatcher_sm_share(row.system, settings)
        if share is not None:
            fields.update(moe_dispatcher_sm_share=share)
        if row.etp is None and settings.expert_tensor_parallel is not None:
            fields.update(etp=settings.expert_tensor_parallel)
    if settings.pipeline_layout is not None:
        fields.update(pipeline_layout=settings.pipeline_layout)
    return fields, [cited] + ([settings.notes] if settings.notes else [])


def bridge_run(row: BridgeRow, settings: WorkloadSettings | None, source: str) -> Run:
    """One published row as a Run (the table's cells, the workload settings where they apply)."""
    precision = _precision(row, source)
    fields, notes = _settings_fields(row, settings)
    if precision is Precision.bf16:
        fields.update(low_precision_param_gather=False, bf16_first_last_blocks=0)
    step_s = None
    if row.tokens_per_s_per_gpu is not None:
        step_s = bridge_step_time_s(row.gbs, row.seq, row.tokens_per_s_per_gpu, row.num_gpus)
    else:
        notes.append("no throughput published")
    fsdp = bool(row.fsdp)
    microbatch = settings.microbatch if settings is not None and settings.microbatch is not None else row.mbs
    data = {
        "name": row.id, "model": BRIDGE_MODELS.get(row.model_key, row.model_key.replace("_", "-")),
        "system": BRIDGE_SYSTEMS.get(row.system, row.system), "num_gpus": row.num_gpus, "seq_size": row.seq,
        "global_batch": row.gbs, "microbatch": microbatch, "tp": row.tp, "cp": row.cp, "pp": row.pp,
        "ep": row.ep or 1, "etp": row.etp, "interleaving": row.vp or 1, "megatron_fsdp": fsdp, "sharding_stage": 3 if fsdp else 1,
        "precision": precision, "precision_stated": row.precision_norm is not None, "step_time_s": step_s,
        "published_tflops_per_gpu": row.tflops_per_gpu, "software": row.container,
        "configuration": bridge_configuration(row), "source": row.source,
        "notes": "; ".join(part for part in [row.notes, *notes] if part),
        **({"mtp_blocks": 0} if row.mtp is False else {}),
        **({"router_load_balancing": "none"} if (row.model_key, row.container) in ROUTER_LOSS_OFF else {}), **fields}
    try:
        return Run.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Run, source)) from None


def bridge_runs(data: list, path: Path, settings: dict[str, WorkloadSettings] | None = None) -> tuple[Run, ...]:
    """Every row of a Megatron-Bridge rows file as a Run; errors name the file, row and field."""
    if settings is None:
        settings = load_workload_settings() if WORKLOAD_SETTINGS.is_file() else {}
    runs = []
    for index, record in enumerate(data):
        rid = record.get("id") if isinstance(record, dict) else None
        source = f"{path}: row {index + 1}" + (f" ({rid})" if rid else "")
        if not isinstance(record, dict):
            raise InputError(f"{source}: expected a record of field names to values, got {type(record).__name__}")
        try:
            row = BridgeRow.model_validate(record)
        except ValidationError as err:
            raise InputError(describe_validation_error(err, BridgeRow, source)) from None
        runs.append(bridge_run(row, settings.get(row.id), source))
    return tuple(runs)

