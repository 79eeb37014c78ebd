"""Fixing dimensions: `--fix DIM=VALUE[,VALUE...]` and a fixed global batch.

A pin keeps, of the space, only the mappings whose dimension DIM takes one of the values
given; the count, the enumeration, brute force and the CP-SAT search all read the pins from
the Space (`Space.pins`), so counts and certificates hold within the pinned space. DIM is a
dimension's short name, its table label or its Calculon field (`tp`, `tensor_par`); values
are numbers, a choice's name (`recompute=full`), on/off for a switch, a network's index.

Errors name where the pins were given (`--fix`, or a batch file's `fix`). A pin no mapping of
the problem can take (`ep=2` on a dense model, `weight_offload=on` without offload memory,
`tp_net=9` on a two-network system) is refused by `check_pins`, naming the dimension's own
rule, before any search: the search could only report an empty space.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import replace
from typing import Iterable

import costmodel.inputs.limits as limits
from costmodel.space.dimensions import BY_NAME, DEGREE, DIMENSIONS, Dimension
from costmodel.errors import InputError, shown
from costmodel.inputs.limits import Bound
from costmodel.inputs.model import Model
from costmodel.inputs.system import System
from solver.space.declaration import Space

_SWITCH_WORDS = {"on": 1, "off": 0, "true": 1, "false": 0, "yes": 1, "no": 0, "1": 1, "0": 0}


def _dimension(word: str, option: str) -> Dimension:
    names = {}
    for dim in DIMENSIONS:
        for alias in (dim.name, dim.header, dim.field):
            names[alias] = dim
    if word in names:
        return names[word]
    close = difflib.get_close_matches(word, list(names), n=1)
    if close:
        raise InputError(f"{option}: {word!r} is not a dimension (did you mean {close[0]}?)")
    raise InputError(f"{option}: {word!r} is not a dimension; dimensions: {', '.join(d.name for d in DIMENSIONS)}")


def _value(dim: Dimension, text: str, given: str, option: str) -> int:
    """The number or code of one value of `dim` written as `text`."""
    word = text.strip().lower()
    if dim.kind == "choice":
        names = [member.value for member in dim.choices]
        if word in names:
            return names.index(word)
        raise InputError(f"{option} {given}: {shown(text)} is not a {dim.name} (choose from {', '.join(names)})")
    if dim.kind == "switch":
        if word in _SWITCH_WORDS:
            return _SWITCH_WORDS[word]
        raise InputError(f"{option} {given}: {shown(text)} is not on or off")
    if dim.kind == "subgroup" and word == "all":
        return 0
    smallest = 0 if dim.kind == "network" else 1
    digits = word.lstrip("0") or "0"
    number = int(digits) if digits.isdigit() and len(digits) <= 19 else math.inf   # 19 digits: within int64
    if not word.isdigit() or number < smallest:
        kind = "a network index (0, 1, ...)" if dim.kind == "network" else "a whole number >= 1"
        raise InputError(f"{option} {given}: {shown(text)} is not {kind}")
    problem = dim.bound.problem(number)
    if problem is not None:
        raise InputError(f"{option} {dim.name}={digits if len(digits) <= 19 else digits[:19] + '…'}: {problem}")
    return int(number)


def parse_pins(texts: Iterable[str], option: str = "--fix") -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`["tp=8", "recompute=full,none"]` -> (("tp", (8,)), ("recompute", (0, 2))), in
    declaration order. A dimension given twice is an error naming it; `option` is where the
    pins were given (`--fix`, a batch file's `fix`)."""
    pins: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise InputError(f"{option} {text!r}: write DIM=VALUE[,VALUE...], e.g. tp=8 or recompute=full,none")
        dim = _dimension(name.strip(), option)
        if dim.name in pins:
            raise InputError(f"{option}: {dim.name} is fixed twice ({text!r})")
        pins[dim.name] = tuple(sorted({_value(dim, value, text, option) for value in values.split(",")}))
    return tuple((dim.name, pins[dim.name]) for dim in DIMENSIONS if dim.name in pins)


def pinned(space: Space, pins: tuple[tuple[str, tuple[int, ...]], ...]) -> Space:
    """`space` with these pins (added to any it has; a dimension pinned twice is an error)."""
    names = [name for name, _ in space.pins + pins]
    both = sorted({name for name in names if names.count(name) > 1})
    if both:   # e.g. --fix batch=3 with --batch 4: neither would win silently
        raise InputError(f"--fix: {', '.join(both)} is fixed twice")
    order = [dim.name for dim in DIMENSIONS]
    return replace(space, pins=tuple(sorted(space.pins + pins, key=lambda pin: order.index(pin[0]))))


BATCH_CAP = 3072
"""The largest global batch, in sequences, a search takes by default (and the paper spaces' cap:
the multi-trillion-parameter study trains with 3,072 sequences)."""
DEFAULT_BATCH_TOKENS = 1 << 24
"""The default global batch's token budget, 2^24 = 16.8M tokens: the Llama 3 paper's batch in its
main pre-training stage (Dubey et al. 2024, §3.4.1: 16M tokens per batch; DeepSeek-V3 used
15,360 × 4,096 ≈ 63M at the end of its ramp)."""
PAPER_SPACES = frozenset({"calculon-2023", "calculon-current"})
"""Spaces that keep the paper's cap of 3,072 sequences whatever the sequence length."""


def default_batch_cap(seq_size: int, space_name: str) -> int:
    """The global batch cap, in sequences, when none is given: the largest power of two of
    sequences whose tokens stay within DEFAULT_BATCH_TOKENS, and at most BATCH_CAP (2,048 at
    8,192 tokens, 128 at 131,072; 3,072 up to 4,096 tokens). A power of two keeps every
    power-of-two dp a divisor, so the batch a split takes (the largest multiple of dp under the
    cap) is the cap itself. The paper spaces keep BATCH_CAP."""
    if space_name in PAPER_SPACES:
        return BATCH_CAP
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq_size)
    return min(BATCH_CAP, 1 << (sequences.bit_length() - 1))


def batch_text(cap: int, seq_size: int, space: Space, source: str) -> str:
    """The global batch as headers state it, in sequences and tokens: "global batch 1,024
    sequences = 8.4M tokens (given)" when fixed, else "global batch ≤ 2,048 sequences = 16.8M
    tokens (default: ...)". `source`: "default" or "given" (the cap)."""
    fixed = dict(space.pins).get("batch")
    if fixed is not None and len(fixed) == 1:
        return f"global batch {fixed[0]:,} sequences = {_tokens(fixed[0] * seq_size)} tokens (given)"
    if source == "given":
        why = "given cap"
    elif space.name in PAPER_SPACES:
        why = f"default: space {space.name}'s cap"
    else:
        why = "default: the largest power of two within 2^24 = 16.8M tokens"
    return f"global batch ≤ {cap:,} sequences = {_tokens(cap * seq_size)} tokens ({why})"


def _tokens(count: int) -> str:
    """16.8M, 524K or 8,192: a token count as headers give it."""
    if count >= 1_000_000:
        return f"{count / 1e6:.1f}M"
    return f"{count / 1e3:.0f}K" if count >= 10_000 else f"{count:,}"


def batch_cap(max_batch: int, batch: int | None, batch_tokens: int | None, seq_size: int,
              max_batch_given: bool, batch_bound: Bound = limits.MAX_BATCH_SEARCH
              ) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The batch cap and pins for a fixed global batch. A fixed batch B is the cap B with the
    batch pinned to B: only mappings whose dp divides B remain. `batch_tokens` is B·seq_size,
    and B keeps within `batch_bound`, the bound --batch has (a search's or a count's)."""
    if batch is not None and batch_tokens is not None:
        raise InputError("--batch and --batch-tokens: give one of them")
    if batch_tokens is not None:
        if batch_tokens % seq_size:
            raise InputError(f"--batch-tokens {batch_tokens}: not a whole number of sequences of "
                             f"seq_size {seq_size} tokens ({batch_tokens / seq_size:g})")
        batch = batch_tokens // seq_size
        problem = batch_bound.problem(batch)
        if problem is not None:
            raise InputError(f"--batch-tokens {batch_tokens}: {batch:,} sequences of seq_size {seq_size} tokens, "
                             f"{problem}")
    if batch is None:
        return max_batch, ()
    if max_batch_given:
        raise InputError(f"--batch {batch} fixes the global batch; --max-batch {max_batch} caps it: give one")
    return batch, (("batch", (batch,)),)


def check_pins(pins: tuple[tuple[str, tuple[int, ...]], ...], model: Model, system: System, num_gpus: int,
               space: Space, option: str = "--fix") -> None:
    """Refuse a pinned value no mapping of this problem can take, naming why: a degree that
    does not divide the GPUs, a value the space does not offer, or the dimension's declared
    rule (`Dimension.fits`) on that value alone (rules that need other dimensions' values are
    left to the search)."""
    offered = {flag.name: flag.domain(len(system.networks)) for flag in space.flags}
    for name, values in pins:
        dim = BY_NAME[name]
        for value in values:
            shown = f"{option} {name}={dim.label_of(value) if dim.is_flag else value}"
            reason = _pin_problem(dim, value, model, system, num_gpus, space, offered)
            if reason is not None:
                raise InputError(f"{shown}: {reason}")


def _pin_problem(dim: Dimension, value: int, model: Model, system: System, num_gpus: int, space: Space,
                 offered: dict[str, tuple[int, ...]]) -> str | None:
    """Why dimension `dim` can never take `value` in this problem, or None."""
    if dim.name in DEGREE and num_gpus % value:
        return f"{dim.name} {value} does not divide the {num_gpus:,} GPUs"
    limit = space.limit(dim.name) if dim.name in DEGREE else None
    if limit is not None and value > limit:
        return f"{dim.name} {value} is above {limit}, the largest space {space.name} considers"
    if dim.fits is not None:
        try:
            reason = dim.fits(model, system, {dim.name: dim.value_of(value)})
        except KeyError:       # the rule reads another dimension's value too: the search applies it
            reason = None
        if reason is not None:
            return reason
    if dim.name in offered and value not in offered[dim.name]:
        labels = ", ".join(dim.label_of(code) for code in offered[dim.name])
        return f"space {space.name} does not offer {dim.name} {dim.label_of(value)} (it offers {labels})"
    return None


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
