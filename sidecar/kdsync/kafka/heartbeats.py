"""Heartbeats through the group, like MirrorMaker 2's ``heartbeats`` topic.

Every data member's sidecar writes one small record a second (key: the member's name;
timestamp: now) into ``kdsync-<group>.heartbeats`` in its own cluster. It reads that
topic like a selected source topic, so each heartbeat is ordered and delivered by the
group, exactly once, into every member's ``kdsync-<group>.heartbeats-global``; the
delivering member measures its latency from the record's timestamp. So replication
latency per origin -> destination pair keeps updating with no user traffic, and a stalled
pair shows as a heartbeat latency that stops updating (``kdsync_heartbeats_received``).

Why a topic of its own rather than a marker inside ``T-global``: ``T-global`` then holds
only user events, so its ``kdsync.seq`` stays gapless over them, the checker, the audit
and consumers need no filter, and offset translation (``kdsync failover``) is untouched.
Both heartbeat topics keep one day.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, Producer

from kdsync.kafka.client_config import client_config
from kdsync.kafka.topics import GLOBAL_TOPIC_CONFIG, ClusterTopics

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 1.0
RETENTION_MS = 24 * 3600 * 1000
_RETENTION_MS = str(RETENTION_MS)
HEARTBEAT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": _RETENTION_MS}
HEARTBEAT_GLOBAL_CONFIG = {**GLOBAL_TOPIC_CONFIG, "retention.ms": _RETENTION_MS}


def ensure_heartbeat_topics(
    topics: ClusterTopics, topic: str, global_topic: str, global_partitions: int
) -> None:
    """Create both heartbeat topics with a day's retention (blocking; before reading)."""
    topics.ensure(topic, 1, HEARTBEAT_TOPIC_CONFIG)
    topics.ensure(global_topic, global_partitions, HEARTBEAT_GLOBAL_CONFIG)


class HeartbeatEmitter:
    """Produces this member's heartbeats; ``beat`` never blocks (call it on the loop)."""

    def __init__(self, properties: Mapping[str, str], topic: str, member: str) -> None:
        self._topic = topic
        self._member = member.encode("utf-8")
        self._producer = Producer(
            client_config(
                properties,
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 0,
                    "message.timeout.ms": 30_000,
                    "client.id": f"{topic}-{member}",
                },
            )
        )
        self.sent = 0
        self.failed = 0

    def _delivered(self, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self.sent += 1
        else:
            self.failed += 1
            log.warning("a heartbeat was not written: %s", error)

    def beat(self) -> None:
        try:
            self._producer.produce(
                self._topic,
                key=self._member,
                value=b"",
                partition=0,
                timestamp=int(time.time() * 1000),
                on_delivery=self._delivered,
            )
        except (BufferError, KafkaException) as exc:
            self.failed += 1
            log.warning("a heartbeat was not queued: %s", exc)
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(2.0)
