"""Exhaustive search: score every mapping of a space with the exact vectorized model.

The space is cut into chunks of contiguous ordinals (see `solver.space.enumerate`); each worker
process builds its chunk from the plan, evaluates it with
`costmodel.evaluate.evaluate_arrays`, and sends back only small results: counts, the
chunk's best K, a per-dimension count of feasible mappings and, when asked, CSV text.
Memory stays bounded by the chunk size whatever the size of the space.

Ranking and ties: mappings are ordered by exact iteration time, then by ordinal (position
in the enumeration order, i.e. lexicographic in (tp, pp, interleaving, microbatch,
recompute, tp_comm, ..., dp_net)); so among equally fast mappings the first enumerated
wins, and the result does not depend on the number of workers or the chunk size. The top k
are distinct: mappings a setting without effect tells apart form one group, shown once
(solver.search.distinct).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from costmodel.space.dimensions import DIMENSIONS, SPLIT_TEXT
from costmodel.terms.context import Context
from costmodel.encoding import MappingArrays
from costmodel.evaluate import evaluate, evaluate_arrays
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from costmodel.inputs.units import GiB
from solver.search.distinct import equivalents, group_keys, top_groups
from solver.space.enumerate import ChunkSpec, Plan, plan
from solver.space.count import label_breakdown
from solver.space.declaration import Space

BRUTE_CHUNK_ROWS = 1 << 18
"""Rows per chunk for the search: ~262k mappings (a few hundred MB of model terms at most),
small enough that two workers stay balanced to the end."""

PROOF_ROWS = 1 << 20
"""Spaces past this many mappings are first put to the CP-SAT structure model (divisibility
and network spans, the proof `solve` gives): when no split can span its networks, scoring
every mapping would only confirm it, for minutes."""
PROOF_LIMIT_S = 60.0
"""At most this long for that proof; past it the scan goes on as without it."""

MEMORY_FIELDS = ("hbm_bytes", "offload_bytes", "weights_bytes", "weight_grads_bytes", "optimizer_bytes",
                 "activations_bytes")

# CSV columns: the ordinal, the mapping in Calculon's field names, then time and memory.
CSV_HEADER = ",".join(["ordinal", *(dim.field for dim in DIMENSIONS), "iteration_time_s", "mfu", *MEMORY_FIELDS])


@dataclass(frozen=True)
class Candidate:
    """One scored mapping: its ordinal in the enumeration, the mapping, and the exact
    model's time, MFU and memory per GPU (bytes)."""

    ordinal: int
    mapping: Mapping
    iteration_time_s: float
    mfu: float
    memory: dict[str, float]
    equivalents: dict[str, list[str]] = field(default_factory=dict)
    """settings equally fast and large in this skeleton (solver.search.distinct)"""

    def to_dict(self) -> dict:
        return {"ordinal": self.ordinal, "mapping": self.mapping.model_dump(mode="json"),
                "iteration_time_s": self.iteration_time_s, "mfu": self.mfu, "memory": dict(self.memory),
                "equivalent": dict(self.equivalents)}


@dataclass(frozen=True)
class BruteResult:
    """What the exhaustive search found. `best` is None when no mapping is feasible; then
    `blocked` says, per feasibility check, how many mappings it rules out."""

    space: str
    num_gpus: int
    max_batch: int
    datatype: str
    best: Candidate | None
    top: list[Candidate]
    evaluated: int
    feasible: int
    seconds: float
    workers: int
    feasible_by_dimension: dict[str, dict[str, int]]
    blocked: dict[str, int] = field(default_factory=dict)
    min_hbm_bytes: float | None = None
    best_time_breakdown_s: dict[str, float] = field(default_factory=dict)
    attention: str = "fused"
    grad_datatype: str = "float32"
    interrupted: bool = False     # Ctrl-C: `evaluated` of the space's mappings were scored
    space_size: int = 0
    capacity_factor: float = 1.0
    precision: dict = field(default_factory=dict)
    """the precision settings that differ from the defaults (Kernels.precision_record)"""
    proof: str | None = None
    """why no mapping can be feasible, proven before any was scored (`spans_proof`)"""

    def to_dict(self) -> dict:
        best = None
        if self.best is not None:
            best = {**self.best.to_dict(), "time": dict(self.best_time_breakdown_s)}
        return {"space": self.space, "attention": self.attention, "grad_datatype": self.grad_datatype,
                **self.precision,
                "gpus": self.num_gpus, "max_batch": self.max_batch,
                "datatype": self.datatype, "best": best, "top": [c.to_dict() for c in self.top],
                "evaluated": self.evaluated, "feasible": self.feasible, "feasible_by_dimension": self.feasible_by_dimension,
                "blocked": self.blocked, "min_hbm_bytes": self.min_hbm_bytes, "workers": self.workers,
                "seconds": self.seconds, "interrupted": self.interrupted, "space_size": self.space_size,
                "proof": self.proof}

    @property
    def kernels(self) -> Kernels:
        """The problem's settings the scan ran under."""
        return Kernels.with_attention(self.attention, self.grad_datatype, self.capacity_factor, **self.precision)

    def infeasible_reason(self, hbm_capacity_bytes: float) -> str:
        """One line: why nothing is feasible, naming the checks that rule mappings out."""
        if self.proof is not None:
            return f"infeasible, proven before scoring the {self.space_size:,} mappings: {self.proof}"
        if self.evaluated == 0:
            return (f"no mapping exists in space {self.space} for {self.num_gpus} GPUs with max batch "
                    f"{self.max_batch} (no {SPLIT_TEXT} split passes the divisibility and batch rules)")
        parts = [f"{name} rules out {count:,}" for name, count in sorted(self.blocked.items(), key=lambda kv: -kv[1])]
        hbm = ""
        if self.min_hbm_bytes is not None and self.min_hbm_bytes > hbm_capacity_bytes:
            hbm = (f"; the smallest HBM footprint is {self.min_hbm_bytes / GiB:.1f} GiB per GPU > "
                   f"{hbm_capacity_bytes / GiB:.1f} GiB")
        return f"infeasible: none of {self.evaluated:,} mappings passes ({'; '.join(parts)}){hbm}"


@dataclass
class _ChunkOutcome:
    evaluated: int
    feasible: int
    breakdown: dict[str, dict[int, int]]
    blocked: dict[str, int]
    min_hbm_bytes: float
    top_ordinal: np.ndarray
    top_time_s: np.ndarray
    top_mfu: np.ndarray
    top_memory: dict[str, np.ndarray]
    top_rows: MappingArrays
    csv_text: str | None


_WORKER: dict = {}


def _init_worker(model: Model, system: System, the_plan: Plan, datatype: Datatype, kernels: Kernels, top_k: int,
                 csv: bool) -> None:
    if multiprocessing.parent_process() is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the parent's to handle
    _WORKER.update(model=model, system=system, plan=the_plan, datatype=datatype, kernels=kernels, top_k=top_k, csv=csv)


def _evaluate_chunk(index: int) -> _ChunkOutcome:
    """Build chunk `index` of the plan, score it, keep what the parent needs."""
    the_plan: Plan = _WORKER["plan"]
    chunk: ChunkSpec = the_plan.chunks[index]
    arrays = the_plan.build(chunk)
    result = evaluate_arrays(_WORKER["model"], _WORKER["system"], arrays, _WORKER["datatype"],
                             _WORKER["kernels"])
    time_s = np.asarray(result.iteration_time_s, dtype=np.float64)
    ok = np.asarray(result.feasible, dtype=bool) & np.isfinite(time_s)
    ordinal = chunk.ordinal + np.arange(chunk.rows, dtype=np.int64)
    feasible_index = np.flatnonzero(ok)
    keys = group_keys(arrays.take(feasible_index), time_s[feasible_index],
                      np.asarray(result.hbm_bytes)[feasible_index], np.asarray(result.offload_bytes)[feasible_index])
    groups = top_groups(time_s[feasible_index], ordinal[feasible_index], keys, _WORKER["top_k"])
    chosen = feasible_index[np.concatenate(groups)] if groups else feasible_index[:0]
    feasible_rows = arrays.take(feasible_index)
    breakdown = {name: _value_counts(column) for name, column in feasible_rows.columns.items()}
    blocked = {name: int(chunk.rows - np.count_nonzero(passed)) for name, passed in result.checks.items()}
    csv_text = None
    if _WORKER["csv"] and len(feasible_index):
        csv_text = _csv_rows(feasible_rows, ordinal[feasible_index], time_s[feasible_index],
                             np.asarray(result.mfu)[feasible_index],
                             {f: np.asarray(getattr(result, f))[feasible_index] for f in MEMORY_FIELDS})
    return _ChunkOutcome(
        evaluated=chunk.rows, feasible=len(feasible_index), breakdown=breakdown, blocked=blocked,
        min_hbm_bytes=float(np.min(result.hbm_bytes)) if chunk.rows else float("inf"),
        top_ordinal=ordinal[chosen], top_time_s=time_s[chosen], top_mfu=np.asarray(result.mfu)[chosen],
        top_memory={f: np.asarray(getattr(result, f))[chosen] for f in MEMORY_FIELDS},
        top_rows=arrays.take(chosen), csv_text=csv_text)


def _value_counts(values: np.ndarray) -> dict[int, int]:
    if not len(values):
        return {}
    counts = np.bincount(values.astype(np.int64))
    return {int(v): int(counts[v]) for v in np.flatnonzero(counts)}


def _csv_rows(rows: MappingArrays, ordinal: np.ndarray, time_s: np.ndarray, mfu: np.ndarray,
              memory: dict[str, np.ndarray]) -> str:
    """CSV lines for these rows. Small-valued columns become strings by table look-up, so
    the cost is mostly the float formatting (~1 µs per value)."""
    columns: list[list[str]] = [list(map(str, ordinal.tolist()))]
    for dim in DIMENSIONS:
        values = rows.columns[dim.name]
        if dim.kind == "choice":
            table = np.array([c.value for c in dim.choices], dtype=object)
        elif dim.kind == "switch":
            table = np.array(["false", "true"], dtype=object)
        else:
            table = np.array([str(v) for v in range(int(values.max()) + 1)], dtype=object)
        columns.append(table[values.astype(np.int64)].tolist())
    for values in (time_s, mfu, *(memory[f] for f in MEMORY_FIELDS)):
        columns.append(list(map("{:.9g}".format, values.tolist())))
    return "\n".join(map(",".join, zip(*columns))) + "\n"


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def scan(model: Model, system: System, num_gpus: int, max_batch: int, space: Space, datatype: Datatype,
         kernels: Kernels = Kernels(), top_k: int = 10, workers: int | None = None, chunk_rows: int = BRUTE_CHUNK_ROWS, progress: bool = False,
         csv_path: str | Path | None = None, say=None) -> BruteResult:
    """Evaluate every mapping of `space`; return the best `top_k` (by time, then ordinal),
    counts, and optionally write every feasible mapping to `csv_path` in enumeration order.
    `progress`: a bar on a terminal; `say(text)`: told the mappings scored after each chunk."""
    start = time.perf_counter()
    # the problem's own errors (a missing datatype, a recipe the GPU does not run) are the
    # user's, said once, here: not raised inside workers, whose pool would then be torn down
    Context.of(model, system, datatype, kernels)
    the_plan = plan(model, system, num_gpus, max_batch, space, chunk_rows)
    try:
        proof, interrupted = spans_proof(model, system, num_gpus, max_batch, space, the_plan), False
    except KeyboardInterrupt:      # Ctrl-C during the proof: nothing scored
        proof, interrupted = None, True
    if proof is not None or interrupted:
        return BruteResult(space=space.name, num_gpus=num_gpus, max_batch=max_batch, datatype=datatype.value,
                           best=None, top=[], evaluated=0, feasible=0, seconds=time.perf_counter() - start,
                           workers=0, feasible_by_dimension={}, space_size=the_plan.total, proof=proof,
                           interrupted=interrupted)
    workers = min(workers or default_workers(), max(1, len(the_plan.chunks)))
    args = (model, system, the_plan, datatype, kernels, top_k, csv_path is not None)
    evaluated = feasible = 0
    breakdown: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    blocked: dict[str, int] = defaultdict(int)
    min_hbm = float("inf")
    tops: list[_ChunkOutcome] = []
    interrupted = False
    csv_file = open(csv_path, "w", encoding="utf-8") if csv_path is not None else None
    bar = Progress(TextColumn("[bold]brute"), BarColumn(), MofNCompleteColumn(), TextColumn("mappings"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), disable=not progress,
                   transient=True)
    try:
        if csv_file is not None:
            csv_file.write(CSV_HEADER + "\n")
        with bar:
            task = bar.add_task("brute", total=the_plan.total)
            for outcome in _run(args, len(the_plan.chunks), workers):
                evaluated += outcome.evaluated
                feasible += outcome.feasible
                for name, counts in outcome.breakdown.items():
                    for value, count in counts.items():
                        breakdown[name][value] += count
                for name, count in outcome.blocked.items():
                    blocked[name] += count
                min_hbm = min(min_hbm, outcome.min_hbm_bytes)
                if csv_file is not None and outcome.csv_text:
                    csv_file.write(outcome.csv_text)
                if len(outcome.top_ordinal):
                    outcome.csv_text = None  # keep only the small part in memory
                    tops.append(outcome)
                bar.advance(task, outcome.evaluated)
                if say is not None:
                    say(f"scored {evaluated:,} of {the_plan.total:,} mappings")
    except KeyboardInterrupt:     # Ctrl-C: what was scored so far (the pool is torn down by _run)
        interrupted = True
    finally:
        if csv_file is not None:
            csv_file.close()
    top = _merge_top(tops, top_k, datatype, kernels)
    breakdown_times = {}
    if top:
        breakdown_times = evaluate(model, system, top[0].mapping).time.as_dict()
    return BruteResult(
        space=space.name, num_gpus=num_gpus, max_batch=max_batch, datatype=datatype.value,
        best=top[0] if top else None, top=top, evaluated=evaluated, feasible=feasible,
        seconds=time.perf_counter() - start, workers=workers,
        feasible_by_dimension=label_breakdown(space, breakdown) if feasible else {},
        blocked={k: v for k, v in blocked.items() if v}, min_hbm_bytes=min_hbm if evaluated else None,
        best_time_breakdown_s=breakdown_times, attention=kernels.attention,
        grad_datatype=kernels.grad_datatype, interrupted=interrupted,
        space_size=the_plan.total, capacity_factor=kernels.capacity_factor, precision=kernels.precision_record)


def spans_proof(model: Model, system: System, num_gpus: int, max_batch: int, space: Space, the_plan: Plan) -> str | None:
    """For a space past PROOF_ROWS mappings: the reason no mapping is feasible when the CP-SAT
    structure model (every split's divisibility and network spans) proves it, else None."""
    if the_plan.total <= PROOF_ROWS or not the_plan.skeletons:
        return None
    from ortools.sat.python import cp_model

    from solver.search.cpsat.constraints import Problem
    from solver.search.cpsat.model import structure_model
    from solver.search.cpsat.run import checked_solve, new_solver
    from solver.search.solve import network_size_reason

    m, _ = structure_model(Problem(model, system, num_gpus, max_batch, space), the_plan.skeletons)
    if checked_solve(m, new_solver(PROOF_LIMIT_S)) != cp_model.INFEASIBLE:
        return None
    return network_size_reason(system, num_gpus)


def _run(args: tuple, num_chunks: int, workers: int):
    """Outcomes of every chunk, in chunk order (so the CSV and merges are deterministic)."""
    if workers == 1:
        _init_worker(*args)
        try:
            for index in range(num_chunks):
                yield _evaluate_chunk(index)
        finally:
            _WORKER.clear()
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(workers, initializer=_init_worker, initargs=args) as pool:
        yield from pool.imap(_evaluate_chunk, range(num_chunks), chunksize=1)


def _merge_top(outcomes: list[_ChunkOutcome], top_k: int, datatype: Datatype, kernels: Kernels) -> list[Candidate]:
    if not outcomes or top_k <= 0:
        return []
    time_s = np.concatenate([o.top_time_s for o in outcomes])
    ordinal = np.concatenate([o.top_ordinal for o in outcomes])
    mfu = np.concatenate([o.top_mfu for o in outcomes])
    memory = {f: np.concatenate([o.top_memory[f] for o in outcomes]) for f in MEMORY_FIELDS}
    rows = MappingArrays.concatenate([o.top_rows for o in outcomes])
    keys = group_keys(rows, time_s, memory["hbm_bytes"], memory["offload_bytes"])
    return [Candidate(ordinal=int(ordinal[i]), mapping=rows.to_mapping(int(i), datatype, kernels),
                      iteration_time_s=float(time_s[i]), mfu=float(mfu[i]),
                      memory={f: float(memory[f][i]) for f in MEMORY_FIELDS},
                      equivalents=equivalents(rows.columns, members))
            for members in top_groups(time_s, ordinal, keys, top_k) for i in members[:1]]
