"""Fixing dimensions: `--fix DIM=VALUE[,VALUE...]` and a fixed global batch.

A pin keeps, of the space, only the mappings whose dimension DIM takes one of the values
given; the count, the enumeration, brute force and the CP-SAT search all read the pins from
the Space (`Space.pins`), so counts and certificates hold within the pinned space. DIM is a
dimension's short name, its table label or its Calculon field (`tp`, `tensor_par`); values
are numbers, a choice's name (`recompute=full`), on/off for a switch, a network's index.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from typing import Iterable

from costmodel.dimensions import BY_NAME, DIMENSIONS, Dimension
from costmodel.errors import InputError
from solver.space.declaration import Space

_SWITCH_WORDS = {"on": 1, "off": 0, "true": 1, "false": 0, "yes": 1, "no": 0, "1": 1, "0": 0}


def _dimension(word: str) -> Dimension:
    names = {}
    for dim in DIMENSIONS:
        for alias in (dim.name, dim.header, dim.field):
            names[alias] = dim
    if word in names:
        return names[word]
    close = difflib.get_close_matches(word, list(names), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise InputError(f"--fix: {word!r} is not a dimension{hint}; dimensions: "
                     f"{', '.join(d.name for d in DIMENSIONS)}")


def _value(dim: Dimension, text: str, given: str) -> int:
    """The number or code of one value of `dim` written as `text`."""
    word = text.strip().lower()
    if dim.kind == "choice":
        names = [member.value for member in dim.choices]
        if word in names:
            return names.index(word)
        raise InputError(f"--fix {given}: {text!r} is not a {dim.name} (choose from {', '.join(names)})")
    if dim.kind == "switch":
        if word in _SWITCH_WORDS:
            return _SWITCH_WORDS[word]
        raise InputError(f"--fix {given}: {text!r} is not on or off")
    smallest = 0 if dim.kind == "network" else 1
    if not word.isdigit() or int(word) < smallest:
        kind = "a network index (0, 1, ...)" if dim.kind == "network" else "a whole number >= 1"
        raise InputError(f"--fix {given}: {text!r} is not {kind}")
    return int(word)


def parse_pins(texts: Iterable[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`["tp=8", "recompute=full,none"]` -> (("tp", (8,)), ("recompute", (0, 2))), in
    declaration order. A dimension given twice is an error naming it."""
    pins: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise InputError(f"--fix {text!r}: write DIM=VALUE[,VALUE...], e.g. tp=8 or recompute=full,none")
        dim = _dimension(name.strip())
        if dim.name in pins:
            raise InputError(f"--fix: {dim.name} is fixed twice ({text!r})")
        pins[dim.name] = tuple(sorted({_value(dim, value, text) for value in values.split(",")}))
    return tuple((dim.name, pins[dim.name]) for dim in DIMENSIONS if dim.name in pins)


def pinned(space: Space, pins: tuple[tuple[str, tuple[int, ...]], ...]) -> Space:
    """`space` with these pins (added to any it has; a dimension pinned twice is an error)."""
    both = {name for name, _ in space.pins} & {name for name, _ in pins}
    if both:
        raise InputError(f"--fix: {', '.join(sorted(both))} is fixed twice")
    order = [dim.name for dim in DIMENSIONS]
    return replace(space, pins=tuple(sorted(space.pins + pins, key=lambda pin: order.index(pin[0]))))


def batch_cap(max_batch: int, batch: int | None, batch_tokens: int | None, seq_size: int,
              max_batch_given: bool) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The batch cap and pins for a fixed global batch. A fixed batch B is the cap B with the
    batch pinned to B: only mappings whose dp divides B remain. `batch_tokens` is B·seq_size."""
    if batch is not None and batch_tokens is not None:
        raise InputError("--batch and --batch-tokens: give one of them")
    if batch_tokens is not None:
        if batch_tokens % seq_size:
            raise InputError(f"--batch-tokens {batch_tokens}: not a whole number of sequences of "
                             f"seq_size {seq_size} tokens ({batch_tokens / seq_size:g})")
        batch = batch_tokens // seq_size
    if batch is None:
        return max_batch, ()
    if max_batch_given:
        raise InputError(f"--batch {batch} fixes the global batch; --max-batch {max_batch} caps it: give one")
    return batch, (("batch", (batch,)),)


def describe_pins(space: Space) -> dict[str, list]:
    """The pins as people write them: {"tp": [8], "recompute": ["full", "none"]}."""
    out = {}
    for name, allowed in space.pins:
        dim = BY_NAME[name]
        out[name] = [dim.label_of(code) if dim.is_flag else code for code in allowed]
    return out


def pins_text(space: Space) -> str:
    """", fixed tp=8 recompute=full,none" (empty without pins), for headers and titles."""
    pins = describe_pins(space)
    if not pins:
        return ""
    return ", fixed " + " ".join(f"{name}={','.join(map(str, values))}" for name, values in pins.items())
