"""Reading model, system and mapping files (YAML or JSON) with one-line errors.

Every failure becomes an InputError whose message names the file, the field and the value,
and suggests the closest field name when a key is unknown.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from costmodel.errors import InputError, shown
from costmodel.inputs.hf import config_schema, is_hf_config, model_fields_from_hf
from costmodel.inputs.mapping import Mapping
from costmodel.inputs.model import Model
from costmodel.inputs.system import System

T = TypeVar("T", bound=BaseModel)


MAX_DOCUMENT_VALUES = 100_000
"""A document, its aliases expanded, holds at most this many values: a batch file with inline
models and systems holds a few thousand; an alias bomb ("billion laughs") holds billions."""
MAX_NESTING = 64
"""Levels of nesting a document may have: real inputs use fewer than ten."""


class _DuplicateKey(ValueError):
    """A key given twice in one mapping: YAML and JSON readers would quietly keep the last."""


class _TooLarge(ValueError):
    """A document nested or expanding past MAX_NESTING / MAX_DOCUMENT_VALUES."""


def _expanded_size(root: yaml.Node) -> int:
    """How many values the document holds once every alias is expanded, computed on the
    composed node graph (each shared node once), refusing it past the limits."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    aliased = False                      # a node reached twice: an alias was followed

    def size(node: yaml.Node, depth: int) -> int:
        nonlocal aliased
        key = id(node)
        if key in sizes:
            aliased = True
            return sizes[key]
        if key in open_nodes:
            raise _TooLarge(f"an alias refers to a value that contains it (line {node.start_mark.line + 1})")
        if depth > MAX_NESTING:
            raise _TooLarge(f"nested more than {MAX_NESTING} levels deep (line {node.start_mark.line + 1})")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        open_nodes.discard(key)
        if total > MAX_DOCUMENT_VALUES and aliased:
            raise _TooLarge(f"expands to more than {MAX_DOCUMENT_VALUES:,} values once its aliases are "
                            f"followed (an alias bomb?)")
        if total > MAX_DOCUMENT_VALUES:
            raise _TooLarge(f"holds more than {MAX_DOCUMENT_VALUES:,} values (line {node.start_mark.line + 1}): "
                            f"input files hold a few thousand; split it into several files")
        sizes[key] = total
        return total

    return size(root, 0)


class _StrictYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping."""

    def compose_document(self):
        node = super().compose_document()
        _expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: let the base loader report it
                break
            if duplicate:
                raise _DuplicateKey(f"field {key!r} is given twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _json_object(pairs: list[tuple[str, Any]]) -> dict:
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise _DuplicateKey(f"field {key!r} is given twice")
    return dict(pairs)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (JSON is YAML, but JSON errors read better from json)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not a text file (byte {err.start} is not UTF-8)") from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror})") from None
    if not text.strip():
        raise InputError(f"{path}: is empty")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = yaml.load(text, Loader=_StrictYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except (_DuplicateKey, _TooLarge) as err:
        raise InputError(f"{path}: {err}") from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to read (real inputs nest fewer than ten levels)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InputError(f"{path}: not valid YAML{where}: {_one_line(problem)}") from None
    except ValueError as err:        # a value the reader cannot convert (a number of 5,000 digits)
        raise InputError(f"{path}: a value cannot be read ({_one_line(str(err).split(';')[0])})") from None
    if data is None:
        raise InputError(f"{path}: is empty (no fields, only comments or null)")
    return data


# ---------------------------------------------------------------- pydantic errors as one line


def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an annotation: X | None -> [X, None]; Annotated[X, ...] -> [X]."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in _unwrap(arg)]
    return [annotation]


def _descend(annotation: Any, part: Any) -> Any:
    """The annotation of the value at `part` inside a value of type `annotation`: a field of a
    model, an item of a list or tuple, a value of a dict (whatever the key)."""
    for alt in _unwrap(annotation):
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            field = alt.model_fields.get(part) if isinstance(part, str) else None
            if field is not None:
                return field.annotation
            continue
        origin, args = typing.get_origin(alt), typing.get_args(alt)
        if origin is dict and len(args) == 2:
            return args[1]
        if origin in (list, tuple, set, frozenset) and args:
            return args[0]
    return None


def _field_names(model_cls: type[BaseModel], loc: tuple) -> list[str]:
    """Known field names of the model holding the field at `loc` (for typo suggestions)."""
    annotation: Any = model_cls
    for part in loc[:-1]:
        annotation = _descend(annotation, part)
        if annotation is None:
            return []
    for alt in _unwrap(annotation):
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            return list(alt.model_fields)
    return []


def _first_problem(errors: list[dict]) -> dict:
    """The error to report: an unknown field first (a misspelt required field is also reported
    missing, and the typo is the cause), then a missing field, then the first other error."""
    for kind in ("extra_forbidden", "missing"):
        for error in errors:
            if error.get("type") == kind:
                return error
    return errors[0]


def describe_validation_error(err: ValidationError, model_cls: type[BaseModel], source: str) -> str:
    """One problem of a pydantic error as one line: `source: field 'x.y' 7: reason`."""
    errors = err.errors()
    first = _first_problem(errors)
    loc = tuple(first.get("loc", ()))
    where = ".".join(str(part) for part in loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        typo = str(loc[-1])
        # A missing field beside the unknown one is the likeliest meaning; then any known field.
        missing = [str(e["loc"][-1]) for e in errors
                   if e.get("type") == "missing" and tuple(e.get("loc", ()))[:-1] == loc[:-1]]
        close = (difflib.get_close_matches(typo, missing, n=1)
                 or difflib.get_close_matches(typo, _field_names(model_cls, loc), n=1))
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"{source}: unknown field '{where}'{hint}"
    if kind == "missing":
        return f"{source}: missing field '{where}'"
    message = _one_line(first.get("msg", "invalid").removeprefix("Value error, "))
    if not loc:
        return f"{source}: {message}"
    value = first.get("input")
    if loc[-1] == "[key]":  # a bad key of a dict, e.g. a datatype under compute
        where = ".".join(str(part) for part in loc[:-2])
        return f"{source}: field '{where}' key {shown(value)}: {message}"
    value_text = "" if isinstance(value, (dict, list)) else f" {shown(value)}"
    # a reason phrased as a predicate ("is not a list of layer indices") follows the value
    separator = " " if message.startswith("is ") else ": "
    return f"{source}: field '{where}'{value_text}{separator}{message}"


def parse(model_cls: type[T], data: Any, source: str) -> T:
    """Validate plain data into a typed input, or raise a one-line InputError."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of field names to values, got {type(data).__name__}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, model_cls, source)) from None


# Fields that only one kind of input file has: a file of another kind given in its place is
# named as what it looks like, not reported field by field.
_KIND_MARKS = {
    "model": ("hidden", "num_blocks", "attn_heads", "feedforward", "model_type", "num_hidden_layers"),
    "system": ("compute", "hbm", "networks"),
    "mapping": ("tensor_par", "pipeline_par", "data_par", "num_procs"),
}
_KIND_OPTION = {"model": "--model", "system": "--system", "mapping": "--mapping"}


def _check_kind(data: Any, expected: str, source: str) -> None:
    """An InputError when `data` has none of the expected kind's marks and some of another's."""
    if not isinstance(data, dict) or any(key in data for key in _KIND_MARKS[expected]):
        return
    for kind, marks in _KIND_MARKS.items():
        found = [key for key in marks if key in data]
        if kind != expected and found:
            raise InputError(f"{source}: this looks like a {kind} file (it has {', '.join(found)}), not a "
                             f"{expected} file: give it as {_KIND_OPTION[kind]}")


def load_model(path: str | Path, *, seq_size: int | None = None) -> Model:
    """A model file: this project's (Calculon's field names) or a Hugging Face config.json
    (costmodel.inputs.hf), named after its folder (`llama-3.1-70b/config.json`: llama-3.1-70b).
    `seq_size`, when given, is the training sequence length: it replaces a model file's and
    is required with a config.json, which does not state one."""
    path = Path(path)
    data = read_document(path)
    _check_kind(data, "model", str(path))
    if is_hf_config(data):
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
        config = parse(config_schema(data, str(path)), data, str(path))
        return parse(Model, model_fields_from_hf(config, str(path), seq_size=seq_size, name=name), str(path))
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    if isinstance(data, dict) and seq_size is not None:
        data = {**data, "seq_size": seq_size}
    return parse(Model, data, str(path))


def load_system(path: str | Path) -> System:
    data = read_document(path)
    _check_kind(data, "system", str(path))
    if isinstance(data, dict) and "name" not in data:
        data = {"name": Path(path).stem, **data}
    return parse(System, data, str(path))


def load_mapping(path: str | Path) -> Mapping:
    data = read_document(path)
    _check_kind(data, "mapping", str(path))
    return parse(Mapping, data, str(path))


def ensure_directory(path: str | Path, option: str) -> Path:
    """Create an output directory the user named with `option`, or a one-line InputError."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{option} {path}: cannot create the directory ({err.strerror})") from None
    return path


def ensure_parent(path: str | Path, option: str) -> Path:
    """An output file the user named with `option`: its missing parent directories are created
    (every command's output paths follow this rule), or a one-line InputError."""
    path = Path(path)
    ensure_directory(path.parent, option)
    return path


_OTHER_FILES = (
    (("model_type", "architectures"), "a Hugging Face model config", "give it as --model, or under a batch file's models"),
    (("tensor_par", "pipeline_par", "num_procs"), "a mapping file", "give it to `mapsat eval --mapping`"),
    (("compute", "hbm", "networks"), "a system file", "give it as --system, or under a batch file's systems"),
    (("hidden", "num_blocks", "attn_heads"), "a model file", "give it as --model, or under a batch file's models"),
)
"""Files given where a batch file was expected, each known by fields a batch file never has:
(fields, what the file is, where it goes)."""


def other_file_kind(data: Any) -> str | None:
    """What a document is, and where it goes, when it is one of the other inputs (a Hugging Face
    config, a mapping, a system or a model file) rather than a batch file; None otherwise."""
    if not isinstance(data, dict) or any(key in data for key in ("models", "systems", "grids")):
        return None
    for fields, kind, advice in _OTHER_FILES:
        found = [field for field in fields if field in data]
        if found:
            model_type = data.get("model_type")
            if found[0] == "model_type" and isinstance(model_type, str):
                kind += f" (model_type {model_type[:40]})"
            return f"{kind} (it has '{found[0]}'): {advice}"
    return None
