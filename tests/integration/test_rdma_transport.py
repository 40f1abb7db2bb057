"""RdmaTransport: TLS links on 127.0.0.1 whose frames travel over queue pairs.

Every test runs twice: over ``loopback`` (an in-process verbs device that enforces a
queue pair's rules, ``tests/support/loopback_verbs.py``), and over ``rxe``, a real
verbs device through pyverbs. This machine has no RDMA device, so the ``rxe`` runs skip
here; ``hack/rdma-vm`` runs them in a VM on Soft-RoCE, and
``test_rdma_transport_on_soft_roce`` in ``test_rdma_vm.py`` does that in CI.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from kdsync.transport import MemberTlsFiles, TcpTransportConfig
from kdsync.transport.framing import encode_frame
from kdsync.transport.rdma import RdmaTransport, RdmaUnavailable
from kdsync.transport.rdma.links import open_pyverbs_device
from kdsync.transport.rdma.pyverbs_device import device_names
from kdsync.transport.rdma.verbs import VerbsDevice, VerbsLink
from kdsync.transport.rdma_config import RdmaSettings
from kdsync.transport.tcp import TcpTransport
from kdsync.transport.tls import client_context
from tests.integration.test_tcp_transport import (
    connected,
    fill_until_refused,
    group_configs,
    intrude,
    no_jitter,
    no_leaked_tasks_or_transports,  # noqa: F401 (the autouse fixture)
    pki,  # noqa: F401 (the fixture)
    receive_frames,
    run,
    wait_until,
)
from tests.support.loopback_verbs import Fabric

# Small buffers, so that ordinary frames span several messages and credits run out.
SETTINGS = RdmaSettings(buffer_bytes=4096, receive_buffers=4, send_buffers=2)


class CountingDevice:
    """A device wrapper that counts the queue pairs made (who got one)."""

    def __init__(self, device: VerbsDevice) -> None:
        self._device = device
        self.links_made = 0

    @property
    def description(self) -> str:
        return self._device.description

    def link(self, slots: int, buffer_bytes: int) -> VerbsLink:
        self.links_made += 1
        return self._device.link(slots, buffer_bytes)

    def close(self) -> None:
        self._device.close()


class Devices:
    """Opens one device per transport and remembers them."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fabric = Fabric()
        self.opened: list[CountingDevice] = []

    def open(self, settings: RdmaSettings) -> VerbsDevice:
        inner = self.fabric.device() if self.kind == "loopback" else open_pyverbs_device(settings)
        device = CountingDevice(inner)
        self.opened.append(device)
        return device

    @property
    def links_made(self) -> int:
        return sum(d.links_made for d in self.opened)


@pytest.fixture(params=["loopback", "rxe"])
def devices(request: pytest.FixtureRequest) -> Devices:
    if request.param == "rxe":
        if not device_names():
            pytest.skip(
                "needs an RDMA device (a NIC or Soft-RoCE); hack/rdma-vm runs these tests "
                "on Soft-RoCE in a VM (tests/integration/test_rdma_vm.py)"
            )
        try:
            import pyverbs  # noqa: F401, PLC0415
        except ImportError:
            pytest.skip("needs pyverbs (Debian: python3-pyverbs)")
    return Devices(request.param)


@contextlib.asynccontextmanager
async def running(
    devices: Devices, *configs: TcpTransportConfig, settings: RdmaSettings = SETTINGS
) -> AsyncIterator[list[RdmaTransport]]:
    transports = [
        RdmaTransport(config, settings, open_device=devices.open, jitter=no_jitter)
        for config in configs
    ]
    try:
        for transport in transports:
            await transport.start()
        yield transports
    finally:
        for transport in transports:
            await transport.close()


def over_rdma(transport: RdmaTransport, *peers: str) -> Callable[[], bool]:
    return lambda: all(p in transport.rdma_outbound and p in transport.rdma_inbound for p in peers)


def test_three_members_exchange_frames_over_queue_pairs(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki)

    async def main() -> None:
        async with running(devices, *configs.values()) as transports:
            for t in transports:
                await wait_until(over_rdma(t, *t.peers), f"{t.member}'s links use RDMA")
            for t in transports:
                for peer in t.peers:
                    for seq in range(50):
                        assert t.send(peer, f"{t.member}->{peer}#{seq}".encode() * seq)
            for t in transports:
                frames = await receive_frames(t, 100)
                for src in t.peers:
                    from_src = [f.payload for f in frames if f.peer == src]
                    assert from_src == [
                        f"{src}->{t.member}#{seq}".encode() * seq for seq in range(50)
                    ]
            for t in transports:
                states = t.peer_states()
                assert all(s.frames_sent == 50 and s.frames_received == 50 for s in states.values())
            # Three members, two directions per pair: one queue pair at each end of six links.
            assert devices.links_made == 12

    run(main)


def test_empty_one_byte_and_large_frames_arrive_intact(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki, ["a", "b"])
    large = os.urandom(3 * 1024 * 1024 + 7)  # 769 messages of 4 KiB, 4 credits at a time

    async def main() -> None:
        async with running(devices, *configs.values()) as (a, b):
            await wait_until(over_rdma(a, "b"), "a sends to b over RDMA")
            assert a.send("b", b"\x01")
            assert a.send("b", large)
            assert a.send("b", b"")
            assert a.send("b", b"after")
            frames = await receive_frames(b, 4)
            assert [f.payload for f in frames] == [b"\x01", large, b"", b"after"]
            if devices.kind == "loopback":
                assert devices.fabric.largest_message == SETTINGS.buffer_bytes

    run(main)


def test_a_receiver_that_does_not_read_stops_the_sender_at_its_credits(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    frame_size = 16 * 1024
    configs = group_configs(
        pki,
        ["a", "b"],
        max_frame_bytes=frame_size,
        max_queue_bytes=256 * 1024,
        max_inbound_bytes=64 * 1024,
    )

    async def main() -> None:
        async with running(devices, *configs.values()) as (a, b):
            await wait_until(over_rdma(a, "b"), "a sends to b over RDMA")
            attempts = a.peer_states()["b"].connect_attempts
            # b does not call receive(): its buffer fills, it stops granting credits, a's
            # link stops, and a's queue fills until send() drops. A send without a credit
            # would fail the queue pair (receiver not ready) and the test.
            accepted = await fill_until_refused(a, "b", frame_size)
            # b's buffer is full (the frame after the ones that fit waits to go in) and a
            # waits for credits. The link stops, it does not fail: no reconnect follows.
            full = 64 * 1024 // frame_size + 1
            await wait_until(
                lambda: b.peer_states()["a"].frames_received == full and a.credit_waits["b"] > 0,
                "b's buffer is full and a waits for credits",
            )
            assert a.peer_states()["b"].queued_bytes <= 256 * 1024
            frames = await receive_frames(b, accepted)
            assert [int.from_bytes(f.payload[:8], "big") for f in frames] == list(range(accepted))
            assert a.peer_states()["b"].frames_dropped == 1
            assert a.peer_states()["b"].connect_attempts == attempts
            assert "b" in a.rdma_outbound, "the link survived running out of credits"

    run(main)


def test_a_peer_killed_mid_frame_delivers_nothing_partial_and_reconnects(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki, ["a", "b"], max_inbound_bytes=64 * 1024)
    large = os.urandom(2 * 1024 * 1024)

    async def main() -> None:
        async with running(devices, configs["a"]) as (a,):
            async with running(devices, configs["b"]) as (b,):
                await wait_until(over_rdma(a, "b"), "a sends to b over RDMA")
                assert a.send("b", b"first")
                assert (await receive_frames(b, 1))[0].payload == b"first"
                # A frame of 512 messages; b reads none of it (its buffer holds one
                # frame), so b dies while the frame is half on its way.
                assert a.send("b", b"x" * 60_000)
                assert a.send("b", large)
                await wait_until(
                    lambda: b.peer_states()["a"].bytes_received >= 60_000, "b took a frame"
                )
            await wait_until(lambda: "b" not in a.rdma_outbound, "a notices b is gone")
            async with running(devices, configs["b"]) as (b,):
                await wait_until(over_rdma(a, "b"), "a reconnects to b over RDMA")
                assert a.send("b", b"after restart")
                frames = await receive_frames(b, 1)
                # What the dead b had begun is gone with it; nothing partial arrives.
                assert frames[-1].payload == b"after restart"
                assert all(f.payload in (large, b"after restart") for f in frames)
                assert a.peer_states()["b"].connect_attempts >= 2

    run(main)


def test_a_stranger_gets_no_queue_pair(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])
    offer = encode_frame(
        b'{"queuePair":{"qpn":7,"psn":1,"gid":"0000:0000:0000:0000:0000:ffff:7f00:0001","mtu":3}}'
    )

    async def main() -> None:
        async with running(devices, configs["a"]) as (a,):
            # mallory: a certificate from the group's CA, but not a member.
            for tls in (None, client_context(pki["mallory"])):
                hello = encode_frame(
                    b'{"kdsync":"hello","version":1,"group":"orders","member":"b","rdma":true}'
                )
                await intrude(port, tls, [hello, offer])
            await wait_until(lambda: a.rejected_connections == 2, "both strangers refused")
            assert devices.links_made == 0, "a stranger got a queue pair"

    run(main)


def test_a_member_without_rdma_talks_tcp_with_one_that_has_it(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki, ["a", "b"])

    async def main() -> None:
        async with (
            running(devices, configs["a"]) as (a,),
            TcpTransport(configs["b"], jitter=no_jitter) as b,
        ):
            await wait_until(connected(a, "b"), "a connected to b")
            await wait_until(connected(b, "a"), "b connected to a")
            assert a.send("b", b"to tcp")
            assert b.send("a", b"to rdma")
            assert (await receive_frames(b, 1))[0] == ("a", b"to tcp")
            assert (await receive_frames(a, 1))[0] == ("b", b"to rdma")
            assert not a.rdma_outbound and not a.rdma_inbound
            assert devices.links_made == 0

    run(main)


def test_no_device_fails_start_with_the_fix_or_falls_back_to_tcp_when_allowed(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
) -> None:
    configs = group_configs(pki, ["a", "b"])
    fabric = Fabric()

    def no_device(settings: RdmaSettings) -> VerbsDevice:
        return fabric.device(available=False)

    async def main() -> None:
        strict = RdmaTransport(configs["a"], SETTINGS, open_device=no_device)
        with pytest.raises(RdmaUnavailable, match="no RDMA device"):
            await strict.start()
        await strict.close()
        lenient = replace(SETTINGS, fallback_to_tcp=True)
        a = RdmaTransport(configs["a"], lenient, open_device=no_device, jitter=no_jitter)
        b = RdmaTransport(configs["b"], lenient, open_device=fabric.device, jitter=no_jitter)
        try:
            await a.start()
            await b.start()
            assert a.fallback_reason is not None and "no RDMA device" in a.fallback_reason
            assert b.fallback_reason is None
            assert a.send("b", b"over tcp")
            assert (await receive_frames(b, 1))[0] == ("a", b"over tcp")
            assert not b.rdma_inbound
        finally:
            await a.close()
            await b.close()

    run(main)


def test_a_malformed_setup_closes_the_link_and_frees_nothing_it_did_not_make(
    pki: dict[str, MemberTlsFiles],  # noqa: F811
    devices: Devices,
) -> None:
    configs = group_configs(pki, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(devices, configs["a"]) as (a,):
            hello = encode_frame(
                b'{"kdsync":"hello","version":1,"group":"orders","member":"b","rdma":true}'
            )
            bad = encode_frame(b'{"queuePair":{"qpn":0,"psn":1,"gid":"x","mtu":3}}')
            replies = await intrude(port, client_context(pki["b"]), [hello, bad])
            assert b'"welcome"' in replies and b'"rdma":true' in replies
            assert devices.links_made == 0
            assert not a.rdma_inbound

    run(main)
