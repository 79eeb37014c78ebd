"""`mapsat validate --runs`: a run file scored against system files, as one report.

The newest software release of each configuration is scored and summarised; the older
releases of the same configurations are reported separately (software got faster, so they
are not the model's target). Summaries count the scored runs only: a run the model calls
infeasible, cannot take, or that has no measured time is listed with its reason instead.
NVFP4 runs are reported (by precision) but left out of the overall and per-system figures:
their FP4 GEMMs run on the FP8 fit at the FP4 peak, which no measurement backs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from costmodel.measured.run_scoring import (ErrorSummary, RunInputs, RunScore, by_precision, by_system, is_targeted,
                                   newest_per_configuration, score_runs, summarize)
from costmodel.measured.runs import Run

__all__ = ["RunsReport", "gap_tags", "validate_runs"]


def gap_tags(score: RunScore) -> str:
    """The gaps of one run in a few words each (the text before each gap's colon)."""
    return "; ".join(gap.split(":")[0] for gap in score.not_expressible)


@dataclass(frozen=True)
class RunsReport:
    """Scores of a run file: the newest release of each configuration, and the older ones."""

    source: str
    newest: tuple[RunScore, ...]
    older: tuple[RunScore, ...]

    @property
    def targeted(self) -> tuple[RunScore, ...]:
        return tuple(s for s in self.newest if is_targeted(s))

    @property
    def overall(self) -> tuple[ErrorSummary, ...]:
        """Step time over the targeted newest runs (one group, "all"; empty if none scored)."""
        return summarize(self.targeted)

    @property
    def by_system(self) -> tuple[ErrorSummary, ...]:
        return summarize(self.targeted, by_system)

    @property
    def by_precision(self) -> tuple[ErrorSummary, ...]:
        """Every precision, NVFP4 included (reported, not targeted)."""
        return summarize(self.newest, by_precision)

    @property
    def memory(self) -> tuple[ErrorSummary, ...]:
        """Peak memory over the newest runs that measured it."""
        return summarize(self.newest, error=lambda s: s.memory_error)

    @property
    def older_overall(self) -> tuple[ErrorSummary, ...]:
        return summarize((s for s in self.older if is_targeted(s)))

    @property
    def unscored(self) -> tuple[RunScore, ...]:
        """Runs of either set that were not scored (infeasible, not modelled, not measured)."""
        return tuple(s for s in self.newest + self.older if s.status != "scored")

    def to_dict(self) -> dict:
        def summaries(items: Iterable[ErrorSummary]) -> list[dict]:
            return [item.to_dict() for item in items]

        return {"source": self.source,
                "summary": {"step_time": summaries(self.overall), "by_system": summaries(self.by_system),
                            "by_precision": summaries(self.by_precision), "peak_memory": summaries(self.memory),
                            "older_releases": summaries(self.older_overall),
                            "targeted": "newest release of each configuration, NVFP4 left out"},
                "runs": [s.to_dict() for s in self.newest],
                "older_runs": [s.to_dict() for s in self.older]}


def validate_runs(runs: Iterable[Run], inputs: RunInputs | None = None, source: str = "") -> RunsReport:
    """Score `runs` (newest release of each configuration, then the older ones)."""
    newest, older = newest_per_configuration(runs)
    inputs = inputs or RunInputs()
    return RunsReport(source, score_runs(newest, inputs), score_runs(older, inputs))
