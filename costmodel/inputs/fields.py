"""The field types of every input file (model, system, mapping, runs): whole numbers, real
numbers and booleans as written in a file, a bound check naming its reason, and the
configuration every input model shares. costmodel.inputs.model re-exports them.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BeforeValidator, ConfigDict

from costmodel.inputs.limits import Bound

# ---- field types shared by the three inputs (model, system, mapping) ----
# pydantic's lax mode would read `true` (and YAML 1.1's yes/on) as 1 and the string "12" as
# 12; a size in an input file must be written as a number.


def _whole_number(value: object) -> object:
    """A whole number as written in a file: an int (numpy integers too), or a float with no
    fractional part (12.0, as JSON writers sometimes emit, reads as 12). Booleans, strings
    and fractions are rejected with a message saying why."""
    if isinstance(value, bool):
        raise ValueError("a boolean, not a whole number (YAML reads yes/no/on/off as booleans too)")
    if isinstance(value, str):
        if _yaml_exponent_text(value):
            signed = re.sub(r"([eE])(\d)", r"\1+\2", value)
            raise ValueError(f"text, not a number: YAML 1.1 reads an exponent without a sign as text (write {signed})")
        raise ValueError("a string, not a whole number (write the number without quotes)")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        if value != int(value):
            raise ValueError("not a whole number")
        return int(value)
    return value  # anything else (a list, a mapping) fails as "a valid integer" below


def _yaml_exponent_text(text: str) -> bool:
    """True for text like 1e3 or 2.5E9: a number to Python, a string to YAML 1.1."""
    try:
        float(text)
    except ValueError:
        return False
    return "e" in text.lower() and "inf" not in text.lower()


def _real_number(value: object) -> object:
    """A real number: not a boolean (lax pydantic would read `true` as 1.0). Strings holding a
    number are accepted: YAML 1.1 reads an exponent without a sign (`3.17e9`) as a string,
    and the number written is the one meant. NaN and infinity are refused by allow_inf_nan."""
    if isinstance(value, bool):
        raise ValueError("a boolean, not a number (YAML reads yes/no/on/off as booleans too)")
    return value


def _boolean(value: object) -> object:
    """A boolean as written in a file: JSON's true/false (YAML's yes/no/on/off read as those).
    A string is not one, "false" included (lax pydantic would read "false" as False, Python's
    bool("false") as True: the readings disagree, so neither is taken), nor is a number."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str):
        raise ValueError("a string, not a valid boolean (write true or false without quotes)")
    if isinstance(value, (int, float, np.number)):
        raise ValueError("a number, not a valid boolean (write true or false)")
    return value  # anything else (a list, a mapping) fails as "a valid boolean" below


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
"""An int field of an input file (a size, a count, an index)."""

RealNumber = Annotated[float, BeforeValidator(_real_number)]
"""A float field of an input file; finite (every input model sets allow_inf_nan=False)."""

Boolean = Annotated[bool, BeforeValidator(_boolean)]
"""A bool field of an input file: true or false, never a string or a number."""


def within(bound: Bound) -> AfterValidator:
    """A validator refusing values outside `bound`, naming the bound and its reason."""

    def check(value):
        problem = bound.problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


INPUT_CONFIG = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
"""Every input is frozen, forbids unknown fields (typos) and refuses NaN and infinity."""
