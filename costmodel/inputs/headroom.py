"""HBM headroom as the command line (--hbm-headroom) and batch files (hbm_headroom) give it: memory
each GPU must leave free beyond the runtime reserve and the fitted allocator term. System keeps it
as hbm_headroom_gib and hbm_headroom_percent (costmodel.inputs.system.System.usable_hbm_bytes)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

import costmodel.inputs.limits as limits
from costmodel.errors import InputError
from costmodel.inputs.model import INPUT_CONFIG


class Headroom(BaseModel):
    """HBM kept free as the command line and batch files give it: "4", "4GiB" (GiB) or "5%" (of the
    HBM capacity)."""

    model_config = INPUT_CONFIG

    gib: float = Field(0.0, description="HBM kept free per GPU, GiB.")
    percent: float = Field(0.0, description="HBM kept free per GPU, percent of the HBM capacity.")
    text: str = Field("0", description="The headroom as it was written, for messages.")

    @classmethod
    def parse(cls, text: str | float, where: str = "--hbm-headroom") -> "Headroom":
        """`4`, `4GiB`, `4 GiB` or `5%`; anything else, or a value out of range, is an InputError
        naming `where` and the value."""
        if isinstance(text, bool):
            raise InputError(f"{where}: {text!r} is not a headroom (write 4, 4GiB or 5%)")
        raw = str(text).strip()
        word = raw.lower().replace(" ", "")
        percent = word.endswith("%")
        number = word.removesuffix("%").removesuffix("gib")
        try:
            value = float(number)
        except ValueError:
            raise InputError(f"{where}: {raw!r} is not a headroom (write 4, 4GiB or 5%)") from None
        bound = limits.HEADROOM_PERCENT if percent else limits.CAPACITY_GIB_OR_ZERO
        problem = bound.problem(value) if math.isfinite(value) else "not a finite number"
        if problem is not None:
            raise InputError(f"{where}: {raw} is {problem}")
        return cls(gib=0.0 if percent else value, percent=value if percent else 0.0, text=raw)
