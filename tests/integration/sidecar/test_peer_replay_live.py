"""A valid member replaying old messages at a live sidecar's peer port (#16).

A client holding a follower's certificate completes the handshake with the leader as that
member, then sends, several times over, what it sent earlier: a Forward of its first events
(already ordered and delivered), in the current term and in an older one. The leader
keeps the order: every event stays in every T-global exactly once, and traffic written
afterwards still arrives. The ordering core's side of this (every message type, reordered)
is tests/unit/test_peer_replay.py; this is the same through TLS, the handshake and a
running sidecar."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from kdsync.local_group import LocalSidecarGroup
from kdsync.ordering import OriginBatch, SourceEvent
from kdsync.ordering.messages import Forward
from kdsync.transport.framing import HEADER_BYTES, encode_frame, frame_size
from kdsync.transport.identity import MemberTlsFiles
from kdsync.transport.tls import client_context
from kdsync.wire_format.messages import encode_message
from tests.integration.sidecar.harness import (
    Traffic,
    brief_status,
    member_tls_files,
    start_watched,
    verify_group,
    wait_for,
)

pytestmark = pytest.mark.kafka

REPLAYED_EVENTS = 20
REPLAYS = 5


def _first_events(servers: str, topic: str, count: int) -> tuple[SourceEvent, ...]:
    """An origin's first events of partition 0, as its source reader read them."""
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "replay-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    events: list[SourceEvent] = []
    try:
        while len(events) < count:
            message = consumer.poll(10)
            assert message is not None, f"only {len(events)} events in {topic}[0]"
            assert message.error() is None, message.error()
            headers = message.headers()
            events.append(
                SourceEvent(
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple(headers) if headers else (),
                    max(message.timestamp()[1], 0),
                )
            )
    finally:
        consumer.close()
    return tuple(events)


def _read_exactly(sock: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the connection closed during the handshake"
        data += chunk
    return data


def _read_frame(sock: ssl.SSLSocket) -> bytes:
    return _read_exactly(sock, frame_size(_read_exactly(sock, HEADER_BYTES), 4096))


def _replay_as(
    member: str, member_tls: MemberTlsFiles, group: str, address: str, frames: list[bytes]
) -> None:
    """Connects as ``member`` (its certificate), says hello, sends ``frames``."""
    context = client_context(member_tls)
    context.check_hostname = False
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=30)
    with context.wrap_socket(raw, server_hostname=None) as sock:
        hello = {"kdsync": "hello", "version": 1, "group": group, "member": member}
        sock.sendall(encode_frame(json.dumps(hello).encode()))
        welcome = json.loads(_read_frame(sock))
        assert welcome.get("kdsync") == "welcome", welcome
        for frame in frames:
            sock.sendall(encode_frame(frame))


def test_a_member_replaying_its_old_forwards_changes_nothing(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("replay", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    first = Traffic(bootstrap, source_topic, count_per_origin=200).start().join()
    verify_group(group, bootstrap, source_topic, global_topic, first, watch=watch)

    statuses = {m: group.status(m) or {} for m in group.members}
    leader = next(m for m, s in statuses.items() if s.get("role") == "leader")
    origin = next(m for m in bootstrap if m != leader)  # a leader takes no Forward
    term = int(statuses[leader]["term"])
    events = _first_events(bootstrap[origin], source_topic, REPLAYED_EVENTS)
    batch = OriginBatch(origin, source_topic, 0, 0, events[-1].offset + 1, True, events)
    frames = [encode_message(Forward(t, (batch,))) for t in (term, max(term - 1, 0))]
    _replay_as(
        origin,
        member_tls_files(group.members[origin].config_path),
        group.group,
        group.members[leader].peer,
        frames * REPLAYS,
    )
    wait_for(
        "the group ready again after the replay",
        lambda: all((group.status(m) or {}).get("ready") for m in group.members),
        timeout=90,
        describe=lambda: brief_status(group),
    )
    later = Traffic(bootstrap, source_topic, count_per_origin=100).start().join()
    produced = {m: first[m] + later[m] for m in bootstrap}
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()
    assert all(group.members[m].running for m in group.members), brief_status(group)
