"""Measured runs against the cost model: each run's predicted step time (and peak memory)
beside the measured one, and summaries by group.

    inputs = RunInputs()                          # resolves and caches models and systems
    scores = score_runs(runs, inputs)             # one RunScore per run
    newest, older = newest_per_configuration(runs)
    summarize(scores, by_system)                  # median |error|, mean signed error per group
    held_out_splits(runs, group_of)               # folds leaving out a configuration or a system

The pieces are separate so that a fit of whole-step terms (`calibrate --runs`) and
out-of-sample reports (leave one configuration out, leave a system out) can score any subset
against any system files; `validate_runs` (costmodel.measured.run_report) puts them together for
`mapsat validate --runs`.

Error is signed: (predicted − measured) / measured; negative means the model is too fast.
Peak memory is compared as the allocator sees it: the model's HBM per GPU without its
runtime reserve (CUDA context, NCCL buffers, fragmentation), which an allocator's peak does
not count.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Literal

from costmodel.errors import InputError
from costmodel.evaluate import evaluate
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.model import Model
from costmodel.measured.run_mapping import map_run
from costmodel.measured.runs import PROBLEMS_DIR, Precision, Run, software_order
from costmodel.inputs.system import Datatype, System

__all__ = ["ErrorSummary", "RunInputs", "RunScore", "RunStatus", "by_configuration", "by_precision", "by_system",
           "held_out_splits", "is_targeted", "newest_per_configuration", "score_run", "score_runs", "split_dense",
           "summarize"]

RunStatus = Literal["scored", "infeasible", "not_modelled", "not_measured"]
"""scored: predicted and measured; infeasible: the model calls the mapping infeasible (the
reasons say why; its time is still predicted, not summarised); not_modelled: the run cannot
be put to the model (no model file, a mapping the model rejects); not_measured: no step time."""


class RunInputs:
    """Models and systems for runs, each loaded once. A run names them by file or by a name
    of problems/; `systems` replaces a system by name (`{"h100-80g-nvl8": System}`: score
    runs on other system files), `system` replaces every run's."""

    def __init__(self, systems: dict[str, System] | None = None, system: System | None = None,
                 problems: Path = PROBLEMS_DIR):
        self._system_overrides = dict(systems or {})
        self._system_for_all = system
        self._problems = problems
        self._models: dict[tuple[str, int], Model] = {}
        self._systems: dict[str, System] = {}

    def _model_path(self, name: str) -> Path:
        path = Path(name)
        if path.is_absolute() or "/" in name:
            return path
        for candidate in (self._problems / "models" / name / "config.json",
                          self._problems / "models" / f"{name}.yaml"):
            if candidate.is_file():
                return candidate
        raise InputError(f"model {name!r}: not in problems/models (no {name}.yaml or {name}/config.json)")

    def with_systems(self, systems: dict[str, System]) -> "RunInputs":
        """The same inputs with these systems replacing theirs by name (the loaded models and
        systems are shared, not loaded again): how a fit scores candidate system files. A system
        given for every run (`system=`) gives way to these; name every system the runs use."""
        other = RunInputs({**self._system_overrides, **systems}, None if systems else self._system_for_all,
                          self._problems)
        other._models, other._systems = self._models, self._systems
        return other

    def model(self, run: Run) -> Model:
        if isinstance(run.model, Model):
            return run.model.model_copy(update={"seq_size": run.seq_size})
        key = (run.model, run.seq_size)
        if key not in self._models:
            self._models[key] = load_model(self._model_path(run.model), seq_size=run.seq_size)
        model = self._models[key]
        if run.mtp_blocks is not None and run.mtp_blocks != model.mtp_blocks:
            model = model.model_copy(update={"mtp_blocks": run.mtp_blocks})
        if run.router_load_balancing is not None and run.router_load_balancing != model.router_load_balancing:
            model = model.model_copy(update={"router_load_balancing": run.router_load_balancing})
        return model

    def system(self, run: Run) -> System:
        if self._system_for_all is not None:
            return self._system_for_all
        if run.system in self._system_overrides:
            return self._system_overrides[run.system]
        if run.system not in self._systems:
            path = Path(run.system)
            if not (path.is_absolute() or "/" in run.system):
                path = self._problems / "systems" / f"{run.system}.yaml"
                if not path.is_file():
                    raise InputError(f"system {run.system!r}: not in problems/systems (no {run.system}.yaml)")
            self._systems[run.system] = load_system(path)
        return self._systems[run.system]


@dataclass(frozen=True)
class RunScore:
    """One run beside the model's prediction."""

    run: Run
    status: RunStatus
    system_name: str
    datatype: Datatype | None = None
    predicted_step_s: float | None = None
    predicted_peak_bytes: float | None = None
    reasons: tuple[str, ...] = ()          # infeasible or not modelled: why
    not_expressible: tuple[str, ...] = ()  # settings mapped to the nearest expressible one
    time_terms_s: dict[str, float] = field(default_factory=dict)

    @property
    def time_error(self) -> float | None:
        """(predicted − measured) / measured step time; None unless both exist."""
        if self.predicted_step_s is None or self.run.step_time_s is None:
            return None
        return (self.predicted_step_s - self.run.step_time_s) / self.run.step_time_s

    @property
    def memory_error(self) -> float | None:
        """(predicted − measured) / measured peak memory; None unless both exist."""
        if self.predicted_peak_bytes is None or self.run.peak_memory_bytes is None:
            return None
        return (self.predicted_peak_bytes - self.run.peak_memory_bytes) / self.run.peak_memory_bytes

    def to_dict(self) -> dict:
        r = self.run
        return {"name": r.name, "configuration": r.configuration_key, "software": r.software,
                "model": r.model if isinstance(r.model, str) else r.model.name, "system": self.system_name,
                "num_gpus": r.num_gpus, "precision": r.precision.value, "precision_stated": r.precision_stated,
                "datatype": None if self.datatype is None else self.datatype.value, "status": self.status,
                "measured_step_s": r.step_time_s, "predicted_step_s": self.predicted_step_s,
                "time_error": self.time_error, "measured_peak_bytes": r.peak_memory_bytes,
                "predicted_peak_bytes": self.predicted_peak_bytes, "memory_error": self.memory_error,
                "reasons": list(self.reasons), "not_expressible": list(self.not_expressible),
                "time_terms_s": dict(self.time_terms_s)}


def score_run(run: Run, inputs: RunInputs) -> RunScore:
    """The model's prediction for one run (never raises for a run the model cannot take:
    that is status not_modelled, the reason kept)."""
    try:
        system = inputs.system(run)
    except InputError as err:
        return RunScore(run, "not_modelled", run.system, reasons=(str(err),))
    try:
        model = inputs.model(run)
        mapped = map_run(run, model, system)
        evaluation = evaluate(model, system, mapped.mapping)
    except InputError as err:
        return RunScore(run, "not_modelled", system.name, reasons=(str(err),))
    peak = evaluation.hbm_bytes - evaluation.memory.runtime_reserve_bytes
    status: RunStatus = "scored" if evaluation.feasible else "infeasible"
    if run.step_time_s is None:
        status = "not_measured"
    return RunScore(run, status, system.name, mapped.datatype, evaluation.iteration_time_s, peak,
                    evaluation.reasons, mapped.not_expressible, evaluation.time.as_dict())


def score_runs(runs: Iterable[Run], inputs: RunInputs | None = None) -> tuple[RunScore, ...]:
    inputs = inputs or RunInputs()
    return tuple(score_run(run, inputs) for run in runs)


def split_dense(runs: Iterable[Run], inputs: RunInputs) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """(dense, other): the runs whose model loads and has no experts, and the rest (mixture-
    of-experts models, or models with no file yet)."""
    dense, other = [], []
    for run in runs:
        try:
            is_dense = inputs.model(run).num_experts == 0
        except InputError:
            is_dense = False
        (dense if is_dense else other).append(run)
    return tuple(dense), tuple(other)


def newest_per_configuration(runs: Iterable[Run]) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """(newest, older): of the runs of each configuration, the one of the newest software
    release (the first given among equals), and the rest; each in the given order."""
    runs = tuple(runs)
    best: dict[str, Run] = {}
    for run in runs:
        key = run.configuration_key
        if key not in best or software_order(run.software) > software_order(best[key].software):
            best[key] = run
    newest_ids = {id(run) for run in best.values()}
    return (tuple(run for run in runs if id(run) in newest_ids),
            tuple(run for run in runs if id(run) not in newest_ids))


def held_out_splits(runs: Iterable[Run], group_of: Callable[[Run], str]
                    ) -> Iterator[tuple[str, tuple[Run, ...], tuple[Run, ...]]]:
    """(group, the other runs, the group's runs) for each group in order of first appearance:
    the folds of an out-of-sample check that leaves out whole groups — one configuration
    (`group_of=lambda run: run.configuration_key`), or one system (`lambda run: run.system`)."""
    runs = tuple(runs)
    groups = dict.fromkeys(group_of(run) for run in runs)
    for group in groups:
        yield (group, tuple(run for run in runs if group_of(run) != group),
               tuple(run for run in runs if group_of(run) == group))


@dataclass(frozen=True)
class ErrorSummary:
    """Errors of one group of runs (fractions, signed as RunScore.time_error)."""

    group: str
    count: int
    median_abs_error: float
    mean_signed_error: float
    max_abs_error: float

    def to_dict(self) -> dict:
        return {"group": self.group, "count": self.count, "median_abs_error": self.median_abs_error,
                "mean_signed_error": self.mean_signed_error, "max_abs_error": self.max_abs_error}


def by_system(score: RunScore) -> str:
    return score.system_name


def by_precision(score: RunScore) -> str:
    return score.run.precision.value


def by_configuration(score: RunScore) -> str:
    return score.run.configuration_key


def summarize(scores: Iterable[RunScore], group_of: Callable[[RunScore], str] | None = None,
              error: Callable[[RunScore], float | None] = lambda s: s.time_error) -> tuple[ErrorSummary, ...]:
    """Median |error|, mean signed error and max |error| of the scored runs, per group (in
    order of first appearance), or of all of them as group "all" when `group_of` is None.
    Runs that are not scored, or have no such error, are left out."""
    groups: dict[str, list[float]] = {}
    for score in scores:
        value = error(score)
        if score.status != "scored" or value is None:
            continue
        groups.setdefault("all" if group_of is None else group_of(score), []).append(value)
    return tuple(ErrorSummary(name, len(values), statistics.median(abs(v) for v in values),
                              statistics.fmean(values), max(abs(v) for v in values))
                 for name, values in groups.items())


def is_targeted(score: RunScore) -> bool:
    """Whether a run counts toward the accuracy targets: NVFP4 is reported, not targeted
    (its FP4 GEMMs run on the FP8 fit at the FP4 peak, unmeasured: costmodel.inputs.precision)."""
    return score.run.precision is not Precision.nvfp4
