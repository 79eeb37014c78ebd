"""What the exporters and importers share.

Export: a mapping (and the model it maps, for the blocks per stage) becomes a framework's text.
A value the framework cannot express is a `Refusal` naming the dimension and its value; without
`lossy` the export fails on one line listing them, with it the text says on comment lines what
it left out.

Import: a framework's settings are read into the fields of a measured run
(costmodel.measured.runs.Run, the mapping in the frameworks' words) and mapped as every run is
(costmodel.measured.run_mapping.map_run), so a launch file, a published Megatron-Bridge row and a
training log become the same mapping; the few mapping fields a run does not carry (the
context-parallel exchange, offloads, the sharding sub-group, ...) are set on the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from costmodel.errors import InputError
from costmodel.inputs.load import describe_validation_error
from costmodel.inputs.mapping import Mapping
from costmodel.measured.run_mapping import map_run
from costmodel.measured.runs import Run
from costmodel.inputs.model import Model
from costmodel.ops import ScalarOps
from costmodel.inputs.precision import FORMATS, Precision
from costmodel.inputs.system import System
from costmodel.space.layout import end_chunk_blocks, layout_problem, stage_blocks
from costmodel.terms.pipeline_layout import layout_string

__all__ = ["Exported", "Layout", "Refusals", "check_layout", "cost_model_assumptions", "effective_param_gather",
           "mapping_from_run_fields", "megatron_redoes_gather", "moe_dispatcher_text", "recompute_of", "sharding_of",
           "short_chunk_layout", "stage_layout", "stated_stage_blocks"]


@dataclass
class Refusals:
    """The dimensions a framework cannot express, each as `field(value): why`."""

    framework: str
    items: list[str] = field(default_factory=list)

    def refuse(self, dimension: str, value: Any, reason: str) -> None:
        shown = getattr(value, "value", value)
        self.items.append(f"{dimension}({shown}): {reason}")

    def finish(self, lines: list[str], lossy: bool) -> "Exported":
        """The text, or an InputError naming every refused dimension (unless lossy)."""
        if self.items and not lossy:
            raise InputError(f"{self.framework} cannot express {'; '.join(self.items)} (--lossy exports the rest)")
        notes = [f"# not expressed (--lossy): {item}" for item in self.items]
        return Exported("\n".join([*notes, *lines]) + "\n", tuple(self.items))


@dataclass(frozen=True)
class Exported:
    """A framework's text for one mapping and what it left out (only with lossy)."""

    text: str
    left_out: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """Blocks per pipeline stage: the first, a middle and the last; `uneven` when they differ."""

    first: int
    middle: int
    last: int

    @property
    def uneven(self) -> bool:
        return not self.first == self.middle == self.last


def stage_layout(mapping: Mapping, model: Model) -> Layout:
    """The mapping's blocks per stage, stated or by the layout rule (costmodel.space.layout)."""
    first, middle, last = stage_blocks(ScalarOps, model.num_blocks, mapping.pipeline_par,
                                       mapping.pipeline_first_stage_blocks, mapping.pipeline_last_stage_blocks,
                                       mapping.pipeline_interleaving)
    return Layout(int(first), int(middle), int(last))


def short_chunk_layout(mapping: Mapping, model: Model) -> str | None:
    """Megatron-LM's layout string (costmodel.terms.pipeline_layout.layout_string) when a stage's
    chunks differ — a short first or last chunk with interleaving, which the first and last stage
    layer counts cannot say (Megatron-LM asks v to divide them) —, else None."""
    v, pp = mapping.pipeline_interleaving, mapping.pipeline_par
    layout = stage_layout(mapping, model)
    if v == 1 or not layout.uneven or (layout.first % v == 0 and layout.last % v == 0):
        return None
    stated = None
    if mapping.pipeline_first_stage_blocks is not None or mapping.pipeline_last_stage_blocks is not None:
        stated = (layout.first, layout.middle, layout.last)
    full_first, full_last = (int(c) for c in end_chunk_blocks(ScalarOps, model.num_blocks, pp, v, stated))
    chunks = [[layout.middle // v] * v for _ in range(pp)]
    chunks[0] = [layout.first - (v - 1) * full_first] + [full_first] * (v - 1)
    chunks[-1] = [full_last] * (v - 1) + [layout.last - (v - 1) * full_last]
    return layout_string(chunks, model.mtp_blocks)


def check_layout(mapping: Mapping, model: Model, refusals: Refusals) -> None:
    """A mapping whose blocks do not lay out on its stages in whole numbers has no launch file."""
    problem = layout_problem(model.num_blocks, mapping.pipeline_par, mapping.pipeline_interleaving,
                             mapping.pipeline_first_stage_blocks, mapping.pipeline_last_stage_blocks)
    if problem is not None:
        refusals.refuse("pipeline_par", mapping.pipeline_par, f"no whole layout: {problem}")


def stated_stage_blocks(first: int | None, last: int | None, model: Model, pp: int, interleaving: int = 1) -> dict:
    """The first and last stage blocks a file states, left out where they are the layout rule's
    for pp and the interleaving (the mapping then says the same as a file that states nothing)."""
    if first is None and last is None:
        return {}
    rule_first, _, rule_last = stage_blocks(ScalarOps, model.num_blocks, pp, interleaving=interleaving)
    if (first is None or first == rule_first) and (last is None or last == rule_last):
        return {}
    return {"pipeline_first_stage_blocks": first, "pipeline_last_stage_blocks": last}


def recompute_of(mapping: Mapping, model: Model) -> tuple[str, int | None, tuple[str, ...]]:
    """(granularity, blocks, modules): none; full with the blocks of each chunk recomputed (None:
    every block); selective with its modules (Megatron-LM's default core_attn alone)."""
    kind = mapping.activation_recompute.value
    if kind == "full":
        return "full", mapping.recompute_blocks, ()
    if kind == "attn_only":
        return "selective", None, tuple(mapping.recompute_modules or ("core_attn",))
    return "none", None, ()


def effective_param_gather(mapping: Mapping) -> bool:
    """Whether weights are all-gathered in the recipe's low-precision format (the recipe's
    Megatron-Bridge default where the mapping leaves it unstated)."""
    if mapping.precision is None or not FORMATS[mapping.precision].quantized:
        return False
    stated = mapping.low_precision_param_gather
    return FORMATS[mapping.precision].param_gather if stated is None else stated


def mapping_from_run_fields(fields: dict, extras: dict, model: Model, system: System, where: str) -> Mapping:
    """The mapping of a launch file read into a run's fields (mapped as every measured run is)
    and the mapping fields a run does not carry (`extras`); an InputError names the file."""
    if fields.get("seq_size", model.seq_size) != model.seq_size:
        raise InputError(f"{where}: sequence length {fields['seq_size']} differs from the model's seq_size "
                         f"{model.seq_size}: give --seq-size {fields['seq_size']}")
    data = {"name": where, "model": model, "system": system.name, "seq_size": model.seq_size, **fields}
    try:
        run = Run.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Run, where)) from None
    mapped = map_run(run, model, system).mapping
    try:
        return Mapping.model_validate({**mapped.model_dump(mode="json"), **extras})
    except ValidationError as err:
        raise InputError(describe_validation_error(err, Mapping, where)) from None


PRECISION_OF_RECIPE: dict[tuple[str | None, str | None], Precision] = {
    ("fp8", "delayed"): Precision.fp8_delayed, ("fp8", "tensorwise"): Precision.fp8_tensorwise,
    ("fp8", "blockwise"): Precision.fp8_blockwise, ("fp8", "mxfp8"): Precision.mxfp8, ("fp4", "nvfp4"): Precision.nvfp4}
"""Megatron-LM's (format family, recipe) → the precision recipe (costmodel.inputs.precision names them so)."""
RECIPE_OF_PRECISION = {precision: recipe for recipe, precision in PRECISION_OF_RECIPE.items()}
FP8_FORMAT = {Precision.mxfp8: "e4m3"}
"""--fp8-format by recipe: hybrid (E4M3 forward, E5M2 gradients) for the FP8 recipes as
Megatron-Bridge's bf16_with_fp8_* recipes set it, e4m3 for MXFP8 (bf16_with_mxfp8_mixed)."""


def sharding_of(mapping: Mapping) -> tuple[int, bool, int]:
    """(ZeRO stage, Megatron-FSDP, instances): the stage over the data-parallel group (0 where
    the group is one GPU), whether Megatron-FSDP runs it, and how many copies of the sharded
    state the group holds (dp·cp over the sharding sub-group; 1 without one)."""
    group = mapping.data_par * mapping.context_par
    stage = int(mapping.sharding_stage.value) if group > 1 else 0
    instances = group // mapping.sharding_group if mapping.sharding_group else 1
    return stage, mapping.megatron_fsdp, instances


def moe_dispatcher_text(mapping: Mapping) -> str:
    """Megatron-LM's moe_token_dispatcher_type for the mapping's dispatcher (alltoall, flex)."""
    return str(mapping.moe_dispatcher)


REDO_WORDS = ("Megatron-Core redoes the sequence-parallel all-gather in backward exactly when sequence "
              "parallelism runs without full recompute")


def megatron_redoes_gather(mapping: Mapping) -> bool:
    """Whether Megatron-Core redoes the sequence-parallel all-gather in backward: with sequence
    parallelism and no full recompute it keeps the sharded input (what run_mapping costs)."""
    return (mapping.tensor_par > 1 and mapping.tensor_par_comm_type.value == "rs_ag"
            and mapping.activation_recompute.value != "full")


def cost_model_assumptions(mapping: Mapping, refusals: Refusals, redo: bool, framework_words: str) -> None:
    """What no launch file states but a mapping may: a training run, and whether the
    sequence-parallel all-gather is redone in backward (`redo`, the framework's behaviour)."""
    if not mapping.training:
        refusals.refuse("training", False, "the frameworks' launch files start training runs")
    if mapping.seq_par_ag_redo != redo:
        refusals.refuse("seq_par_ag_redo", mapping.seq_par_ag_redo, framework_words)
