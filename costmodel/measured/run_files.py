"""Reading run files: four formats, told apart by their content.

- **This project's** (docs/training-runs.md): YAML or JSON, a list of runs or a mapping with
  `runs:` (and an optional `description`), each run the fields of costmodel.measured.runs.Run.
  Model and system files are relative to the run file; a bare name resolves in problems/.
- **Megatron-Bridge's published rows** as they are (costmodel.measured.run_bridge).
- **Single-GPU iterations** as measured (problems/runs/h200-single-gpu-pytorch.json): one
  record per iteration with the model's shape inline, `iteration_s` and `peak_mem_bytes`.
- **Training logs** (`log_runs:`): Megatron-LM or torchtitan logs with the launch file they ran
  (costmodel.frameworks.logs).

Every error is one line naming the file, the run (or row) and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodel.errors import InputError
from costmodel.frameworks.logs import is_log_runs, log_runs
from costmodel.inputs.load import describe_validation_error, read_document
from costmodel.inputs.model import Model
from costmodel.measured.run_bridge import bridge_runs, is_bridge_rows
from costmodel.measured.runs import Precision, Run

__all__ = ["RunFormat", "SingleGpuRow", "read_runs", "run_file_format", "single_gpu_run"]

RunFormat = Literal["project", "megatron-bridge", "single-gpu", "framework-logs"]

_SINGLE_GPU_MARKS = ("iteration_s", "peak_mem_bytes", "arch", "microbatches")
_SINGLE_GPU_SYSTEMS = {"H200": "h200-141g-nvl8", "H100": "h100-80g-nvl8"}


class SingleGpuRow(BaseModel):
    """One measured single-GPU iteration (eager PyTorch: bf16 weights, fp32 main gradients,
    fp32 master weights and fused AdamW; SDPA flash attention; norms and activations unfused)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    arch: Literal["gpt", "llama"]
    gpu: str
    hidden: int = Field(gt=0)
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int | None = Field(gt=0)
    ffn: int = Field(gt=0)
    seq: int = Field(gt=0)
    vocab: int = Field(gt=0)
    microbatch: int = Field(gt=0)
    microbatches: int = Field(gt=0, description="Microbatches accumulated per iteration.")
    recompute: Literal["none", "full"]
    iteration_s: float = Field(gt=0, description="The whole iteration, optimizer step included.")
    optimizer_s: float = Field(ge=0)
    model_tflops: float = Field(gt=0)
    peak_mem_bytes: float = Field(gt=0)
    peak_mem_rounded_to: str


def _single_gpu_model(row: SingleGpuRow) -> Model:
    """The measured model's shape. GPT rows: the GPT family's defaults (GeLU, layer norm,
    learned positions, biases, tied embeddings); Llama rows: SwiGLU, RMSNorm, RoPE, no biases,
    untied embeddings.

    The file does not say whether the Llama rows tie their embeddings (Llama 3.2 1B and 3B,
    whose shapes they have, do). Two measurements the model is not fitted to say they do not:
    the measured optimizer step (`optimizer_s`) is 1.07–1.09 × the model's for every GPT row
    and for the Llama rows untied (1.32 and 1.20 × tied), and the measured peaks exceed the
    tied model by about V·h·18 bytes (the untied output layer with its gradient and optimizer
    state: 4.4 GiB for llama-1b, 6.6 GiB for llama-3b) plus a part growing with the microbatch."""
    # The file's README: dropout 0.1 in the GPT rows, none in the Llama rows.
    llama = ({"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "bias": False, "dropout": False}
             if row.arch == "llama" else {})
    return Model(name=f"{row.name}", hidden=row.hidden, feedforward=row.ffn, seq_size=row.seq,
                 attn_heads=row.heads, attn_size=row.hidden // row.heads, num_blocks=row.layers,
                 vocab_size=row.vocab, kv_heads=row.kv_heads, tied_embeddings=row.arch != "llama", **llama)


def single_gpu_run(row: SingleGpuRow, source: str, file_label: str) -> Run:
    if row.gpu not in _SINGLE_GPU_SYSTEMS:
        raise InputError(f"{source}: field 'gpu' {row.gpu!r}: no system file for it "
                         f"(known: {', '.join(_SINGLE_GPU_SYSTEMS)})")
    return Run(name=f"{row.name}-mb{row.microbatch}-{row.recompute}", model=_single_gpu_model(row),
               system=_SINGLE_GPU_SYSTEMS[row.gpu], num_gpus=1, seq_size=row.seq,
               global_batch=row.microbatch * row.microbatches, microbatch=row.microbatch, recompute=row.recompute,
               sharding_stage=0, dp_overlap=False, fused_activation=False, fused_cross_entropy=False,
               precision=Precision.bf16,
               step_time_s=row.iteration_s, peak_memory_bytes=row.peak_mem_bytes,
               published_tflops_per_gpu=row.model_tflops, configuration=f"{row.name} mb{row.microbatch} "
               f"{row.recompute}", source=file_label,
               notes=f"eager PyTorch on one {row.gpu}; peak memory rounded to {row.peak_mem_rounded_to}")


def run_file_format(data: Any) -> RunFormat:
    """Which of the four formats a parsed document is."""
    if is_bridge_rows(data):
        return "megatron-bridge"
    if is_log_runs(data):
        return "framework-logs"
    if (isinstance(data, list) and data and isinstance(data[0], dict)
            and all(mark in data[0] for mark in _SINGLE_GPU_MARKS)):
        return "single-gpu"
    return "project"


def _resolved(value: Any, base: Path) -> Any:
    """A model or system written as a path, made absolute against the run file's folder; a
    bare name (no '/', no file suffix) or an inline model stays as written."""
    if not isinstance(value, str):
        return value
    if "/" not in value and not value.endswith((".yaml", ".yml", ".json")):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _project_runs(data: Any, path: Path) -> tuple[Run, ...]:
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"runs", "description"})
        if unknown:
            raise InputError(f"{path}: unknown field '{unknown[0]}' (a run file holds 'runs' and 'description')")
        if "runs" not in data:
            raise InputError(f"{path}: missing field 'runs'")
        data = data["runs"]
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: 'runs' must be a non-empty list of runs")
    runs, seen = [], {}
    for index, record in enumerate(data):
        name = record.get("name") if isinstance(record, dict) else None
        source = f"{path}: run {index + 1}" + (f" ({name})" if isinstance(name, str) else "")
        if not isinstance(record, dict):
            raise InputError(f"{source}: expected a mapping of field names to values, got {type(record).__name__}")
        record = {**record, **{key: _resolved(record[key], path.parent) for key in ("model", "system")
                               if key in record}}
        try:
            run = Run.model_validate(record)
        except ValidationError as err:
            raise InputError(describe_validation_error(err, Run, source)) from None
        if run.name in seen:
            raise InputError(f"{source}: name {run.name!r} is given twice (runs {seen[run.name]} and {index + 1})")
        seen[run.name] = index + 1
        runs.append(run)
    return tuple(runs)


def _single_gpu_runs(data: list, path: Path) -> tuple[Run, ...]:
    runs = []
    for index, record in enumerate(data):
        source = f"{path}: row {index + 1}"
        if not isinstance(record, dict):
            raise InputError(f"{source}: expected a record of field names to values, got {type(record).__name__}")
        try:
            row = SingleGpuRow.model_validate(record)
        except ValidationError as err:
            raise InputError(describe_validation_error(err, SingleGpuRow, source)) from None
        runs.append(single_gpu_run(row, source, f"{path.name} row {index + 1}"))
    return tuple(runs)


def read_runs(path: str | Path) -> tuple[Run, ...]:
    """Every run of a run file in any of the four formats (an InputError naming the file,
    run and field when one is malformed)."""
    path = Path(path)
    data = read_document(path)
    kind = run_file_format(data)
    if kind == "megatron-bridge":
        return bridge_runs(data, path)
    if kind == "single-gpu":
        return _single_gpu_runs(data, path)
    if kind == "framework-logs":
        return log_runs(data, path)
    return _project_runs(data, path)
