"""The frameworks' own definitions of the settings this project writes and reads, at pinned commits.

Each table (costmodel/data/framework-*.yaml) copies, for one framework, the names and types of
the flags or fields a mapping uses and of those a launch file may carry beside them (`ignored`),
each with the file and line it was read from and the repository's commit; never the framework's
code. Everything the exporters print and the importers accept is checked against these tables:
Megatron-LM's arguments by an argparse parser built from its table, Megatron-Bridge's overrides
and torchtitan's TOML fields by name and declared type.
"""

from __future__ import annotations

import argparse
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from costmodel.errors import InputError

__all__ = ["Definitions", "MEGATRON", "BRIDGE", "TORCHTITAN", "check_field", "definitions", "megatron_parser"]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
MEGATRON, BRIDGE, TORCHTITAN = "megatron-lm", "megatron-bridge", "torchtitan"


@dataclass(frozen=True)
class Definitions:
    """One framework's table: what a mapping sets, what a launch file may carry beside it."""

    framework: str
    repository: str
    commit: str
    used: dict[str, dict]
    ignored: dict[str, dict]

    @property
    def citation(self) -> str:
        return f"{self.repository}@{self.commit[:12]}"

    def spec(self, name: str) -> dict | None:
        return self.used.get(name) or self.ignored.get(name)


@functools.cache
def definitions(framework: str) -> Definitions:
    """The cited table of `framework` (megatron-lm, megatron-bridge, torchtitan)."""
    data = yaml.safe_load((DATA_DIR / f"framework-{framework}.yaml").read_text())
    return Definitions(data["framework"], data["repository"], data["commit"],
                       data.get("flags") or data.get("fields"), data.get("ignored") or {})


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one-line InputErrors (not a usage message and exit 2)."""

    def error(self, message: str):
        raise InputError(f"Megatron-LM arguments: {message}")


_TYPES = {"int": int, "float": float, "str": str}


def megatron_parser() -> argparse.ArgumentParser:
    """An argparse parser with Megatron-LM's definitions of every flag in its table (its kind,
    choices and nargs), each flag's destination its name with '-' as '_' (a --no-* flag's
    without the `no_`, as Megatron-LM's own: --no-overlap-p2p-communication sets overlap_p2p_communication)."""
    table = definitions(MEGATRON)
    parser = _Parser(prog="Megatron-LM", add_help=False, allow_abbrev=False)
    for flag, spec in {**table.used, **table.ignored}.items():
        dest = spec.get("dest") or flag[2:].replace("-", "_")
        if spec["kind"] == "store_false":
            dest = dest.removeprefix("no_")
        if spec["kind"] in ("store_true", "store_false"):
            parser.add_argument(flag, dest=dest, action=spec["kind"])
        else:
            parser.add_argument(flag, dest=dest, type=_TYPES[spec["kind"]], choices=spec.get("choices"),
                                nargs=spec.get("nargs"))
    return parser


_ENUMS = {"AttnBackend": ("flash", "fused", "unfused", "local", "auto")}


def _alternatives(annotation: str) -> list[str]:
    """The members of a declared type: `Optional[X]`, `X | None` and `Union[A, B]` split."""
    text = annotation.strip()
    match = re.fullmatch(r"(Optional|Union)\[(.*)\]", text)
    if match:
        inner = _split_top(match.group(2))
        optional = ["None"] if match.group(1) == "Optional" else []
        return [*(alt for part in inner for alt in _alternatives(part)), *optional]
    parts = _split_top(text, "|")
    return [part.strip() for part in parts] if len(parts) > 1 else [text]


def _split_top(text: str, sep: str = ",") -> list[str]:
    """`text` split at `sep` outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == sep and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    return [*parts, text[start:].strip()]


def _fits(kind: str, value: Any) -> bool:
    """Whether `value` (as YAML or TOML reads it) is of the declared type `kind`."""
    literal = re.fullmatch(r"Literal\[(.*)\]", kind)
    if literal:
        return value in yaml.safe_load("[" + literal.group(1).replace("'", '"') + "]")
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in _ENUMS:
        return value in _ENUMS[kind]
    if kind == "torch.dtype":
        return isinstance(value, str) and value.startswith("torch.")
    listed = re.fullmatch(r"(?:list|List)\[(.*)\]", kind)
    if listed:
        return isinstance(value, list) and all(_fits_any(listed.group(1), item) for item in value)
    if kind == "list":
        return isinstance(value, list)
    if kind == "str":
        return isinstance(value, str)
    # a class or enum that a string names (CudaGraphModule, PipelineParallelLayerLayout)
    return kind[:1].isupper() and isinstance(value, str)


def _fits_any(annotation: str, value: Any) -> bool:
    return any(_fits(kind, value) for kind in _alternatives(annotation))


def check_field(framework: str, name: str, value: Any, where: str) -> bool:
    """True when `name` is a field the mapping uses, False when the table lists it as ignored;
    an InputError naming it when the framework has no such field or the value is not of its
    declared type."""
    table = definitions(framework)
    spec = table.spec(name)
    if spec is None:
        raise InputError(f"{where}: unknown {table.framework} field {name!r} (not in {table.citation}'s "
                         f"definitions this project reads)")
    if not _fits_any(spec["type"], value):
        raise InputError(f"{where}: {name} = {value!r} is not a {spec['type']} ({table.framework} "
                         f"{spec['source']})")
    return name in table.used
