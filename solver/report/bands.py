"""The error band of an answer (costmodel.measured.error_bands), as the commands print it and
as their JSON carries it."""

from __future__ import annotations

import textwrap

from costmodel.measured.error_bands import Band, band_document, band_text, error_class, load_bands


def mapping_band(model, system, mapping) -> tuple[str, Band | None]:
    """(the class of a mapping's prediction, its band or None when no measured run is of it)."""
    cls = error_class(system, model, mapping.precision, mapping.datatype)
    return cls, load_bands().get(cls)


def band_json(model, system, mapping, time_s: float | None) -> dict:
    cls, band = mapping_band(model, system, mapping)
    return band_document(band, cls, time_s)


def band_line(model, system, mapping, time_s: float | None) -> str:
    cls, band = mapping_band(model, system, mapping)
    return band_text(band, cls, time_s)


def plan_band(model, system, result) -> dict | None:
    """The chosen count's days and GPU-hours as the error band stretches its steps (each phase's
    step time, and so the compute days and GPU-hours, scale alike); None without a choice."""
    row = result.choice.plan
    if row is None:
        return None
    cls, band = mapping_band(model, system, row.phases[0].result.best.mapping)
    doc = band_document(band, cls, None)
    if band is not None:
        scale = band.time_range(1.0)
        doc["wall_days_range"] = [row.cost.wall_days * s for s in scale]
        doc["gpu_hours_range"] = [row.cost.gpu_hours * s for s in scale]
    return doc


def plan_band_line(doc: dict | None) -> str | None:
    """"55.1–63.8 days, 21.7M–25.1M GPU-hours: model -3 % to +9 % of measured (...)", or the
    class's unknown error."""
    if doc is None:
        return None
    if "unknown" in doc:
        return f"error band: {doc['class']}: {doc['unknown']}"
    days, hours = doc["wall_days_range"], doc["gpu_hours_range"]
    band = Band(doc["class"], doc["runs"], doc["error_low"], doc["error_high"], doc["error_median"])
    return (f"with its error band: {days[0]:.1f}–{days[1]:.1f} days, {hours[0] / 1e6:.2f}M–{hours[1] / 1e6:.2f}M "
            f"GPU-hours ({band.text()})")


def indistinguishable(model, system, top) -> list[dict]:
    """The mappings of `top` (the best first) whose predicted time lies within the best's error
    band — the measured time the band allows the best, up to its highest — with the fields each
    differs in from the best: under the model's error, the short list worth measuring. [] when
    the best's class has no band."""
    if not top:
        return []
    best = top[0]
    _, band = mapping_band(model, system, best.mapping)
    if band is None:
        return []
    _, ceiling = band.time_range(best.iteration_time_s)
    fields = best.mapping.model_dump(mode="json")
    out = []
    for rank, ev in enumerate(top[1:], start=2):
        if ev.iteration_time_s > ceiling:
            break
        other = ev.mapping.model_dump(mode="json")
        out.append({"rank": rank, "iteration_time_s": ev.iteration_time_s,
                    "differs_in": sorted(k for k in fields if fields[k] != other.get(k))})
    return out


def indistinguishable_line(rows: list[dict], top_size: int, width: int = 120) -> str | None:
    """Lines naming them, wrapped to `width` columns (a heading, then a mapping a line with the
    fields it differs in), or None when none is."""
    if not rows:
        return None
    every = " (every row of the top: ask for more with --top-k)" if len(rows) == top_size - 1 else ""
    lines = textwrap.wrap(f"indistinguishable from the best under the model's error (predicted within its error "
                          f"band){every}:", width)
    for r in rows:
        lines += textwrap.wrap(f"#{r['rank']} differs in {', '.join(r['differs_in'])}", width,
                               initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)
