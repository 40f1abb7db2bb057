"""Where the last clean audit ended, so the next run reads only what is new.

Per source topic ``T``:

- ``nextSeq``: the first global sequence number the next run checks;
- ``global``: per member and ``T-global`` partition, the offset to start reading from
  (just after the last record at or below ``nextSeq - 1``);
- ``origin``: per origin member and ``T`` partition, the first origin offset not yet seen
  replicated at or below ``nextSeq - 1`` (completeness resumes from there).

Only a run that passed writes a new state, so a violation is reported again by every
later run until it is resolved or the state is reset.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

STATE_VERSION = 1

# member -> partition (as a decimal string, JSON keys are strings) -> offset
Offsets = dict[str, dict[str, int]]


class StateError(ValueError):
    """A state file or ConfigMap entry that cannot be used."""


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class TopicState(_Model):
    next_seq: int = Field(ge=0)
    global_offsets: Offsets = Field(default_factory=dict, alias="global")
    origin_offsets: Offsets = Field(default_factory=dict, alias="origin")

    def global_offset(self, member: str, partition: int) -> int | None:
        return self.global_offsets.get(member, {}).get(str(partition))

    def origin_offset(self, member: str, partition: int) -> int | None:
        return self.origin_offsets.get(member, {}).get(str(partition))


class AuditState(_Model):
    version: int = STATE_VERSION
    group: str
    topics: dict[str, TopicState] = Field(default_factory=dict)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2) + "\n"


def parse_state(text: str, source: str, group: str) -> AuditState:
    """Parse and check a saved state; ``StateError`` names the source and the problem."""
    try:
        state = AuditState.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise StateError(
            f"{source} is not an audit state ({first}); delete it to start over"
        ) from None
    if state.version != STATE_VERSION:
        raise StateError(
            f"{source} has state version {state.version}, this audit writes {STATE_VERSION}; "
            "delete it to start over"
        )
    if state.group != group:
        raise StateError(
            f"{source} belongs to group {state.group!r}, not {group!r}; use one state per group"
        )
    return state


def load_state_file(path: Path, group: str) -> AuditState | None:
    """The state saved in ``path``, or None if there is no such file yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read state file {path}: {exc.strerror or exc}") from None
    return parse_state(text, f"state file {path}", group)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a crash leaves either the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
