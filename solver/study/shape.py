"""Model shapes by the paper's rule, and candidate shapes near a parameter target.

The rule (Isaev, McDonald, Vuduc 2023, "Scaling Infrastructure to Support Multi-Trillion
Parameter LLM Training", as quoted in ../shared/BRIEF.md): sequence 8192, feed-forward
4 × hidden, attention heads = blocks unless stated otherwise, hidden in steps of 1024, and
the aspect ratio hidden / blocks extrapolated linearly from GPT-3-era models.

The paper does not print its fit, so ours is stated here and in docs/paper-reproduction.md:
a least-squares line of aspect ratio against log10(parameters) through the four published
shapes in `ASPECT_POINTS`:

    aspect(P) = -940.5 + 95.10 · log10(P)      (128 at 175B, 201 at 1T, 300 at 11T, 401 at 128T)

A line against the parameter count itself would reach an aspect ratio of ~10,900 at 128T
(≈ 30 blocks), which no one would build; against the logarithm it grows as model shapes
historically have. From the aspect ratio r the block count follows from the dominant
parameter term, 12·L·h² = P with h = r·L, i.e. L = (P / (12·r²))^(1/3). The paper does
not say how it rounds. Following its own advice (step blocks and heads by powers of two) we
round blocks to a multiple of `blocks_step` = 32, so that pp and tp (heads = blocks) can
both reach 32 on power-of-two GPU counts, and pick the multiple of 1024 for hidden that
brings the exact parameter count (`Model.total_params`) closest to the target. A step of 8
was tried first: it gave 32T 280 blocks (= 8·35) and 128T 408 (= 8·51), whose pipelines
cannot go deeper than 8 stages on 4,096 GPUs, and those models did not fit even with 2 TiB
of offload memory — an artefact of the rounding, not of the size.

When heads do not divide hidden, the head width is rounded (`attn_size = round(h / heads)`)
and the exact parameter count uses heads·attn_size; the table says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from costmodel.errors import InputError
from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import ensure_directory, parse
from costmodel.inputs.model import Model
from costmodel.inputs.system import System

SEQ_SIZE = 8192
"""Sequence length of every model in the paper's scaling study (brief: "sequence 8192")."""
VOCAB_SIZE = 51200
"""Megatron's padded GPT-2 vocabulary, the default of costmodel.inputs.model.Model."""
HIDDEN_STEP = 1024
"""Hidden sizes step by 1024 (brief)."""
FEEDFORWARD_MULTIPLE = 4
"""Feed-forward = 4 × hidden (brief)."""
BLOCKS_STEP = 32
"""Our rounding of the block count (the paper does not state one): a multiple of 32."""


@dataclass(frozen=True)
class AspectPoint:
    """A published model shape the aspect-ratio fit goes through."""

    name: str
    params: float
    hidden: int
    blocks: int
    source: str

    @property
    def aspect(self) -> float:
        return self.hidden / self.blocks


ASPECT_POINTS: tuple[AspectPoint, ...] = (
    AspectPoint("GPT-3 175B", 175e9, 12288, 96, "Brown et al. 2020, Table 2.1"),
    AspectPoint("MT-NLG 530B", 530e9, 20480, 105, "Smith et al. 2022, Table 1 (Megatron-Turing NLG)"),
    AspectPoint("PaLM 540B", 540e9, 18432, 118, "Chowdhery et al. 2022, Table 1"),
    AspectPoint("Megatron 1T", 1e12, 25600, 128, "Narayanan et al. 2021, Table 1 (1T configuration)"),
)


def _fit() -> tuple[float, float]:
    """(intercept, slope) of aspect = intercept + slope · log10(params), least squares."""
    x = np.log10([p.params for p in ASPECT_POINTS])
    y = np.array([p.aspect for p in ASPECT_POINTS])
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


ASPECT_INTERCEPT, ASPECT_SLOPE = _fit()


def aspect_ratio(params: float) -> float:
    """Hidden / blocks for a model of `params` parameters, by the log-linear fit."""
    if not params > 0:
        raise InputError(f"params: {params!r} must be > 0")
    return ASPECT_INTERCEPT + ASPECT_SLOPE * math.log10(params)


def ideal_blocks(params: float) -> float:
    """Unrounded block count: L = (P / (12·r²))^(1/3) from 12·L·h² = P and h = r·L."""
    r = aspect_ratio(params)
    if r <= 0:
        raise InputError(f"params: {params:.3g} is below the range of the aspect-ratio fit (aspect {r:.1f} <= 0)")
    return (params / (12.0 * r * r)) ** (1.0 / 3.0)


def size_label(params: float) -> str:
    """A compact size for names: 1.1e12 -> '1.1t', 5e11 -> '500b', 1.28e14 -> '128t'."""
    for unit, scale in (("t", 1e12), ("b", 1e9), ("m", 1e6)):
        if params >= scale:
            return f"{params / scale:.3g}{unit}"
    return f"{params:.3g}"


def make_model(blocks: int, hidden: int, heads: int | None = None, *, seq_size: int = SEQ_SIZE,
               vocab_size: int = VOCAB_SIZE, name: str | None = None) -> Model:
    """A model by the rule's conventions: feed-forward 4·h, heads = blocks unless given,
    head width h / heads (rounded when it does not divide)."""
    heads = blocks if heads is None else heads
    for field, value in (("blocks", blocks), ("hidden", hidden), ("heads", heads)):
        if value <= 0:
            raise InputError(f"{field}: {value} must be > 0")
    attn_size = max(1, round(hidden / heads))
    name = name or f"shape-{blocks}b-h{hidden}"
    return parse(Model, dict(name=name, hidden=hidden, feedforward=FEEDFORWARD_MULTIPLE * hidden, seq_size=seq_size,
                             attn_heads=heads, attn_size=attn_size, num_blocks=blocks, vocab_size=vocab_size),
                 f"shape {name}")


def hidden_for(params: float, blocks: int, heads: int | None = None, *, seq_size: int = SEQ_SIZE,
               vocab_size: int = VOCAB_SIZE) -> int:
    """The multiple of 1024 for hidden that brings `blocks` blocks closest to `params`."""
    guess = math.sqrt(params / (12.0 * blocks))
    low = max(HIDDEN_STEP, math.floor(guess / HIDDEN_STEP) * HIDDEN_STEP)
    options = [h for h in (low - HIDDEN_STEP, low, low + HIDDEN_STEP, low + 2 * HIDDEN_STEP) if h >= HIDDEN_STEP]
    return min(options, key=lambda h: (abs(make_model(blocks, h, heads, seq_size=seq_size,
                                                      vocab_size=vocab_size).total_params - params), h))


@dataclass(frozen=True)
class Shape:
    """One candidate shape near a parameter target."""

    model: Model
    target_params: float
    rule: bool  # True for the rule's own choice

    @property
    def params(self) -> int:
        return self.model.total_params

    @property
    def params_error(self) -> float:
        """(params − target) / target."""
        return (self.params - self.target_params) / self.target_params

    @property
    def aspect(self) -> float:
        return self.model.hidden / self.model.num_blocks

    @property
    def heads_divide_hidden(self) -> bool:
        return self.model.attn_heads * self.model.attn_size == self.model.hidden

    def to_dict(self) -> dict:
        m = self.model
        return {"name": m.name, "blocks": m.num_blocks, "hidden": m.hidden, "heads": m.attn_heads,
                "attn_size": m.attn_size, "feedforward": m.feedforward, "seq_size": m.seq_size, "params": self.params,
                "params_error": self.params_error, "aspect": self.aspect, "rule": self.rule}


def rule_blocks(params: float, blocks_step: int = BLOCKS_STEP) -> int:
    """The rule's block count: the ideal one rounded to a multiple of `blocks_step`."""
    if blocks_step <= 0:
        raise InputError(f"blocks step: {blocks_step} must be > 0")
    return max(blocks_step, round(ideal_blocks(params) / blocks_step) * blocks_step)


def shape_name(params: float, blocks: int) -> str:
    """`gpt-<size>-<blocks>b`, as problems/models/gpt-1t-256b.yaml."""
    return f"gpt-{size_label(params)}-{blocks}b"


def rule_shape(params: float, *, heads: int | None = None, blocks_step: int = BLOCKS_STEP,
               seq_size: int = SEQ_SIZE, vocab_size: int = VOCAB_SIZE) -> Shape:
    """The paper's rule for one parameter target (see the module docstring)."""
    blocks = rule_blocks(params, blocks_step)
    hidden = hidden_for(params, blocks, heads, seq_size=seq_size, vocab_size=vocab_size)
    model = make_model(blocks, hidden, heads, seq_size=seq_size, vocab_size=vocab_size,
                       name=shape_name(params, blocks))
    return Shape(model, params, rule=True)


def candidate_blocks(params: float, spread: int = 4, blocks_step: int = BLOCKS_STEP) -> list[int]:
    """Block counts worth comparing: every count within `spread` of the rule's, and the
    power of two nearest to it (the paper's advice)."""
    center = rule_blocks(params, blocks_step)
    values = {b for b in range(center - spread, center + spread + 1) if b > 0}
    values.add(2 ** round(math.log2(ideal_blocks(params))))
    return sorted(values)


def candidate_shapes(params: float, *, blocks: list[int] | None = None, heads: int | None = None,
                     spread: int = 4, blocks_step: int = BLOCKS_STEP, seq_size: int = SEQ_SIZE,
                     vocab_size: int = VOCAB_SIZE) -> list[Shape]:
    """Shapes near `params`: for each block count (given, or `candidate_blocks`), hidden
    stepped by 1024 closest to the target; heads = blocks unless `heads` is given."""
    try:
        rule = rule_shape(params, heads=heads, blocks_step=blocks_step, seq_size=seq_size, vocab_size=vocab_size)
    except InputError:
        if not blocks:
            raise
        rule = None  # below the fit's range: the given block counts are still listed
    shapes = []
    for b in blocks if blocks else candidate_blocks(params, spread, blocks_step):
        if b <= 0:
            raise InputError(f"blocks: {b} must be > 0")
        hidden = hidden_for(params, b, heads, seq_size=seq_size, vocab_size=vocab_size)
        model = make_model(b, hidden, heads, seq_size=seq_size, vocab_size=vocab_size, name=shape_name(params, b))
        shapes.append(Shape(model, params, rule=rule is not None and model == rule.model))
    return shapes


def model_yaml(shape: Shape) -> str:
    """A model file for `shape`, with a header saying how it was made."""
    m = shape.model
    note = "" if shape.heads_divide_hidden else (
        f"\n# heads × attn_size = {m.attn_heads * m.attn_size} ≠ hidden (head width rounded).")
    header = (
        f"# Generated by `mapsat shape --params {shape.target_params:.4g} "
        f"{'--rule-only' if shape.rule else f'--blocks {m.num_blocks}'} --write DIR` (solver/study/shape.py): the\n"
        f"# paper's shape rule — sequence {m.seq_size}, feed-forward 4 × hidden, heads = blocks unless stated,\n"
        f"# hidden stepped by 1024, aspect ratio hidden/blocks from a log-linear fit through GPT-3 175B,\n"
        f"# MT-NLG 530B, PaLM 540B and Megatron 1T (aspect {aspect_ratio(shape.target_params):.1f} at this size;"
        f" this shape {shape.aspect:.1f}).\n"
        f"# Parameters: {shape.params:,} ({shape.params_error:+.2%} from the target).{note}\n")
    body = yaml.safe_dump(m.model_dump(), sort_keys=False)
    return header + body


def write_shapes(shapes: list[Shape], directory: str | Path) -> list[Path]:
    """Write one `<name>.yaml` per shape into `directory` (created); returns the paths."""
    directory = ensure_directory(directory, "--write")
    paths = []
    for shape in shapes:
        path = directory / f"{shape.model.name}.yaml"
        path.write_text(model_yaml(shape))
        paths.append(path)
    return paths


# ---------------------------------------------------------------------- counts and MFU per shape
def counting_system() -> System:
    """When no system is given, mappings are counted as in the paper's mappability study:
    two networks (an NVLink domain of 8 inside an InfiniBand fabric) and offload memory
    present. Counting reads nothing else of a system, so the rates here are placeholders."""
    curve = [[0, 1.0]]
    net = {"bandwidth_gbps": 1, "efficiency": 1, "latency_us": 0, "processor_usage": 0}
    return System.model_validate({
        "name": "2 networks + offload (counting only)",
        "compute": {"bfloat16": {"matrix_tflops": 1, "vector_tflops": 1, "matrix_efficiency": curve,
                                 "vector_efficiency": curve}},
        "hbm": {"capacity_gib": 80, "bandwidth_gbps": 1}, "offload": {"capacity_gib": 1024, "bandwidth_gbps": 1},
        "networks": [{"name": "nvlink", "size": 8, **net}, {"name": "infiniband", "size": 1 << 20, **net}]})


@dataclass(frozen=True)
class ShapeAssessment:
    """A candidate shape with its mapping count on N GPUs and, when solved, its best MFU."""

    shape: Shape
    gpus: int | None
    mappings: int | None
    solved: dict | None  # status, mfu, iteration_time_s, certified_optimal, gap, seconds, mapping

    def to_dict(self) -> dict:
        return {**self.shape.to_dict(), "gpus": self.gpus, "mappings": self.mappings, "solved": self.solved}


def assess_shapes(shapes: list[Shape], *, gpus: int | None, system: System | None, max_batch: int = 3072,
                  space: str = "calculon-2023", kernels: Kernels = Kernels(), datatype: str = "bfloat16",
                  time_limit_s: float = 60.0, solver_workers: int = 2) -> list[ShapeAssessment]:
    """Count each shape's mappings on `gpus` GPUs (closed form) and, with a system, solve it."""
    from costmodel.inputs.system import Datatype
    from solver.space.count import count_mappings
    from solver.space.declaration import get_space

    the_space = get_space(space)
    out = []
    for shape in shapes:
        mappings = solved = None
        if gpus is not None:
            mappings = count_mappings(shape.model, system or counting_system(), gpus, max_batch, the_space).mappings
        if gpus is not None and system is not None:
            from solver.search.solve import SolverConfig, solve

            result = solve(shape.model, system, gpus, max_batch=max_batch, datatype=Datatype(datatype), space=the_space,
                           kernels=kernels, config=SolverConfig(time_limit_s=time_limit_s, workers=solver_workers))
            best = result.best
            solved = {"status": result.status.value, "mfu": best.mfu if best else None,
                      "iteration_time_s": best.iteration_time_s if best else None,
                      "certified_optimal": result.certified_optimal, "gap": result.gap, "seconds": result.seconds,
                      "mapping": best.mapping.model_dump(mode="json") if best else None}
        out.append(ShapeAssessment(shape, gpus, mappings, solved))
    return out
