"""Names kdsync derives from its configuration."""

from __future__ import annotations

import pytest

from kdsync import naming


def test_derived_names() -> None:
    assert naming.global_topic("orders") == "orders-global"
    assert naming.global_topic("orders", ".g") == "orders.g"
    assert naming.log_topic("orders") == "kdsync-orders.log.internal"
    assert naming.ledger_topic("orders") == "kdsync-orders.ledger.internal"
    assert naming.consumer_group("orders") == "kdsync-orders"
    assert naming.transactional_id("orders", "us-east") == "kdsync-orders.us-east"


def test_internal_topics_are_recognised() -> None:
    assert naming.is_internal_topic(naming.log_topic("g"))
    assert naming.is_internal_topic(naming.ledger_topic("g"))
    assert not naming.is_internal_topic("orders")
    assert not naming.is_internal_topic("kdsync-orders")


def test_heartbeat_topics_are_recognised_for_every_group() -> None:
    assert naming.heartbeat_topic("orders") == "kdsync-orders.heartbeats"
    assert naming.is_heartbeat_topic(naming.heartbeat_topic("orders"))
    assert naming.is_heartbeat_topic(naming.heartbeat_topic("another-group"))
    assert not naming.is_heartbeat_topic("heartbeats")  # MirrorMaker 2's, not ours
    assert not naming.is_heartbeat_topic("kdsync-orders.heartbeats-global")


def test_global_topic_rejects_loops_and_illegal_names() -> None:
    with pytest.raises(ValueError, match="already ends with"):
        naming.global_topic("orders-global")
    with pytest.raises(ValueError, match="at most 249"):
        naming.global_topic("t" * 243)
    assert len(naming.global_topic("t" * 242)) == 249
    with pytest.raises(ValueError, match="only"):
        naming.global_topic("bad topic")
    with pytest.raises(ValueError, match="only"):
        naming.global_topic("orders", "/x")
    with pytest.raises(ValueError, match="empty"):
        naming.global_topic("orders", "")


@pytest.mark.parametrize("name", ["Orders", "-a", "a-", "a_b", "a.b", "", "x" * 41])
def test_group_names_are_dns_label_like(name: str) -> None:
    with pytest.raises(ValueError):
        naming.consumer_group(name)
    with pytest.raises(ValueError):
        naming.transactional_id("g", name)


@pytest.mark.parametrize("name", ["a", "orders", "us-east-1", "x" * 40])
def test_good_names(name: str) -> None:
    assert naming.name_problem(name, "group", naming.MAX_GROUP_NAME_LENGTH) is None


@pytest.mark.parametrize(
    ("topic", "ok"),
    [("a", True), ("A.b_c-9", True), (".", False), ("..", False), ("a b", False), ("", False)],
)
def test_topic_names(topic: str, ok: bool) -> None:
    assert (naming.topic_name_problem(topic) is None) is ok
