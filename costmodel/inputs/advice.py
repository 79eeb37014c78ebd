"""Inputs that are legal but probably a mistake: one line each, which the command line prints
as a warning on stderr (silenced by --quiet). Inputs that make no sense are errors instead
(costmodel.inputs.limits and the input schemas)."""

from __future__ import annotations

import math

from costmodel.inputs.model import Model

TP_MAX = 256
"""The largest tensor parallelism the mapping spaces consider (solver.space.declaration)."""


def model_warnings(model: Model, source: str) -> list[str]:
    """What about a model file is probably not meant: heads that do not divide hidden (which
    leaves tensor parallelism only the common divisors of the two)."""
    out = []
    if model.hidden % model.attn_heads:
        common = math.gcd(model.hidden, model.attn_heads, model.feedforward)
        tp = max(d for d in range(1, min(common, TP_MAX) + 1) if common % d == 0)
        only = "tp can only be 1" if tp == 1 else f"tp can be at most {tp}"
        out.append(f"{source}: attn_heads {model.attn_heads} does not divide hidden {model.hidden} (usually hidden = "
                   f"heads × head size); tp must divide hidden, heads and feedforward, so {only}")
    return out


def override_warnings(offload_gib: float | None, offload_gbps: float | None) -> list[str]:
    """Co-design options that cancel each other."""
    if offload_gib == 0 and offload_gbps is not None:
        return [f"--offload-gbps {offload_gbps:g} is ignored: --offload-gib 0 removes the offload memory"]
    return []


DATATYPE_SHORT_NAMES = {"fp8": ("float8", "fp8-tensorwise"), "bf16": ("bfloat16", None),
                        "fp16": ("float16", None), "fp32": ("float32", None)}
"""The short names problem ids and Megatron-LM use, each with the datatype that means it (and,
for fp8, the precision recipe that means Transformer Engine's FP8)."""


def datatype_hint(value, datatype_option: str, precision_option: str) -> str | None:
    """What to write instead of a short datatype name (`fp8`), in a surface's own option names
    (`--datatype`/`--precision`, or a batch file's `datatype:`/`precision:`); None otherwise."""
    short = DATATYPE_SHORT_NAMES.get(str(value).strip().lower())
    if short is None:
        return None
    datatype, recipe = short
    if recipe is None:
        return f"use {datatype_option} {datatype}"
    return (f"use {datatype_option} {datatype} (Calculon's all-FP8) or {precision_option} {recipe} "
            f"(Transformer Engine's)")
