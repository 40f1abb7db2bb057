"""The incremental audit state: round trip, and clear errors for unusable state."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdsync.audit.state import (
    AuditState,
    StateError,
    TopicState,
    load_state_file,
    parse_state,
    write_text_atomically,
)


def sample() -> AuditState:
    topic = TopicState.model_validate(
        {"nextSeq": 12, "global": {"m1": {"0": 13}}, "origin": {"m2": {"0": 5, "1": 7}}}
    )
    return AuditState(group="orders", topics={"orders": topic})


def test_state_round_trips_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    write_text_atomically(path, sample().to_json())
    loaded = load_state_file(path, "orders")
    assert loaded == sample()
    assert loaded is not None
    topic = loaded.topics["orders"]
    assert topic.global_offset("m1", 0) == 13
    assert topic.origin_offset("m2", 1) == 7
    assert topic.global_offset("m9", 0) is None
    assert '"nextSeq": 12' in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["state.json"]  # no temp files left


def test_no_state_file_means_a_first_run(tmp_path: Path) -> None:
    assert load_state_file(tmp_path / "absent.json", "orders") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "is not an audit state"),
        ('{"group": "orders", "topics": {"t": {"nextSeq": -1}}}', "is not an audit state"),
        ('{"version": 9, "group": "orders"}', "state version 9"),
        ('{"group": "payments"}', "belongs to group 'payments'"),
    ],
)
def test_unusable_state_is_named_with_a_fix(text: str, expected: str) -> None:
    with pytest.raises(StateError) as caught:
        parse_state(text, "state file s.json", "orders")
    assert expected in str(caught.value)
    assert "state file s.json" in str(caught.value)
