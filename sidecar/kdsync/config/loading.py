"""Reading a sidecar config: the YAML file, then validation, with every problem reported."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kdsync.config.group_rules import raw_group_problems
from kdsync.config.problems import ConfigError, ConfigProblem, Loc, format_path
from kdsync.config.pydantic_errors import problems_from_validation_error, yaml_kind
from kdsync.config.sidecar_config import SidecarConfig


def _non_string_keys(value: object, loc: Loc = ()) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                problems.extend(_non_string_keys(item, (*loc, key)))
            else:
                problems.append(
                    ConfigProblem(
                        format_path((*loc, str(key))),
                        f"the key {key!r} is not a string (YAML reads unquoted yes/no/on/off "
                        "as booleans and digits as numbers)",
                        "quote the key",
                    )
                )
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems.extend(_non_string_keys(item, (*loc, index)))
    return problems


def parse_config(
    data: object, source: str = "config", *, check_files: bool = True
) -> SidecarConfig:
    """Validate already-parsed YAML data; raise ``ConfigError`` listing every problem."""
    if data is None:
        raise ConfigError(
            [ConfigProblem("(top level)", "the config is empty", "write the sidecar's config")],
            source,
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigProblem(
                    "(top level)",
                    f"the top level must be a mapping (key: value lines), got {yaml_kind(data)}",
                    "start the file with `group: <name>` and the other keys at column 1",
                )
            ],
            source,
        )
    key_problems = _non_string_keys(data)
    if key_problems:
        raise ConfigError(key_problems, source)
    try:
        return SidecarConfig.model_validate(data, context={"check_files": check_files})
    except ValidationError as exc:
        problems = problems_from_validation_error(exc)
    # Field problems stop pydantic before the cross-field rules; run those on the raw
    # data too, so one run reports as much as possible.
    seen = {(p.path, p.problem) for p in problems}
    for loc, problem, fix in raw_group_problems(data):
        if (format_path(loc), problem) not in seen:
            problems.append(ConfigProblem(format_path(loc), problem, fix))
    raise ConfigError(problems, source)


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects a key repeated in one mapping (a typo PyYAML ignores)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            marker = (key_node.tag, key_node.value)
            if marker in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key_node.value!r}",
                    key_node.start_mark,
                )
            seen.add(marker)
        return super().construct_mapping(node, deep=deep)


def load_config(path: Path, *, check_files: bool = True) -> SidecarConfig:
    """Read and validate a sidecar config file; raise ``ConfigError`` on any problem."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"{source} does not exist",
                    "pass the path of the sidecar's YAML config: kdsync run --config FILE",
                )
            ],
            source,
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            [ConfigProblem("(file)", f"{source} is a directory", "pass the config file")],
            source,
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"not UTF-8 text (byte {exc.start})",
                    "save the config as UTF-8",
                )
            ],
            source,
        ) from None
    except OSError as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    "(file)",
                    f"cannot read {source}: {exc.strerror or exc}",
                    "check the path and its permissions",
                )
            ],
            source,
        ) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            [
                ConfigProblem(
                    where,
                    f"not valid YAML: {what}",
                    "check indentation, quoting and ':' near that line "
                    "(quote values that contain ': ' or start with special characters)",
                )
            ],
            source,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            [ConfigProblem("(file)", f"not valid YAML: {exc}", "fix the YAML syntax")], source
        ) from None
    return parse_config(data, source, check_files=check_files)
