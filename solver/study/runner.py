"""Solving a batch: one problem into one result record, and the runner that solves many in
parallel processes (or on a Dask cluster) and appends each result to a ResultStore as it
finishes. The batch file itself (schema, grid expansion) is solver.batch.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.errors import InputError, MapsatError
from costmodel.inputs.kernels import PRECISION_DEFAULTS, Kernels
from costmodel.inputs.model import Model
from costmodel.inputs.system import Datatype, System
from solver.study.batch import Problem
from solver.report.documents import json_safe

# ---------------------------------------------------------------------- one problem
def solve_payload(payload: dict, progress=None) -> dict:
    """Solve one problem (a `Problem.payload`) into its result record. Never raises: any
    failure becomes a record with status "error" and the message. `progress(phase)` hears
    what the solver is doing."""
    started = time.perf_counter()
    record = {"id": payload["id"], "problem": payload["problem"]}
    try:
        from solver.search.solve import SolverConfig, solve
        from solver.space.declaration import get_space
        from solver.space.pins import check_pins, parse_pins, pinned

        problem = payload["problem"]
        model = Model.model_validate(payload["model"])
        system = System.model_validate(payload["system"])
        config = SolverConfig(time_limit_s=problem["time_limit_s"], workers=payload.get("solver_workers", 1))
        pins, space = parse_pins(problem.get("fix", []), option="fix"), get_space(problem["space"])
        check_pins(pins, model, system, problem["gpus"], space, option="fix")   # this problem's error, no search
        result = solve(model, system, problem["gpus"], max_batch=problem["max_batch"],
                       datatype=Datatype(problem["datatype"]), space=pinned(space, pins),
                       kernels=Kernels.with_attention(problem.get("attention", "fused"),
                                                      problem.get("grad_datatype", "float32"),
                                                      problem.get("capacity_factor", 1.0),
                                                      **{k: problem[k] for k in PRECISION_DEFAULTS if k in problem}),
                       config=config,
                       progress=progress)
        solved = result.to_dict()
        record.update(solved)
        record["mappings"] = solved.get("space_size")
    except MapsatError as err:  # the input or an internal error, already one line naming it
        return error_record(payload, str(err), time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - one failing problem must never stop the batch
        return error_record(payload, f"internal error: {type(err).__name__}: {err}", time.perf_counter() - started)
    record["seconds"] = time.perf_counter() - started
    return json_safe(record)


def error_record(payload: dict, message: str, seconds: float | None = None) -> dict:
    one_line = " ".join(message.split()) or "error"
    return {"id": payload["id"], "problem": payload["problem"], "status": "error", "best": None,
            "error": one_line[:500], "seconds": seconds}


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
    finished records stay and a rerun resumes. See solver/study/store.py for crash safety."""
    from solver.study.store import ResultStore

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
                                   {p.id: hard_limit_s(p.time_limit_s) for p in pending},
                                   lambda: (guard.check(), reporter.tick())))
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
    (writing a record), where they are held until the section ends.

    The handler also remembers the signal, and `check()` (called every half second by the
    local runner) raises it again: a signal that lands while Python runs an at-fork callback
    (logging's lock release, as each problem's process is forked) raises inside that
    callback, where Python prints and drops the exception."""

    def __enter__(self) -> "_Interruptible":
        import signal
        import threading

        self.held = False
        self.requested = False
        self.in_critical = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if self.in_critical:
            self.held = True
        else:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a signal came and its first raise was lost."""
        if self.requested and not self.in_critical:
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

    def tell(phase: str) -> None:
        conn.send(("phase", phase))

    try:  # Linux: be killed when the parent dies (even by SIGKILL), never solve for no one
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    conn.send(solve_payload(payload, tell))
    conn.close()


def _context():
    """Linux: fork, so each problem's process starts in milliseconds with everything already
    imported (the parent runs no threads while it forks: the progress bar is refreshed
    from the main loop). Elsewhere: spawn."""
    import multiprocessing
    import sys

    if sys.platform == "linux":
        import solver.search.solve  # noqa: F401 - imported once here, inherited by every child

        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_local(payloads: list[dict], jobs: int, limits: dict[str, float], tick=lambda: None):
    """Solve each payload in its own process, `jobs` at a time; yield records as they finish.
    A process that dies or overruns its hard limit becomes an error record."""
    from multiprocessing.connection import wait

    context = _context()
    queue = list(reversed(payloads))
    running: dict[Any, tuple[dict, Any, float]] = {}  # connection -> (payload, process, start)
    phases: dict[Any, str] = {}                        # connection -> what its solver last said it does
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
                while record is None and receiver.poll():
                    try:
                        message = receiver.recv()
                    except (EOFError, OSError):
                        message = error_record(payload, f"worker process died (exit code {process.exitcode})",
                                               time.monotonic() - begun)
                    if isinstance(message, tuple) and message[:1] == ("phase",):
                        phases[receiver] = message[1]
                    else:
                        record = message
                if record is None and time.monotonic() - begun > limits[payload["id"]]:
                    process.kill()
                    limit = payload["problem"]["time_limit_s"]
                    record = error_record(payload, f"killed after the hard time limit of {limits[payload['id']]:g} s "
                                                   f"(1.5 × its time limit of {limit:g} s + 30 s) while "
                                                   f"{phases.get(receiver, 'starting')}", time.monotonic() - begun)
                if record is not None:
                    del running[receiver]
                    phases.pop(receiver, None)
                    receiver.close()
                    process.join(5)
                    yield record
    finally:
        for receiver, (_, process, _) in running.items():
            process.kill()
            process.join(5)
            receiver.close()


_DASK_ADDRESS = re.compile(r"^(?:(tcp|tls|ucx|ws|wss)://)?([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")


def check_dask_address(address: str) -> str:
    """A Dask scheduler's address as `--dask` takes it, [tcp|tls|ucx|ws|wss://]host:port with a
    port of 1-65535; else an InputError naming it (an empty one would run locally unsaid)."""
    match = _DASK_ADDRESS.match(address.strip())
    if match is None or not 1 <= int(match[3]) <= 65535:
        raise InputError(f"--dask {address[:80]!r}: not a scheduler address; give [tcp://]host:port with a port of "
                         f"1-65535 (e.g. tcp://10.0.0.5:8786)")
    return address.strip()


def _run_dask(payloads: list[dict], address: str):
    """The same on a running Dask distributed cluster at `address`."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise InputError("--dask needs Dask distributed: pip install 'mapsat[dask]' "
                         "(the dask extra)") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as err:    # nothing listens there, or it does not answer in time
        raise InputError(f"--dask {address}: cannot connect to a Dask scheduler ({err})") from None
    except Exception as err:  # noqa: BLE001 - something answered, not in Dask's protocol (its reply
        # read as a frame length can ask for exabytes: not the user's memory, the address)
        raise InputError(f"--dask {address}: something answered there, but not a Dask scheduler (its reply does "
                         f"not parse: {type(err).__name__})") from None
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
