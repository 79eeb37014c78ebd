"""A launch file of any framework as a mapping, and a mapping as any framework's launch text.

`--mapping` takes this project's mapping files (Calculon's JSON) and, told apart by their
content, a Megatron-LM launch line or argument file, Megatron-Bridge overrides or a torchtitan
job TOML; `--emit` prints a mapping in one of the three.
"""

from __future__ import annotations

import re
from pathlib import Path

from costmodel.errors import InputError
from costmodel.frameworks.bridge import export_bridge, import_bridge, parse_overrides
from costmodel.frameworks.bridge_import import bridge_settings
from costmodel.frameworks.common import Exported
from costmodel.frameworks.megatron import export_megatron, import_megatron, megatron_run_fields
from costmodel.frameworks.torchtitan import export_torchtitan, import_torchtitan, torchtitan_run_fields
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System

__all__ = ["EMIT_CHOICES", "emit", "framework_of_text", "launch_settings", "load_launch_mapping"]

EMIT_CHOICES = ("megatron", "bridge", "torchtitan")


def emit(mapping: Mapping, model: Model, system: System, framework: str, lossy: bool) -> Exported:
    """`mapping` in `framework`'s words (megatron, bridge, torchtitan)."""
    if framework == "megatron":
        return export_megatron(mapping, model, lossy)
    if framework == "bridge":
        return export_bridge(mapping, model, system, lossy)
    if framework == "torchtitan":
        return export_torchtitan(mapping, model, lossy)
    raise InputError(f"--emit {framework!r}: not one of {', '.join(EMIT_CHOICES)}")


_BRIDGE_LINE = re.compile(r"^\s*(recipe\.)?[a-z_]+\.[a-z_0-9.]+\s*=")


def framework_of_text(text: str, path: str) -> str | None:
    """Which framework's launch file `text` is (None: this project's mapping file): a torchtitan
    TOML (a .toml file, or [section] headers), Megatron-Bridge overrides (section.field=value
    lines), Megatron-LM arguments (--flags)."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if path.endswith(".toml") or any(re.fullmatch(r"\[[a-z_.]+\]", line) for line in lines):
        return "torchtitan"
    if lines and all(_BRIDGE_LINE.match(line) for line in lines):
        return "bridge"
    if lines and not text.lstrip().startswith(("{", "[")) and re.search(r"(^|\s)--[a-z]", text):
        return "megatron"
    return None


def load_launch_mapping(path: str | Path, model: Model, system: System) -> Mapping | None:
    """The mapping a framework's launch file at `path` runs; None when the file is not one
    (a mapping file, read as before)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None                      # the mapping-file reader says why, as for any mapping file
    kind = framework_of_text(text, str(path))
    if kind == "torchtitan":
        return import_torchtitan(text, model, system, str(path))
    if kind == "bridge":
        return import_bridge(text, model, system, str(path))
    if kind == "megatron":
        return import_megatron(text, model, system, str(path))
    return None


def launch_settings(text: str, path: str, model: Model, where: str) -> dict:
    """A launch file's settings as a measured run's fields (costmodel.measured.runs.Run); what a
    run does not carry (the context-parallel exchange, offloads, a sharding sub-group) is left out."""
    kind = framework_of_text(text, path)
    if kind == "megatron":
        return megatron_run_fields(text, model, where)[0]
    if kind == "bridge":
        return bridge_settings(parse_overrides(text, where), model, None, where)[0]
    if kind == "torchtitan":
        return torchtitan_run_fields(text, model, where)[0]
    raise InputError(f"{where}: {path}: not Megatron-LM arguments, Megatron-Bridge overrides or a torchtitan TOML")
