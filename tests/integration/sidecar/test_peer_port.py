"""A live sidecar's peer port under hostile clients (issue #16): garbage before and after
the TLS handshake, a client without a certificate, a member's certificate with a garbage
hello, and a slowloris that opens the connection and says nothing. Each connection is
closed, refusals are counted in ``kdsync_peer_connections_rejected`` and by reason in
``kdsync_peer_connections_refused_total``, and the group's order is unaffected: traffic
written meanwhile arrives everywhere, once, in order."""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Callable

import pytest

from kdsync.local_group import LocalSidecarGroup
from kdsync.transport.framing import encode_frame
from kdsync.transport.tls import client_context
from tests.integration.sidecar.harness import (
    Traffic,
    http_get,
    member_tls_files,
    start_watched,
    verify_group,
)

pytestmark = pytest.mark.kafka

DEADLINE_S = 30.0  # the sidecar's handshake timeout is 10 s


def _closed_by_server(
    address: str, payload: bytes, context: ssl.SSLContext | None = None
) -> tuple[bytes, float]:
    """Connect (with TLS when ``context`` is given), send ``payload``, read until the
    server closes. Returns what it sent back and how long closing took."""
    host, port = address.rsplit(":", 1)
    started = time.monotonic()
    received = b""
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as raw:
        sock: socket.socket = raw
        try:
            if context is not None:
                sock = context.wrap_socket(raw, server_hostname=None)
            if payload:
                sock.sendall(payload)
            while chunk := sock.recv(65536):
                received += chunk
        except (ssl.SSLError, ConnectionError):
            pass  # refused during or after the TLS handshake: closed either way
    return received, time.monotonic() - started


def _rejected(group: LocalSidecarGroup, name: str) -> float:
    status, text = http_get(group.members[name].http, "/metrics")
    assert status == 200
    match = re.search(r"^kdsync_peer_connections_rejected (\S+)$", text, re.MULTILINE)
    assert match, "the metric is missing from /metrics"
    return float(match.group(1))


def _refused(group: LocalSidecarGroup, name: str) -> dict[str, float]:
    """``kdsync_peer_connections_refused_total`` by reason, from /metrics."""
    status, text = http_get(group.members[name].http, "/metrics")
    assert status == 200
    found = re.findall(
        r'^kdsync_peer_connections_refused_total\{reason="(\w+)"\} (\S+)$', text, re.MULTILINE
    )
    assert found, "the metric is missing from /metrics"
    return {reason: float(value) for reason, value in found}


def test_hostile_clients_are_closed_counted_and_change_nothing(
    sidecar_group: Callable[..., LocalSidecarGroup],
    bootstrap: dict[str, str],
    source_topic: str,
) -> None:
    group = sidecar_group("port", bootstrap, source_topic)
    global_topic, watch = start_watched(group, bootstrap, source_topic)
    target = group.members["m1"].peer
    before = _rejected(group, "m1")
    by_reason_before = _refused(group, "m1")
    traffic = Traffic(bootstrap, source_topic, rate_per_origin=20).start()
    member_tls = member_tls_files(group.members["m2"].config_path)
    with_member_cert = client_context(member_tls)
    with_member_cert.check_hostname = False
    without_cert = ssl.create_default_context(cafile=str(member_tls.ca_cert))
    without_cert.check_hostname = False
    try:
        # Plain garbage where a TLS ClientHello belongs.
        got, _ = _closed_by_server(target, b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
        assert b"welcome" not in got
        # TLS without a client certificate: the handshake fails, nothing is read.
        got, _ = _closed_by_server(target, encode_frame(b'{"kdsync":"hello"}'), without_cert)
        assert got == b""
        # A member's certificate, then garbage instead of a hello: refused and counted.
        got, _ = _closed_by_server(target, b"\x00\x00\x00\x05junk!", with_member_cert)
        assert b"welcome" not in got
        # A frame claiming to be 4 GiB: refused before anything is buffered.
        got, _ = _closed_by_server(target, b"\xff\xff\xff\xff" + b"x" * 1024, with_member_cert)
        assert b"welcome" not in got
        # Slowloris: a member's certificate and then silence; closed by the handshake timeout.
        got, took = _closed_by_server(target, b"", with_member_cert)
        assert got == b"" and took < DEADLINE_S
        deadline = time.monotonic() + DEADLINE_S
        while _rejected(group, "m1") < before + 3:
            assert time.monotonic() < deadline, f"rejections counted: {_rejected(group, 'm1')}"
            time.sleep(0.5)  # polling interval of a condition with a deadline
        by_reason = _refused(group, "m1")
        grew = {r for r, value in by_reason.items() if value > by_reason_before[r]}
        # Garbage and no certificate fail TLS; junk and a 4 GiB hello length are bad
        # hellos; the silent member times out.
        assert {"tls_handshake", "bad_hello", "handshake_timeout"} <= grew, by_reason
        assert all(group.members[m].running for m in group.members)
        produced = traffic.stop()
    finally:
        traffic.stop()
    verify_group(group, bootstrap, source_topic, global_topic, produced, watch=watch)
    watch.close()
