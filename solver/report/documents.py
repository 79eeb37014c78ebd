"""JSON documents the commands print with --json: deterministic, JSON-safe, and free of the
table renderer (rich), which a --json run never imports."""

from __future__ import annotations

import json
import math
from typing import Any

from costmodel.terms.training_cost import SECONDS_PER_DAY
from solver.search.plan import CountPlan, PlanResult


def json_safe(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, non-finite floats to null."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def tokens_per_s_per_gpu(record: dict) -> float | None:
    """A solved record's training throughput per GPU: global batch · seq_size tokens per
    iteration time, over the GPUs (as published tables count it, MFU aside); None unsolved."""
    problem, best = record.get("problem") or {}, record.get("best") or {}
    batch = (best.get("mapping") or {}).get("batch_size")
    seq, time_s, gpus = (problem.get("model") or {}).get("seq_size"), best.get("iteration_time_s"), problem.get("gpus")
    if not (batch and seq and time_s and gpus):
        return None
    return batch * seq / (time_s * gpus)


def gpu_hours_per_million_tokens(record: dict) -> float | None:
    """A solved record's cost without a price: GPU-hours to train on a million tokens (times a
    GPU-hour's price, the cost); None unsolved."""
    rate = tokens_per_s_per_gpu(record)
    return None if not rate else 1e6 / rate / 3600.0


def dumps(document: dict) -> str:
    """Deterministic JSON: sorted keys, fixed indentation."""
    return json.dumps(json_safe(document), indent=2, sort_keys=True)


def _row_document(row: CountPlan) -> dict:
    doc = {"num_gpus": row.num_gpus, "feasible": row.feasible, "answered": not row.unanswered, "reason": row.reason,
           "phases": [
        {"name": p.phase.name, "tokens": p.phase.tokens, "seq_size": p.phase.seq_size, "steps": p.steps,
         "compute_s": p.compute_s, "status": p.result.status.value, "certified_optimal": p.result.certified_optimal,
         "iteration_time_s": p.result.best.iteration_time_s if p.result.best else None,
         "mfu": p.result.best.mfu if p.result.best else None,
         "mapping": p.result.best.mapping.model_dump(mode="json") if p.result.best else None}
        for p in row.phases]}
    if row.feasible:
        f, c = row.failures, row.cost
        doc.update(mfu=row.mfu, compute_s=c.compute_s, wall_s=c.wall_s, wall_days=c.wall_days, gpu_hours=c.gpu_hours,
                   interruptions=c.interruptions, energy_j=c.energy_j, cost_usd=c.cost_usd,
                   failures={"mtbf_s": f.mtbf_s, "checkpoint_stall_s": f.checkpoint_stall_s,
                             "checkpoint_write_s": f.checkpoint_write_s, "interval_s": f.interval_s,
                             "restart_s": f.restart_s, "lost_fraction": f.lost_fraction, "goodput": f.goodput})
    return doc


def plan_document(result: PlanResult) -> dict:
    s, t = result.settings, result.target
    return {"counts": [_row_document(row) for row in result.counts],
            "chosen": result.choice.plan.num_gpus if result.choice.plan else None,
            "rule": result.choice.rule, "message": result.choice.message,
            "partial": result.interrupted_at is not None, "interrupted_at_gpus": result.interrupted_at,
            "checkpoint_state_bytes": result.state_bytes, "seconds": result.seconds,
            "settings": {"failure_rate_per_gpu_hour": s.failure_rate_per_gpu_hour,
                         "checkpoint_bytes_per_s": s.checkpoint_gbps * 1e9, "async_checkpoint": s.async_checkpoint,
                         "snapshot_bytes_per_s": s.snapshot_gbps * 1e9, "restart_s": s.restart_minutes * 60,
                         "gpu_power_w": s.gpu_power_w, "pue": s.pue, "gpu_hour_price_usd": s.gpu_hour_price_usd},
            "target": {"deadline_s": None if t.deadline_days is None else t.deadline_days * SECONDS_PER_DAY,
                       "budget_usd": t.budget_usd}}
