"""Training logs read as measured runs: Megatron-LM's and torchtitan's, with the launch file they ran.

A log-runs file (YAML) lists, under `log_runs`, one entry per log:

    log_runs:
      - name: mixtral-8x7b-16xh100          # a label, unique in the file
        log: mixtral.log                     # the training log (relative to this file)
        configuration: mixtral-launch.sh     # what it ran: Megatron-LM arguments, Megatron-Bridge
                                             #   overrides or a torchtitan job TOML
        model: mixtral-8x7b                  # as a run file names them (costmodel.measured.runs)
        system: h100-80g-nvl8
        warmup_iterations: 1                 # the first logged iterations left out
        source: "where the log comes from"

Megatron-LM's lines give `elapsed time per iteration (ms)` and `throughput per GPU
(TFLOP/s/GPU)` (megatron/training/training.py training_log) and, where it reports memory, the
largest `max reserved` (MiB) as the peak; torchtitan's give `tps` (tokens per
second per GPU), `tflops`, `mfu` and `memory` (GiB, the allocator's peak reserved). After the
warm-up, the step time is the median of the iterations' (torchtitan: global batch · sequence /
(tps · GPUs), the tokens of a step over the whole job's rate); the spread (min to max over the
median) goes in the run's notes. The run's other fields are the configuration's, read as
`--mapping` reads it (costmodel.frameworks), so a log and its launch file become the same
costmodel.measured.runs.Run a run file would state.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from costmodel.errors import InputError
from costmodel.frameworks.launch import launch_settings
from costmodel.inputs.load import describe_validation_error, load_model
from costmodel.inputs.units import GiB, MiB
from costmodel.measured.runs import PROBLEMS_DIR, Run

__all__ = ["IterationRecord", "LogRunEntry", "is_log_runs", "log_runs", "megatron_iterations",
           "megatron_peak_memory_bytes", "torchtitan_iterations"]

SHAPE_ONLY_SEQ = 4096
"""The sequence length a model is loaded with to read a launch file (any: the run's replaces it)."""
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_MEMORY = re.compile(r"memory \(MB\).*?\| max reserved:\s*([\d.]+)")
_TORCHTITAN = re.compile(r"step:\s*(\d+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?tflops:\s*([\d.]+)"
                         r".*?mfu:\s*([\d.]+)%")


@dataclass(frozen=True)
class IterationRecord:
    """One logged iteration: its number and what the log says of it (SI units; None: not logged)."""

    iteration: int
    step_time_s: float | None
    tflops_per_gpu: float | None
    tokens_per_s_per_gpu: float | None = None
    peak_memory_bytes: float | None = None
    global_batch: int | None = None


def megatron_iterations(text: str) -> list[IterationRecord]:
    """Megatron-LM's iteration lines (training_log), in order."""
    records = []
    for line in text.splitlines():
        match = _MEGATRON.search(line)
        if match is None:
            continue
        tflops, batch = _MEGATRON_TFLOPS.search(line), _MEGATRON_BATCH.search(line)
        records.append(IterationRecord(int(match.group(1)), float(match.group(2)) / 1e3,
                                       float(tflops.group(1)) if tflops else None,
                                       global_batch=int(batch.group(1)) if batch else None))
    return records


def megatron_peak_memory_bytes(text: str) -> float | None:
    """The largest `max reserved` of Megatron-LM's memory reports (report_memory,
    megatron/training/utils/common_utils.py: MB there are MiB), the allocator's peak as torchtitan
    reports it too; None when the log has none."""
    peaks = [float(m.group(1)) * MiB for m in map(_MEGATRON_MEMORY.search, text.splitlines()) if m is not None]
    return max(peaks) if peaks else None


def torchtitan_iterations(text: str) -> list[IterationRecord]:
    """torchtitan's metric lines (components/metrics.py log), in order; the step time follows
    from tps once the job's tokens per step are known."""
    return [IterationRecord(int(m.group(1)), None, float(m.group(4)), float(m.group(3).replace(",", "")),
                            float(m.group(2)) * GiB)
            for m in map(_TORCHTITAN.search, text.splitlines()) if m is not None]


class LogRunEntry(BaseModel):
    """One entry of a log-runs file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    log: str = Field(description="The training log, relative to the log-runs file.")
    configuration: str = Field(description="The launch file the log ran, relative to the log-runs file.")
    model: str = Field(description="A model file (relative to the log-runs file) or a name of problems/models.")
    system: str = Field(description="A system file (relative to the log-runs file) or a name of problems/systems.")
    warmup_iterations: int = Field(1, ge=0, description="The first logged iterations left out.")
    source: str = ""
    notes: str = ""


def is_log_runs(data: Any) -> bool:
    """True for a log-runs file: a mapping with `log_runs`."""
    return isinstance(data, dict) and "log_runs" in data


def _file(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _model_file(name: str, base: Path) -> Path:
    if "/" in name or name.endswith((".yaml", ".yml", ".json")):
        return _file(name, base)
    for candidate in (PROBLEMS_DIR / "models" / name / "config.json", PROBLEMS_DIR / "models" / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    raise InputError(f"model {name!r}: not in problems/models (no {name}.yaml or {name}/config.json)")


def _measured(records: list[IterationRecord], warmup: int, tokens_per_step: int, num_gpus: int,
              where: str) -> dict:
    """The run's measured fields from the iterations after the warm-up, and the spread."""
    kept = records[warmup:]
    if not kept:
        raise InputError(f"{where}: {len(records)} iteration line(s), none after {warmup} warm-up iteration(s)")
    times = [r.step_time_s if r.step_time_s is not None else tokens_per_step / (r.tokens_per_s_per_gpu * num_gpus)
             for r in kept]
    median = statistics.median(times)
    tflops = [r.tflops_per_gpu for r in kept if r.tflops_per_gpu is not None]
    peaks = [r.peak_memory_bytes for r in kept if r.peak_memory_bytes is not None]
    spread = (f"median of {len(kept)} iterations ({kept[0].iteration}-{kept[-1].iteration}, {warmup} warm-up left "
              f"out): {1e3 * median:.1f} ms, spread {1e3 * min(times):.1f}-{1e3 * max(times):.1f} ms "
              f"({100 * (max(times) - min(times)) / median:.1f} % of the median)")
    return {"step_time_s": median, "published_tflops_per_gpu": statistics.median(tflops) if tflops else None,
            "peak_memory_bytes": max(peaks) if peaks else None, "notes": spread}


def log_run(entry: LogRunEntry, base: Path, where: str) -> Run:
    """The run one log and its launch file measured."""
    # the model's shape decides how the launch file reads (blocks, experts); its sequence length,
    # which a Hugging Face config does not state, is the launch file's and replaces this one
    model = load_model(_model_file(entry.model, base), seq_size=SHAPE_ONLY_SEQ)
    system = entry.system if "/" not in entry.system else str(_file(entry.system, base))
    configuration = _file(entry.configuration, base)
    fields = launch_settings(_read(configuration, where), str(configuration), model, where)
    log_text = _read(_file(entry.log, base), where)
    records = megatron_iterations(log_text) or torchtitan_iterations(log_text)
    if not records:
        raise InputError(f"{where}: {entry.log}: no Megatron-LM or torchtitan iteration line")
    logged = {r.global_batch for r in records if r.global_batch is not None}
    if logged and logged != {fields["global_batch"]}:
        raise InputError(f"{where}: the log's global batch size {sorted(logged)} is not the configuration's "
                         f"{fields['global_batch']}")
    tokens = fields["global_batch"] * fields["seq_size"]
    measured = _measured(records, entry.warmup_iterations, tokens, fields["num_gpus"], where)
    if measured["peak_memory_bytes"] is None:
        measured["peak_memory_bytes"] = megatron_peak_memory_bytes(log_text)
    notes = "; ".join(part for part in (entry.notes, measured.pop("notes")) if part)
    named = "/" not in entry.model and not entry.model.endswith((".yaml", ".yml", ".json"))
    data = {"name": entry.name, "model": entry.model if named else str(_model_file(entry.model, base)),
            "system": system, **fields,
            **measured, "source": entry.source or str(_file(entry.log, base)), "notes": notes}
    try:
        return Run.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Run, where)) from None


def _read(path: Path, where: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{where}: {path}: cannot read ({getattr(err, 'strerror', None) or err})") from None


def log_runs(data: dict, path: Path) -> tuple[Run, ...]:
    """Every run of a log-runs file; errors name the file, the entry and the field."""
    unknown = sorted(set(data) - {"log_runs", "description"})
    if unknown:
        raise InputError(f"{path}: unknown field '{unknown[0]}' (a log-runs file holds 'log_runs' and 'description')")
    entries = data["log_runs"]
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: 'log_runs' must be a non-empty list")
    runs = []
    for index, record in enumerate(entries):
        where = f"{path}: log run {index + 1}"
        try:
            entry = LogRunEntry.model_validate(record)
        except ValidationError as err:
            raise InputError(describe_validation_error(err, LogRunEntry, where)) from None
        runs.append(log_run(entry, path.parent, where))
    if len({run.name for run in runs}) != len(runs):
        raise InputError(f"{path}: two log runs have the same name")
    return tuple(runs)
