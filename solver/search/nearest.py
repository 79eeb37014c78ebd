"""The question behind an infeasible answer: how many GPUs would fit, and which batch would.

`smallest_fitting_count`: when no mapping fits a GPU's memory, the smallest count above the
asked one, among those a cluster is bought in (whole NVLink domains), whose `solve` finds a
mapping — each candidate solved, so the count named is one `solve` accepts. It starts from a
lower bound: every byte of a GPU's footprint is at best divided by the GPU count (the state
by sharding, the activations by splitting the batch, sequence and layers), so at n GPUs the
smallest footprint F(n0) found at n0 GPUs is at least F(n0)·n0/n, and no count below
n0·F(n0)/HBM can fit.

`nearest_batches`: when a fixed global batch leaves no parallel split (dp must divide it),
the batches nearest to it, below and above, that leave one.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable

from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from solver.space.declaration import Space
from solver.space.enumerate import plan as enumerate_plan
from solver.space.pins import pinned

MAX_COUNTS_TRIED = 16
"""Counts solved at most in the search for the smallest that fits (each a `solve`)."""
MEMORY_REASONS = ("hbm capacity", "offload capacity", "exact model")
"""`solve`'s reasons (solver.search.solve.diagnose) that more GPUs may cure: memory."""
_FOOTPRINT = re.compile(r"smallest possible footprint is at least ([0-9.]+) GiB per GPU > ([0-9.]+) GiB")


def footprint_lower_bound(reasons: list[str]) -> tuple[float, float] | None:
    """(smallest footprint, HBM) in GiB from `solve`'s HBM-capacity reason, or None."""
    for reason in reasons:
        match = _FOOTPRINT.search(reason)
        if match:
            return float(match[1]), float(match[2])
    return None


def buyable_counts_from(low: int, domain: int, high: int):
    """Counts a cluster is bought in (parts of one domain, then whole domains) from `low` up."""
    for n in range(max(1, low), domain):
        if domain % n == 0:
            yield n
    n = max(domain, math.ceil(low / domain) * domain)
    while n <= high:
        yield n
        n += domain


def smallest_fitting_count(num_gpus: int, reasons: list[str], domain: int, fits: Callable[[int, float], bool],
                           time_limit_s: float, high: int = 1 << 24) -> int | None:
    """The smallest buyable count above `num_gpus` (whole domains of `domain` GPUs, or a part
    of one) at which `fits(count, seconds left)` — `solve` finding a mapping — holds, when
    `reasons` (an infeasible solve's) say no mapping fits memory; None when the reasons are
    another, or none is found within MAX_COUNTS_TRIED counts and `time_limit_s`."""
    if not any(reason.startswith(MEMORY_REASONS) for reason in reasons):
        return None
    bound = footprint_lower_bound(reasons)
    low = num_gpus + 1 if bound is None else max(num_gpus + 1, math.ceil(num_gpus * bound[0] / bound[1]))
    deadline = time.perf_counter() + time_limit_s
    for tried, n in enumerate(buyable_counts_from(low, domain, high)):
        left = deadline - time.perf_counter()
        if tried >= MAX_COUNTS_TRIED or left <= 0:
            return None
        if fits(n, left):
            return n
    return None


def nearest_batches(model: Model, system: System, num_gpus: int, batch: int, space: Space) -> list[int]:
    """The batches nearest `batch` (at most one below, one above) that leave some parallel
    split of `num_gpus` GPUs, the space's other pins kept; [] when none does at any batch."""
    free = dataclasses.replace(space, pins=tuple((name, values) for name, values in space.pins if name != "batch"))
    # (a cap of num_gpus admits every dp: dp <= N)
    dps = sorted({sk.dp for sk in enumerate_plan(model, system, num_gpus, num_gpus, free, chunk_rows=1 << 62).skeletons})
    if not dps:
        return []
    below = max((batch // dp * dp for dp in dps if batch // dp), default=None)
    above = min(-(-batch // dp) * dp for dp in dps)
    out = []
    for candidate in (below, above):
        if candidate and candidate not in out and _has_split(model, system, num_gpus, candidate, free):
            out.append(candidate)
    return out


def _has_split(model: Model, system: System, num_gpus: int, batch: int, space: Space) -> bool:
    return bool(enumerate_plan(model, system, num_gpus, batch, pinned(space, (("batch", (batch,)),)),
                               chunk_rows=1 << 62).skeletons)
