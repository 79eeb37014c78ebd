"""Running CP-SAT: a solver configured once, a solve that Ctrl-C stops at once, and an
invalid model reported as the bug it is."""

from __future__ import annotations

import threading

from ortools.sat.python import cp_model

from costmodel.errors import InternalError


def new_solver(time_limit_s: float, workers: int = 1, seed: int = 0) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    # CP-SAT's presolve can call a feasible model infeasible (google/or-tools issue #5274,
    # 9.15.6755, the newest release): one of this project's surrogate models, feasible with
    # presolve off, came back INFEASIBLE with it on and left a mapping out of a certified top-3
    # (tests/test_expert_tensor_parallel.py). A certificate must not rest on it.
    solver.parameters.cp_model_presolve = False
    return solver


def checked_solve(cpsat: cp_model.CpModel, solver: cp_model.CpSolver, callback=None) -> int:
    """Solve, and turn MODEL_INVALID into an InternalError with CP-SAT's own reason: the input
    boundary (costmodel.inputs.limits) keeps every number in range, so an invalid model is a bug,
    never a time-out or an infeasible problem."""
    status = interruptible_solve(cpsat, solver, callback)
    if status == cp_model.MODEL_INVALID:
        reason = " ".join((cpsat.Validate() or solver.SolutionInfo() or "no reason given").split())
        raise InternalError(f"internal error: CP-SAT rejected the model as invalid ({reason[:300]}); "
                            f"please report it with the input files")
    return status


def interruptible_solve(cpsat: cp_model.CpModel, solver: cp_model.CpSolver, callback=None) -> int:
    """solver.Solve in a helper thread while the main thread waits on it, so that Ctrl-C
    (which Python handles in the main thread only) stops the search at once (StopSearch)
    and comes back as KeyboardInterrupt. CP-SAT is told not to take SIGINT itself: it would
    stop the round silently and leave the process without Python's handler."""
    solver.parameters.catch_sigint_signal = False
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["status"] = solver.Solve(cpsat, callback) if callback is not None else solver.Solve(cpsat)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread below
            outcome["error"] = err

    thread = threading.Thread(target=run, name="cp-sat", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        solver.StopSearch()
        thread.join()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["status"]
