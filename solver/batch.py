"""Batches of problems: the batch file (schema and grid expansion), one problem solved into
one result record, and the runner that solves many in parallel processes (or on a Dask
cluster) and appends each result to a ResultStore as it finishes.

The batch file format is described field by field in docs/batch-files.md.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from costmodel.errors import InputError
from costmodel.load import describe_validation_error, load_model, load_system, parse, read_document
from costmodel.model import Model
from costmodel.system import Datatype, System
from solver.space import SPACES

DEFAULT_MAX_BATCH = 3072
DEFAULT_SPACE = "full"
DEFAULT_TIME_LIMIT_S = 120.0
UNBOUNDED = "unbounded"
DATATYPE_TAGS = {"float8": "fp8", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _as_list(value: Any) -> Any:
    """A scalar stands for a one-element list; lists expand to the grid."""
    return value if isinstance(value, list) else [value]


def Grid(item: Any) -> Any:  # noqa: N802 - reads like a type in the schema below
    return Annotated[list[item], BeforeValidator(_as_list), Field(min_length=1)]


class Overrides(BaseModel):
    """The co-design knobs of `System.with_overrides`; each a value or a list of values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hbm_gib: Grid(Annotated[float, Field(gt=0)]) | None = Field(None, description="HBM capacity per GPU, GiB.")
    offload_gib: Grid(Annotated[float, Field(ge=0)]) | None = Field(
        None, description="Offload memory per GPU, GiB; 0 = none.")
    offload_gbps: Grid(Annotated[float, Field(gt=0)] | Literal["unbounded"]) | None = Field(
        None, description="Offload bandwidth per GPU per direction, GB/s, or 'unbounded' (as fast as HBM).")
    nvlink_size: Grid(Annotated[int, Field(gt=0, strict=True)]) | None = Field(
        None, description="Size of the first network (the NVLink domain), GPUs.")


class GridSpec(BaseModel):
    """One grid of problems: every combination of the listed values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: Grid(str | dict[str, Any]) | None = Field(
        None, description="Model files (relative to the batch file) or inline models (with a name).")
    systems: Grid(str | dict[str, Any]) | None = Field(
        None, description="System files (relative to the batch file) or inline systems (with a name).")
    gpus: Grid(Annotated[int, Field(gt=0, strict=True)]) | None = Field(None, description="GPU counts.")
    max_batch: Grid(Annotated[int, Field(gt=0, strict=True)]) | None = Field(
        None, description=f"Caps on the global batch (default {DEFAULT_MAX_BATCH}).")
    datatype: Grid(Datatype) | None = Field(None, description="Compute datatypes (default bfloat16).")
    space: Grid(Literal[tuple(SPACES)]) | None = Field(None, description=f"Mapping spaces (default {DEFAULT_SPACE}).")
    overrides: Overrides | None = Field(None, description="System overrides, each a value or a list.")
    time_limit_s: float | None = Field(None, gt=0, description=f"Solver time limit per problem, s "
                                                                f"(default {DEFAULT_TIME_LIMIT_S:g}).")


class BatchFile(GridSpec):
    """A batch file: its top-level fields are a grid, or the defaults of every entry of `grids`."""

    name: str | None = Field(None, description="A label (default: the file name).")
    description: str | None = Field(None, description="Free text: what the batch reproduces or asks.")
    grids: list[GridSpec] | None = Field(None, min_length=1, description="Several grids sharing the top-level values.")


@dataclass(frozen=True)
class Problem:
    """One fully resolved problem: the model, the system with its overrides applied, and the
    search settings."""

    id: str
    model: Model
    system: System
    system_name: str           # before overrides (the system's own name)
    system_source: str         # the file as written in the batch file, or "inline"
    overrides: dict[str, Any]  # as given (only the keys set)
    gpus: int
    max_batch: int
    datatype: Datatype
    space: str
    time_limit_s: float
    offload_unbounded: bool = False  # offload bandwidth = HBM's, standing for "unbounded"

    def to_dict(self) -> dict:
        """The `problem` field of a result record: everything needed to read the result."""
        offload = self.system.offload
        return {
            "model": {**self.model.model_dump(mode="json"), "params": self.model.total_params},
            "system": {"name": self.system_name, "source": self.system_source,
                       "hbm_gib": self.system.hbm.capacity_gib,
                       "offload_gib": offload.capacity_gib if offload else 0,
                       "offload_gbps": offload.bandwidth_gbps if offload else None,
                       "offload_unbounded": self.offload_unbounded,
                       "nvlink_size": self.system.networks[0].size},
            "overrides": dict(self.overrides), "gpus": self.gpus, "max_batch": self.max_batch,
            "datatype": self.datatype.value, "space": self.space, "time_limit_s": self.time_limit_s,
        }

    def payload(self, solver_workers: int = 1) -> dict:
        """Plain data for a worker process or a Dask task (rebuilt with model_validate)."""
        return {"id": self.id, "problem": self.to_dict(), "model": self.model.model_dump(mode="json"),
                "system": self.system.model_dump(mode="json"), "solver_workers": solver_workers}


# ---------------------------------------------------------------------- reading and expanding
def load_batch(path: str | Path, *, time_limit_s: float | None = None) -> list[Problem]:
    """Read a batch file and expand it into its problems, in file order, duplicates merged.
    `time_limit_s` (the command line's) replaces the file's. Errors are one-line InputErrors."""
    path = Path(path)
    data = read_document(path)
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    batch = parse(BatchFile, data, str(path))
    top = batch.model_dump(exclude={"name", "description", "grids"}, exclude_none=True)
    grids = [_merge(top, g.model_dump(exclude_none=True)) for g in batch.grids] if batch.grids else [top]
    loader = _Loader(path)
    problems: dict[str, Problem] = {}
    for number, grid in enumerate(grids):
        where = f"{path}: grids.{number}" if batch.grids else str(path)
        for field in ("models", "systems", "gpus"):
            if field not in grid:
                raise InputError(f"{where}: missing field '{field}'")
        for problem in _expand(grid, loader, where, time_limit_s):
            known = problems.get(problem.id)
            if known is None:
                problems[problem.id] = problem
            elif known.payload() != problem.payload():
                raise InputError(f"{where}: two different problems get the id {problem.id!r}; give their models "
                                 f"or systems distinct names")
    if not problems:
        raise InputError(f"{path}: the batch expands to no problems")
    return list(problems.values())


def _merge(top: dict, grid: dict) -> dict:
    merged = {**top, **grid}
    if "overrides" in top and "overrides" in grid:
        merged["overrides"] = {**top["overrides"], **grid["overrides"]}
    return merged


class _Loader:
    """Loads model and system files relative to the batch file, each once."""

    def __init__(self, batch_path: Path):
        self.base = batch_path.parent
        self.cache: dict[tuple[str, str], Model | System] = {}

    def get(self, kind: str, ref: str | dict, where: str) -> tuple[Model | System, str]:
        if isinstance(ref, dict):
            cls = Model if kind == "models" else System
            if "name" not in ref:
                raise InputError(f"{where}: an inline entry of '{kind}' needs a name")
            return parse(cls, ref, f"{where}: {kind} {ref['name']!r}"), "inline"
        key = (kind, ref)
        if key not in self.cache:
            target = self.base / ref
            try:
                self.cache[key] = load_model(target) if kind == "models" else load_system(target)
            except InputError as err:
                raise InputError(f"{where}: {kind}: {err}") from None
        return self.cache[key], ref


def _number(value: float) -> str:
    return f"{value:g}".replace("+", "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def problem_id(model: Model, system_name: str, gpus: int, datatype: Datatype, max_batch: int, space: str,
               overrides: dict[str, Any]) -> str:
    """A readable id, e.g. gpt-1t-256b__h100-80g-nvl8__g4096__fp8__off1024g100; the max
    batch and space appear only when they differ from the defaults."""
    parts = [_slug(model.name), _slug(system_name), f"g{gpus}", DATATYPE_TAGS[datatype.value]]
    if max_batch != DEFAULT_MAX_BATCH:
        parts.append(f"b{max_batch}")
    if space != DEFAULT_SPACE:
        parts.append(_slug(space))
    if "hbm_gib" in overrides:
        parts.append(f"hbm{_number(overrides['hbm_gib'])}")
    if overrides.get("offload_gib") == 0:
        parts.append("nooff")
    elif "offload_gib" in overrides or "offload_gbps" in overrides:
        gbps = overrides.get("offload_gbps")
        gbps_tag = "" if gbps is None and "offload_gib" not in overrides else (
            "inf" if gbps in (None, UNBOUNDED) else _number(gbps))
        parts.append(f"off{_number(overrides['offload_gib']) if 'offload_gib' in overrides else ''}g{gbps_tag}")
    if "nvlink_size" in overrides:
        parts.append(f"nvl{overrides['nvlink_size']}")
    return "__".join(parts)


def _expand(grid: dict, loader: _Loader, where: str, time_limit_s: float | None) -> list[Problem]:
    overrides = grid.get("overrides", {})
    knob_names = [k for k in ("hbm_gib", "offload_gib", "offload_gbps", "nvlink_size") if k in overrides]
    limit = time_limit_s or grid.get("time_limit_s", DEFAULT_TIME_LIMIT_S)
    out = []
    combos = itertools.product(grid["models"], grid["systems"], grid["gpus"], grid.get("max_batch", [DEFAULT_MAX_BATCH]),
                               grid.get("datatype", [Datatype.bfloat16]), grid.get("space", [DEFAULT_SPACE]),
                               *(overrides[k] for k in knob_names))
    for model_ref, system_ref, gpus, max_batch, datatype, space, *knob_values in combos:
        model, _ = loader.get("models", model_ref, where)
        base, source = loader.get("systems", system_ref, where)
        given = dict(zip(knob_names, knob_values))
        if given.get("offload_gib") == 0:
            given.pop("offload_gbps", None)  # no offload memory: its bandwidth means nothing
        datatype = Datatype(datatype)
        pid = problem_id(model, base.name, gpus, datatype, max_batch, space, given)
        system = _apply(base, given, f"{where}: {pid}")
        system.compute_for(datatype)
        unbounded = system.offload is not None and (given.get("offload_gbps") == UNBOUNDED or (
            base.offload is None and "offload_gbps" not in given))
        out.append(Problem(pid, model, system, base.name, source, given, gpus, max_batch, datatype, space, limit,
                           unbounded))
    return out


def _apply(system: System, given: dict[str, Any], where: str) -> System:
    gbps = given.get("offload_gbps")
    if gbps == UNBOUNDED:
        gbps = system.hbm.bandwidth_gbps if system.offload is not None else None  # None: as fast as HBM
    try:
        return system.with_overrides(hbm_gib=given.get("hbm_gib"), offload_gib=given.get("offload_gib"),
                                     offload_gbps=gbps, nvlink_size=given.get("nvlink_size"))
    except InputError as err:
        raise InputError(f"{where}: {err}") from None
    except ValidationError as err:
        raise InputError(describe_validation_error(err, System, where)) from None


# ---------------------------------------------------------------------- one problem
def solve_payload(payload: dict) -> dict:
    """Solve one problem (a `Problem.payload`) into its result record. Never raises: any
    failure becomes a record with status "error" and the message."""
    started = time.perf_counter()
    record = {"id": payload["id"], "problem": payload["problem"]}
    try:
        from solver.solve import SolverConfig, solve

        problem = payload["problem"]
        model = Model.model_validate(payload["model"])
        system = System.model_validate(payload["system"])
        config = SolverConfig(time_limit_s=problem["time_limit_s"], workers=payload.get("solver_workers", 1))
        result = solve(model, system, problem["gpus"], max_batch=problem["max_batch"],
                       datatype=Datatype(problem["datatype"]), space=problem["space"], config=config)
        solved = result.to_dict()
        record.update(solved)
        record["mappings"] = solved.get("space_size")
    except Exception as err:  # noqa: BLE001 - one failing problem must never stop the batch
        return error_record(payload, f"{type(err).__name__}: {err}", time.perf_counter() - started)
    record["seconds"] = time.perf_counter() - started
    return _json_safe(record)


def error_record(payload: dict, message: str, seconds: float | None = None) -> dict:
    one_line = " ".join(message.split()) or "error"
    return {"id": payload["id"], "problem": payload["problem"], "status": "error", "best": None,
            "error": one_line[:500], "seconds": seconds}


def _json_safe(value: Any) -> Any:
    """numpy scalars to Python, non-finite floats to None (results.jsonl is strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------- the runner
@dataclass
class BatchSummary:
    """What one `run_batch` call did."""

    total: int                 # problems in the batch
    skipped: int               # already in results.jsonl from an earlier run
    solved: int                # finished in this run (any status, errors included)
    by_status: dict[str, int]  # over every record of the batch, earlier runs included
    interrupted: bool
    seconds: float
    warnings: list[str]

    @property
    def errors(self) -> int:
        return self.by_status.get("error", 0)


class Reporter:
    """Progress hooks; the CLI draws a progress bar, tests and libraries use this silent one."""

    def start(self, total: int, skipped: int, pending: int) -> None:
        pass

    def finished(self, record: dict) -> None:
        pass

    def tick(self) -> None:
        """Called about twice a second while problems run (redraw a progress bar)."""

    def stop(self) -> None:
        pass


def hard_limit_s(time_limit_s: float) -> float:
    """Wall time after which the local runner kills a problem's process: the solver's own
    limit plus room for building the model and scoring (it stops itself well before)."""
    return 1.5 * time_limit_s + 30.0


def run_batch(problems: list[Problem], out_dir: str | Path, *, jobs: int | None = None,
              dask_address: str | None = None, solver_workers: int = 1, retry_errors: bool = False,
              reporter: Reporter | None = None) -> BatchSummary:
    """Solve every problem not yet in `out_dir`/results.jsonl, appending each record as it
    finishes, then write results.csv. Ctrl-C (SIGINT) or SIGTERM stop it cleanly: the
    finished records stay and a rerun resumes. See solver/store.py for crash safety."""
    from solver.store import ResultStore

    reporter = reporter or Reporter()
    started = time.perf_counter()
    ids = [p.id for p in problems]
    with ResultStore.open(out_dir) as store, _Interruptible() as guard:
        if retry_errors:
            store.drop([i for i in ids if store.records.get(i, {}).get("status") == "error"])
        done = store.finished_ids()
        pending = [p for p in problems if p.id not in done]
        skipped = len(problems) - len(pending)
        reporter.start(len(problems), skipped, len(pending))
        payloads = [p.payload(solver_workers) for p in pending]
        results = (_run_dask(payloads, dask_address) if dask_address
                   else _run_local(payloads, jobs or default_jobs(solver_workers),
                                   {p.id: hard_limit_s(p.time_limit_s) for p in pending}, reporter.tick))
        solved, interrupted = 0, False
        try:
            for record in results:
                with guard.critical():
                    store.append(record)
                solved += 1
                reporter.finished(record)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            results.close()
            reporter.stop()
            with guard.critical():
                store.write_csv(ids)
        statuses = [store.records[i]["status"] for i in ids if i in store.records]
        by_status = {s: statuses.count(s) for s in sorted(set(statuses))}
        return BatchSummary(len(problems), skipped, solved, by_status, interrupted,
                            time.perf_counter() - started, list(store.warnings))


def default_jobs(solver_workers: int = 1) -> int:
    import os

    return max(1, (os.cpu_count() or 1) // max(1, solver_workers))


class _Interruptible:
    """SIGINT and SIGTERM raise KeyboardInterrupt, except inside `critical()` sections
    (writing a record), where they are held until the section ends."""

    def __enter__(self) -> "_Interruptible":
        import signal
        import threading

        self.held = False
        self.in_critical = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.in_critical:
            self.held = True
        else:
            raise KeyboardInterrupt

    def critical(self):
        import contextlib

        @contextlib.contextmanager
        def section():
            self.in_critical = True
            try:
                yield
            finally:
                self.in_critical = False
                if self.held:
                    self.held = False
                    raise KeyboardInterrupt
        return section()

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _child(payload: dict, conn) -> None:
    """Body of one problem's process: ignore Ctrl-C (the parent handles it), die with the
    parent, solve, send the record back."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: be killed when the parent dies (even by SIGKILL), never solve for no one
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    conn.send(solve_payload(payload))
    conn.close()


def _context():
    """Linux: fork, so each problem's process starts in milliseconds with everything already
    imported (the parent runs no threads while it forks: the progress bar is refreshed
    from the main loop). Elsewhere: spawn."""
    import multiprocessing
    import sys

    if sys.platform == "linux":
        import solver.solve  # noqa: F401 - imported once here, inherited by every child

        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_local(payloads: list[dict], jobs: int, limits: dict[str, float], tick=lambda: None):
    """Solve each payload in its own process, `jobs` at a time; yield records as they finish.
    A process that dies or overruns its hard limit becomes an error record."""
    from multiprocessing.connection import wait

    context = _context()
    queue = list(reversed(payloads))
    running: dict[Any, tuple[dict, Any, float]] = {}  # connection -> (payload, process, start)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                payload = queue.pop()
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(payload, sender), daemon=True,
                                          name=f"mapsat-{payload['id']}")
                process.start()
                sender.close()
                running[receiver] = (payload, process, time.monotonic())
            wait(list(running), timeout=0.5)
            tick()
            for receiver, (payload, process, begun) in list(running.items()):
                record = None
                if receiver.poll():
                    try:
                        record = receiver.recv()
                    except (EOFError, OSError):
                        record = error_record(payload, f"worker process died (exit code {process.exitcode})",
                                              time.monotonic() - begun)
                elif time.monotonic() - begun > limits[payload["id"]]:
                    process.kill()
                    record = error_record(payload, f"killed after the hard time limit of {limits[payload['id']]:g} s",
                                          time.monotonic() - begun)
                if record is not None:
                    del running[receiver]
                    receiver.close()
                    process.join(5)
                    yield record
    finally:
        for receiver, (_, process, _) in running.items():
            process.kill()
            process.join(5)
            receiver.close()


def _run_dask(payloads: list[dict], address: str):
    """The same on a running Dask distributed cluster at `address`."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise InputError("--dask needs Dask distributed: pip install 'mapsat[dask]' "
                         "(the dask extra)") from None
    try:
        client = Client(address, timeout="10s")
    except Exception as err:  # noqa: BLE001 - any connection failure is the user's address
        raise InputError(f"--dask {address}: cannot connect to a Dask scheduler ({err})") from None
    token = f"{time.time_ns():x}"
    futures = {client.submit(solve_payload, p, key=f"mapsat-{p['id']}-{token}", pure=False): p for p in payloads}
    try:
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as err:  # noqa: BLE001 - a lost worker or task is that problem's error
                yield error_record(futures[future], f"dask: {type(err).__name__}: {err}")
    finally:
        client.cancel(list(futures))
        client.close()
