"""Pydantic's validation errors as ``ConfigProblem``: YAML path, plain words, a fix.

A validator's own ``Invalid`` keeps its words; pydantic's generic errors (missing,
unknown key, wrong type, out of range) are reworded for someone editing YAML, with the
field's description as the hint and the closest valid key for a typo.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kdsync.config.problems import ConfigProblem, Invalid, Loc, format_path
from kdsync.config.sidecar_config import SidecarConfig


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class whose keys live at ``loc`` (walking fields by YAML key), if any."""
    current: Any = SidecarConfig
    for part in loc:
        if isinstance(part, int):
            args = typing.get_args(current)
            if typing.get_origin(current) is not tuple or not args:
                return None
            current = _unwrap_optional(args[0])
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = _field_by_key(current, part)
        if info is None:
            return None
        current = _unwrap_optional(info[1].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return current
    return None


def _field_by_key(model: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return name, info
    return None


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _description(loc: Loc) -> str | None:
    if not loc or not isinstance(loc[-1], str):
        return None
    parent = _model_at(loc[:-1])
    if parent is None:
        return None
    info = _field_by_key(parent, loc[-1])
    return None if info is None else info[1].description


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "dict_type": "a mapping (key: value lines)",
    "path_type": "a file path",
}


def yaml_kind(value: object) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _problems_from_error(error: Mapping[str, Any]) -> list[ConfigProblem]:
    loc: Loc = tuple(error["loc"])
    kind: str = error["type"]
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, Invalid):
        return [
            ConfigProblem(format_path(loc + suffix), problem, fix)
            for suffix, problem, fix in cause.items
        ]
    key = loc[-1] if loc else ""
    description = _description(loc)
    about = f" ({description})" if description else ""
    if kind == "missing":
        return [
            ConfigProblem(format_path(loc), "required but missing", f"add `{key}:`{about}".rstrip())
        ]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = _keys_of(parent) if parent is not None else []
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`? " if close else ""
        valid = f"valid keys here: {', '.join(allowed)}" if allowed else "remove it"
        return [ConfigProblem(format_path(loc), f"unknown key {key!r}", f"{hint}{valid}")]
    if kind in _TYPE_WORDS:
        expected = _TYPE_WORDS[kind]
        fix = f"write {expected}{about}"
        if kind == "string_type" and error.get("input") is not None:
            fix = 'quote the value so YAML reads it as a string, e.g. key: "value"'
        return [
            ConfigProblem(
                format_path(loc),
                f"expected {expected}, got {yaml_kind(error.get('input'))}",
                fix,
            )
        ]
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        ctx = error.get("ctx", {})
        bound = next(iter(ctx.values()), "?")
        symbol = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        return [
            ConfigProblem(
                format_path(loc),
                f"{_shown(error.get('input'))} is out of range",
                f"use a value {symbol} {bound}{about}",
            )
        ]
    message = str(error.get("msg", "invalid value"))
    return [ConfigProblem(format_path(loc), message, f"check the value{about}".rstrip())]


def problems_from_validation_error(exc: ValidationError) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for error in exc.errors():
        problems.extend(_problems_from_error(error))
    return problems
