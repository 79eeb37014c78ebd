"""Reading model, system and mapping files (YAML or JSON) with one-line errors.

Every failure becomes an InputError whose message names the file, the field and the value,
and suggests the closest field name when a key is unknown.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from costmodel.errors import InputError
from costmodel.mapping import Mapping
from costmodel.model import Model
from costmodel.system import System

T = TypeVar("T", bound=BaseModel)


def read_document(path: str | Path) -> Any:
    """Parse a YAML or JSON file (JSON is YAML, but JSON errors read better from json)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{path}: not valid YAML{where}: {problem}") from None


def _field_names(model_cls: type[BaseModel], loc: tuple) -> list[str]:
    """Known field names at the location of an error, for typo suggestions."""
    cls: Any = model_cls
    for part in loc[:-1]:
        if isinstance(part, int) or cls is None:
            continue
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        cls = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(getattr(cls, "model_fields", {}).keys()) if cls else []


def describe_validation_error(err: ValidationError, model_cls: type[BaseModel], source: str) -> str:
    """The first problem of a pydantic error as one line: `source: field 'x.y': value 7: reason`."""
    first = err.errors()[0]
    loc = tuple(first.get("loc", ()))
    where = ".".join(str(part) for part in loc)
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        known = _field_names(model_cls, loc)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"{source}: unknown field '{where}'{hint}"
    if kind == "missing":
        return f"{source}: missing field '{where}'"
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    if not loc:
        return f"{source}: {message}"
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" {value!r}"
    return f"{source}: field '{where}'{shown}: {message}"


def parse(model_cls: type[T], data: Any, source: str) -> T:
    """Validate plain data into a typed input, or raise a one-line InputError."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of field names to values, got {type(data).__name__}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise InputError(describe_validation_error(err, model_cls, source)) from None


def load_model(path: str | Path) -> Model:
    data = read_document(path)
    if isinstance(data, dict) and "name" not in data:
        data = {"name": Path(path).stem, **data}
    return parse(Model, data, str(path))


def load_system(path: str | Path) -> System:
    data = read_document(path)
    if isinstance(data, dict) and "name" not in data:
        data = {"name": Path(path).stem, **data}
    return parse(System, data, str(path))


def load_mapping(path: str | Path) -> Mapping:
    return parse(Mapping, read_document(path), str(path))
