"""A problem's constants come in typed parts, one per input (costmodel/terms/context_parts.py):
each part is a frozen record, no field name is in two parts, and `bf16_blocks` changes the
compute and precision parts only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from costmodel.inputs.kernels import Kernels
from costmodel.inputs.load import load_model, load_system
from costmodel.inputs.precision import Precision
from costmodel.inputs.system import Datatype
from costmodel.terms.context import Context

ROOT = Path(__file__).resolve().parent.parent


def _context(precision=None) -> Context:
    return Context.of(load_model(ROOT / "problems/models/gpt3-13b.yaml"),
                      load_system(ROOT / "problems/systems/h100-80g-nvl8.yaml"), Datatype.bfloat16,
                      Kernels(precision=precision))


def test_every_part_is_a_frozen_record_and_no_name_is_in_two_parts():
    c = _context()
    seen: dict[str, str] = {}
    for part in dataclasses.fields(Context):
        value = getattr(c, part.name)
        assert dataclasses.is_dataclass(value) and type(value).__dataclass_params__.frozen, part.name
        assert type(value).__doc__, f"{part.name}: a part says which input it comes from"
        for field in dataclasses.fields(value):
            assert field.name not in seen, f"{field.name} in both {seen.get(field.name)} and {part.name}"
            seen[field.name] = part.name
    assert set(seen.values()) == {"model", "compute", "memory", "net", "precision", "step", "settings"}


def test_bf16_blocks_change_the_compute_and_precision_parts_only():
    c = _context(Precision.fp8_tensorwise)
    bf16 = c.bf16_blocks()
    for part in ("model", "memory", "net", "step", "settings"):
        assert getattr(bf16, part) is getattr(c, part)
    assert c.precision.quantized and not bf16.precision.quantized
    assert bf16.precision.elem_bytes == c.precision.elem_bytes
    assert bf16.compute.matrix_flops_per_s == c.compute.hp_matrix_flops_per_s < c.compute.matrix_flops_per_s
    assert bf16.compute.gemm is c.compute.hp_gemm and bf16.compute.attention is c.compute.attention
