"""TcpTransport over real sockets on 127.0.0.1 with real mutual TLS.

Every test runs its own event loop with ``asyncio.run`` and waits on conditions with
deadlines (polling the transports' observable state), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kdsync.driver.peer_links import PeerLinks
from kdsync.ordering import Configuration
from kdsync.pki import make_group_pki
from kdsync.transport import (
    LinkStatus,
    MemberTlsFiles,
    ReceivedFrame,
    TcpTransportConfig,
    TransportClosed,
)
from kdsync.transport.framing import LENGTH_PREFIX, encode_frame
from kdsync.transport.tcp import TcpTransport
from kdsync.transport.tcp.connect_phase import AddressInfo
from kdsync.transport.tls import client_context
from tests.support.leak_checks import no_resource_warnings
from tests.support.slow_link import slow_link

GROUP = "orders"
MEMBERS = ["a", "b", "c"]
DEADLINE_S = 15.0


# -- fixtures and helpers -----------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MemberTlsFiles]:
    """The group's PKI, plus 'mallory': signed by the same CA but not in the group."""
    return make_group_pki(GROUP, [*MEMBERS, "mallory"], tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def foreign_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MemberTlsFiles]:
    """Certificates for the *same* group and member names from a different CA."""
    return make_group_pki(GROUP, MEMBERS, tmp_path_factory.mktemp("foreign-pki"))


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def group_configs(
    pki: dict[str, MemberTlsFiles] | None,
    members: list[str] = MEMBERS,
    **overrides: Any,
) -> dict[str, TcpTransportConfig]:
    """One config per member on fresh loopback ports; ``pki=None`` means insecure."""
    ports = dict(zip(members, free_ports(len(members)), strict=True))
    peers = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    settings: dict[str, Any] = {"backoff_initial_s": 0.02, "backoff_max_s": 0.2}
    settings.update(overrides)
    return {
        name: TcpTransportConfig(
            group=GROUP,
            member=name,
            listen=peers[name],
            peers=peers,
            tls=None if pki is None else pki[name],
            insecure=pki is None,
            **settings,
        )
        for name in members
    }


def no_jitter() -> float:
    return 0.0


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {what}")
        await asyncio.sleep(0.01)


async def receive_frames(
    transport: TcpTransport, count: int, timeout: float = DEADLINE_S
) -> list[ReceivedFrame]:
    async def collect() -> list[ReceivedFrame]:
        return [await transport.receive() for _ in range(count)]

    async with asyncio.timeout(timeout):
        return await collect()


def connected(transport: TcpTransport, *peers: str) -> Callable[[], bool]:
    def check() -> bool:
        states = transport.peer_states()
        return all(states[peer].outbound is LinkStatus.CONNECTED for peer in peers)

    return check


@contextlib.asynccontextmanager
async def running(
    *configs: TcpTransportConfig, changed: Collection[str] = ()
) -> AsyncIterator[list[TcpTransport]]:
    """The transports started; those of the members ``changed`` know their membership
    changed at runtime (``membership_changed``) from the start."""
    transports = [TcpTransport(config, jitter=no_jitter) for config in configs]
    for transport in transports:
        transport.membership_changed = transport.member in changed
    try:
        for transport in transports:
            await transport.start()
        yield transports
    finally:
        for transport in transports:
            await transport.close()


async def intrude(port: int, tls: ssl.SSLContext | None, payloads: list[bytes]) -> bytes:
    """Connect as an untrusted client, write ``payloads``, and wait for the server to
    close the connection. Returns whatever the server sent before closing."""
    received = b""
    try:
        async with asyncio.timeout(DEADLINE_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    except (OSError, ssl.SSLError):
        return received  # rejected during the handshake: the best outcome
    try:
        with contextlib.suppress(OSError):
            for payload in payloads:
                writer.write(payload)
            await writer.drain()
        with contextlib.suppress(OSError, ssl.SSLError):
            async with asyncio.timeout(DEADLINE_S):
                while chunk := await reader.read(65536):
                    received += chunk
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return received


def hello(member: str, group: str = GROUP) -> bytes:
    return encode_frame(
        f'{{"kdsync":"hello","version":1,"group":"{group}","member":"{member}"}}'.encode()
    )


def run(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a test body on a fresh loop and require that it leaves no task behind."""

    async def body_then_check() -> None:
        await coro_fn()
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        assert not pending, f"tasks left running: {pending}"

    asyncio.run(body_then_check())


@pytest.fixture(autouse=True)
def no_leaked_tasks_or_transports(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No test may leave an unclosed socket or log an error (asyncio reports destroyed
    pending tasks and unretrieved task exceptions as errors; the transport logs its
    own unexpected failures as errors)."""
    caplog.set_level(logging.INFO)
    with no_resource_warnings():
        yield
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


async def fill_until_refused(sender: TcpTransport, peer: str, frame_size: int) -> int:
    """Send numbered frames to ``peer`` until ``send`` refuses one (the queue is full);
    returns how many were accepted. Fails if it never pushes back."""
    accepted = 0
    deadline = time.monotonic() + DEADLINE_S
    while sender.send(peer, accepted.to_bytes(8, "big") + bytes(frame_size - 8)):
        accepted += 1
        assert time.monotonic() < deadline, "send never pushed back"
        await asyncio.sleep(0)
    return accepted


async def assert_delivers(sender: TcpTransport, receiver: TcpTransport, payload: bytes) -> None:
    assert sender.send(receiver.member, payload)
    (frame,) = await receive_frames(receiver, 1)
    assert frame == (sender.member, payload)


# -- tests --------------------------------------------------------------------------


def test_three_members_exchange_frames_both_ways(pki: dict[str, MemberTlsFiles]) -> None:
    configs = group_configs(pki)

    async def main() -> None:
        async with running(*configs.values()) as transports:
            by_name = {t.member: t for t in transports}
            for t in transports:
                for peer in t.peers:
                    for seq in range(3):
                        assert t.send(peer, f"{t.member}->{peer}#{seq}".encode())
            for t in transports:
                frames = await receive_frames(t, 6)
                expected = {
                    (src, f"{src}->{t.member}#{seq}".encode())
                    for src in MEMBERS
                    if src != t.member
                    for seq in range(3)
                }
                assert set(frames) == expected
                # One connection per direction keeps each sender's frames in order.
                for src in t.peers:
                    from_src = [f.payload for f in frames if f.peer == src]
                    assert from_src == [f"{src}->{t.member}#{seq}".encode() for seq in range(3)]
            for t in transports:
                await wait_until(connected(t, *t.peers), f"{t.member} reports all connected")
                states = t.peer_states()
                assert all(s.inbound_connected for s in states.values())
                assert all(s.frames_sent == 3 and s.frames_received == 3 for s in states.values())
            assert by_name["a"].rejected_connections == 0

    run(main)


def test_one_byte_and_eight_mib_frames_arrive_intact(pki: dict[str, MemberTlsFiles]) -> None:
    configs = group_configs(pki, ["a", "b"])
    large = os.urandom(8 * 1024 * 1024 + 3)

    async def main() -> None:
        async with running(*configs.values()) as (a, b):
            assert a.send("b", b"\x01")
            assert a.send("b", large)
            assert a.send("b", b"")
            assert b.send("a", large)
            frames = await receive_frames(b, 3)
            assert [f.payload for f in frames] == [b"\x01", large, b""]
            (back,) = await receive_frames(a, 1)
            assert back.payload == large

    run(main)


def test_stranger_without_client_certificate_gets_nothing(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(*configs.values()) as (a, b):
            # Trusts the group CA (so it would talk to a) but has no certificate.
            stranger = ssl.create_default_context(cafile=str(pki["a"].ca_cert))
            stranger.check_hostname = False
            got = await intrude(port, stranger, [hello("b"), encode_frame(b"injected")])
            assert got == b""
            # A real member certificate over TLS 1.2 is refused: 1.3 is the minimum.
            old_tls = client_context(pki["b"])
            old_tls.minimum_version = ssl.TLSVersion.TLSv1_2
            old_tls.maximum_version = ssl.TLSVersion.TLSv1_2
            assert await intrude(port, old_tls, [hello("b"), encode_frame(b"injected")]) == b""
            # Plain TCP garbage on the TLS port fails the handshake too.
            assert await intrude(port, None, [b"GET / HTTP/1.1\r\n\r\n" * 10]) == b""
            await assert_delivers(b, a, b"sentinel")
            assert sum(s.frames_received for s in a.peer_states().values()) == 1

    run(main)


def test_client_certificate_from_another_ca_is_rejected(
    pki: dict[str, MemberTlsFiles], foreign_pki: dict[str, MemberTlsFiles]
) -> None:
    configs = group_configs(pki, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(*configs.values()) as (a, b):
            # Names member "b" of the right group, but the wrong CA signed it.
            forged = client_context(replace(foreign_pki["b"], ca_cert=pki["b"].ca_cert))
            got = await intrude(port, forged, [hello("b"), encode_frame(b"injected")])
            assert got == b""
            await assert_delivers(b, a, b"sentinel")
            assert sum(s.frames_received for s in a.peer_states().values()) == 1

    run(main)


def test_group_ca_certificate_for_a_non_member_is_rejected(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(*configs.values()) as (a, b):
            mallory = client_context(pki["mallory"])
            got = await intrude(port, mallory, [hello("mallory"), encode_frame(b"injected")])
            assert got == b""
            # A member certificate with a hello claiming another member is refused too.
            impostor = client_context(pki["c"])
            assert await intrude(port, impostor, [hello("b"), encode_frame(b"x")]) == b""
            await wait_until(lambda: a.rejected_connections == 2, "a counts two rejections")
            await assert_delivers(b, a, b"sentinel")
            assert sum(s.frames_received for s in a.peer_states().values()) == 1

    run(main)


def test_dialer_refuses_a_target_presenting_another_members_certificate(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"])
    # "b" listens on b's address but holds c's certificate.
    wrong_b = replace(configs["b"], tls=pki["c"])

    async def main() -> None:
        async with running(configs["a"], wrong_b) as (a, b):
            assert a.send("b", b"for b only")

            def refused() -> bool:
                error = a.peer_states()["b"].last_error or ""
                return "expected 'b'" in error

            await wait_until(refused, "a records that b presented the wrong certificate")
            state = a.peer_states()["b"]
            assert state.outbound is not LinkStatus.CONNECTED
            assert state.frames_sent == 0
            assert state.queued_frames == 1
            assert b.peer_states()["a"].frames_received == 0

    run(main)


def test_a_member_configured_differently_is_refused_at_connection_time(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """Same group, valid certificates, but b has another member list and topic settings:
    neither side links up, and both say what differs."""
    agreement = {"members": [["a", False], ["b", False]], "topics": {"globalPartitions": 1}}
    configs = group_configs(pki, ["a", "b"], agreement=agreement)
    wrong_b = replace(
        configs["b"],
        agreement={
            "members": [["a", False], ["b", False], ["c", False]],
            "topics": {"globalPartitions": 3},
        },
    )

    async def main() -> None:
        async with running(configs["a"], wrong_b) as (a, b):
            assert a.send("b", b"for b only")
            assert b.send("a", b"for a only")

            def both_refused() -> bool:
                return all(
                    "configuration disagrees" in (t.peer_states()[p].last_error or "")
                    for t, p in ((a, "b"), (b, "a"))
                )

            await wait_until(both_refused, "a and b record the disagreement")
            error = a.peer_states()["b"].last_error or ""
            assert 'members: [["a", false], ["b", false]] here' in error, error
            assert "globalPartitions" in error, error
            for transport, peer in ((a, "b"), (b, "a")):
                state = transport.peer_states()[peer]
                assert state.outbound is not LinkStatus.CONNECTED
                assert state.frames_sent == 0 and state.frames_received == 0
            assert a.rejected_connections + b.rejected_connections > 0

        # The same agreement on both sides links up as usual.
        async with running(configs["a"], configs["b"]) as (a, b):
            await assert_delivers(a, b, b"agreed")

    run(main)


def test_garbage_and_oversized_frames_close_the_connection_not_the_listener(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b", "c"], max_frame_bytes=1024 * 1024)
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        # Only a runs first: c's certificate is used by the raw test clients below.
        async with running(configs["a"]) as (a,):
            member_c = client_context(pki["c"])
            attacks = [
                [LENGTH_PREFIX.pack(0xFFFFFFFF)],  # huge hello length
                [encode_frame(b"\xff\xfe not json")],  # garbage hello
                [hello("c", group="other-group")],  # wrong group
                [hello("c"), LENGTH_PREFIX.pack(2 * 1024 * 1024)],  # over max_frame_bytes
                [hello("c"), LENGTH_PREFIX.pack(0xFFFFFFFF), b"\x00" * 1000],
            ]
            for number, attack in enumerate(attacks, start=1):
                got = await intrude(port, member_c, attack)
                # Only the welcome (sent after a valid hello) may come back.
                assert got in (b"", _welcome_from("a")), got
                assert a.peer_states()["c"].frames_received == 0, number
            # Attacks 1-3 fail the hello; 4-5 pass it and are then cut off mid-stream.
            assert a.rejected_connections == 3
        # The listener still works: a real member connects and delivers.
        async with running(configs["a"], configs["b"]) as (a, b):
            await assert_delivers(b, a, b"still alive")

    run(main)


def _welcome_from(member: str) -> bytes:
    return encode_frame(
        f'{{"kdsync":"welcome","version":1,"group":"{GROUP}","member":"{member}"}}'.encode()
    )


def test_restarted_peer_is_reconnected_and_queued_frames_flow(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"])

    async def main() -> None:
        async with running(configs["a"]) as (a,):
            async with running(configs["b"]) as (b,):
                await assert_delivers(a, b, b"before restart")
            # b is gone: a notices and backs off.
            await wait_until(
                lambda: a.peer_states()["b"].outbound is not LinkStatus.CONNECTED,
                "a notices b went down",
            )
            assert a.send("b", b"sent while b was down")
            assert a.peer_states()["b"].last_error is not None
            async with running(configs["b"]) as (b,):
                frames = await receive_frames(b, 1)
                assert frames == [("a", b"sent while b was down")]
                await assert_delivers(a, b, b"after restart")
                await assert_delivers(b, a, b"and back")
                assert a.peer_states()["b"].connect_attempts >= 2

    run(main)


def test_a_retired_peer_is_no_longer_dialled_but_may_still_send(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """A member removed from the group: the others stop dialling it and drop what they
    would send it; what it sends them (it may not know it was removed) still arrives."""
    configs = group_configs(pki, ["a", "b"])

    async def main() -> None:
        async with running(configs["a"], configs["b"]) as (a, b):
            await wait_until(connected(a, "b"), "a connects to b")
            await wait_until(connected(b, "a"), "b connects to a")
            assert a.retire_peer("b") is True
            assert a.retire_peer("b") is False, "once"
            assert a.peer_states()["b"].outbound is LinkStatus.RETIRED
            assert a.send("b", b"dropped") is False
            await wait_until(
                lambda: not b.peer_states()["a"].inbound_connected, "a's link to b closes"
            )
            await assert_delivers(b, a, b"from the removed member")
            assert a.peer_states()["b"].outbound is LinkStatus.RETIRED

    run(main)


def _agreement(
    *members: str, witnesses: Collection[str] = (), partitions: int = 1
) -> dict[str, Any]:
    """What a startup file makes every member agree on (``members`` as the sidecar
    builds it: name and whether a witness)."""
    return {
        "members": [[m, m in witnesses] for m in members],
        "topics": {"globalPartitions": partitions},
    }


def disagreeing(*pairs: tuple[TcpTransport, str]) -> Callable[[], bool]:
    def check() -> bool:
        return all(
            "configuration disagrees" in (t.peer_states()[p].last_error or "") for t, p in pairs
        )

    return check


def test_member_lists_that_differ_link_up_once_a_membership_changed_at_runtime(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's file names a witness c added since a started: refused while both go by their
    files, linked both ways once a's membership comes from its log."""
    configs = group_configs(pki, ["a", "b"])
    a_config = replace(configs["a"], agreement=_agreement("a", "b"))
    b_config = replace(configs["b"], agreement=_agreement("a", "b", "c", witnesses={"c"}))

    async def main() -> None:
        async with running(a_config, b_config) as (a, b):
            await wait_until(disagreeing((a, "b"), (b, "a")), "a and b refuse each other")
            error = a.peer_states()["b"].last_error or ""
            assert "members:" in error and "globalPartitions" not in error, error

            a.membership_changed = True  # the next dial, either way, is welcome
            await wait_until(connected(a, "b"), "a connects to b")
            await wait_until(connected(b, "a"), "b connects to a")
            await assert_delivers(a, b, b"a to b")
            await assert_delivers(b, a, b"b to a")

    run(main)


def test_topics_must_still_agree_after_a_membership_change(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"])
    a_config = replace(configs["a"], agreement=_agreement("a", "b"))
    b_config = replace(configs["b"], agreement=_agreement("a", "b", "c", partitions=3))

    async def main() -> None:
        async with running(a_config, b_config, changed={"a", "b"}) as (a, b):
            await wait_until(disagreeing((a, "b"), (b, "a")), "a and b refuse each other")
            for transport, peer in ((a, "b"), (b, "a")):
                state = transport.peer_states()[peer]
                error = state.last_error or ""
                assert "globalPartitions" in error and "members:" not in error, error
                assert state.outbound is not LinkStatus.CONNECTED
                assert state.frames_sent == 0 and state.frames_received == 0

    run(main)


def test_a_member_whose_file_gives_it_another_role_is_refused_even_after_a_change(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's file makes b a witness, a's a data member: refused although both say their
    membership changed at runtime (the files are the only word on roles)."""
    configs = group_configs(pki, ["a", "b", "c"])
    a_config = replace(configs["a"], agreement=_agreement("a", "b", "c"))
    b_config = replace(configs["b"], agreement=_agreement("a", "b", "c", witnesses={"b"}))

    async def main() -> None:
        async with running(a_config, b_config, changed={"a", "b"}) as (a, b):
            await wait_until(disagreeing((a, "b"), (b, "a")), "a and b refuse each other")
            error = a.peer_states()["b"].last_error or ""
            assert "b is a data member here, a witness at b" in error, error

    run(main)


def test_a_member_added_at_runtime_is_dialled_and_accepted(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """a and b started as a group of two; c, a witness added since, runs with a file that
    names all three. Once a adds it (its address from the log), frames flow both ways
    between a and c; b, which has not, still refuses c."""
    configs = group_configs(pki, ["a", "b", "c"])
    ab = {m: configs["a"].peers[m] for m in ("a", "b")}
    a_config = replace(configs["a"], peers=ab, agreement=_agreement("a", "b"))
    b_config = replace(configs["b"], peers=ab, agreement=_agreement("a", "b"))
    c_config = replace(configs["c"], agreement=_agreement("a", "b", "c", witnesses={"c"}))
    c_address = configs["c"].listen

    async def main() -> None:
        async with running(a_config, b_config, c_config) as (a, b, c):
            assert a.peers == ("b",)
            await wait_until(lambda: a.rejected_connections > 0, "a refuses c, a stranger")
            assert c.peer_states()["a"].outbound is not LinkStatus.CONNECTED

            a.membership_changed = True
            assert a.add_peer("c", c_address) is True
            assert set(a.peers) == {"b", "c"}
            await wait_until(connected(a, "c"), "a dials c")
            await wait_until(connected(c, "a"), "c's dial to a is taken")
            await assert_delivers(a, c, b"append for the witness")
            await assert_delivers(c, a, b"the witness answers")
            await assert_delivers(a, b, b"b is still there")

            assert a.add_peer("c", c_address) is False, "a live peer already"
            assert a.add_peer("a", a_config.listen) is False, "ourselves"
            assert a.add_peer("b", b_config.listen) is False, "reached there already"
            # An address from the log wins over the startup file's: b moved.
            assert a.add_peer("b", "127.0.0.1:1") is True
            assert a.peer_states()["b"].address == "127.0.0.1:1"
            await wait_until(
                lambda: a.peer_states()["b"].outbound is not LinkStatus.CONNECTED,
                "a dials b at its new address (where nothing listens)",
            )
            assert a.add_peer("b", b_config.listen) is True
            await assert_delivers(a, b, b"b is back where it was")
            with pytest.raises(ValueError):
                a.add_peer("no such/name", "127.0.0.1:7400")
            with pytest.raises(ValueError):
                a.add_peer("d", "no port")
            assert set(a.peers) == {"b", "c"}

            assert "c" not in b.peers
            assert c.peer_states()["b"].outbound is not LinkStatus.CONNECTED

    run(main)


def test_a_member_behind_an_addition_links_the_added_member_when_it_dials(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's log is behind c's addition: its peers are a and b only, its configuration at
    log index 5. c dials it saying its membership comes from its log, where it listens
    and where its configuration stands; b's own peer links (``PeerLinks`` over this
    ``TcpTransport``) take c once that index is past b's, b dials c back there, and
    frames flow both ways. While c says nothing of the kind, or gives an index not past
    b's (a member that left), b refuses it; a hello claiming another member than its
    certificate names is refused either way."""
    configs = group_configs(pki, ["a", "b", "c"])
    ab = {m: configs["a"].peers[m] for m in ("a", "b")}
    b_config = replace(configs["b"], peers=ab, agreement=_agreement("a", "b"))
    # c's file gives it an address the others cannot use; the log's (kdsync members add
    # --peer) is where it listens, and its hello must give that one.
    c_peers = {**configs["c"].peers, "c": "127.0.0.1:1"}
    c_config = replace(configs["c"], peers=c_peers, agreement=_agreement("a", "b", "c"))
    port = int(b_config.listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(b_config, c_config) as (b, c):
            links = PeerLinks(b)
            links.follow_configuration(Configuration(("a", "b")), 5)
            assert b.config_index == 5 and b.introduce is not None
            await wait_until(lambda: b.rejected_connections > 0, "b refuses c, a stranger")
            assert not connected(c, "b")()

            c.membership_changed = True
            c.advertised_address = c_config.listen
            c.config_index = 3
            refused = b.rejected_connections
            await wait_until(
                lambda: b.rejected_connections > refused, "c's index is not past b's: refused"
            )
            assert "c" not in b.peers and not connected(c, "b")()

            c.config_index = 7
            await wait_until(connected(c, "b"), "c's dial is taken")
            assert b.peer_states()["c"].address == c_config.listen
            await wait_until(connected(b, "c"), "b dials c back at the hello's address")
            await assert_delivers(c, b, b"append from the added member")
            await assert_delivers(b, c, b"b answers it")
            assert set(b.peers) == {"a", "c"}

            refused = b.rejected_connections
            claims_c = encode_frame(
                b'{"kdsync":"hello","version":1,"group":"%s","member":"d",'
                b'"membershipChanged":true,"address":"127.0.0.1:9","configIndex":9}'
                % GROUP.encode()
            )
            assert await intrude(port, client_context(pki["c"]), [claims_c]) == b""
            await wait_until(lambda: b.rejected_connections > refused, "b refuses the impostor")
            assert set(b.peers) == {"a", "c"}

    run(main)


def test_a_member_added_before_start_is_dialled_at_start(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """A restarted member learns of c from its ledger before its transport starts."""
    configs = group_configs(pki, ["a", "b", "c"])
    ab = {m: configs["a"].peers[m] for m in ("a", "b")}

    async def main() -> None:
        a = TcpTransport(replace(configs["a"], peers=ab), jitter=no_jitter)
        a.membership_changed = True
        assert a.add_peer("c", configs["c"].listen) is True
        async with running(configs["c"]) as (c,):
            await a.start()
            try:
                await assert_delivers(a, c, b"after a restart")
                await assert_delivers(c, a, b"and back")
            finally:
                await a.close()

    run(main)


def test_a_retired_peer_added_again_is_dialled_again(pki: dict[str, MemberTlsFiles]) -> None:
    """A witness removed, then added back: the others reach it again."""
    configs = group_configs(pki, ["a", "b"])

    async def main() -> None:
        async with running(configs["a"], configs["b"]) as (a, b):
            await wait_until(connected(a, "b"), "a connects to b")
            assert a.retire_peer("b") is True
            await wait_until(
                lambda: not b.peer_states()["a"].inbound_connected, "a's link to b closes"
            )
            assert a.add_peer("b", configs["b"].listen) is True
            assert a.peer_states()["b"].outbound is not LinkStatus.RETIRED
            await wait_until(connected(a, "b"), "a dials b again")
            await assert_delivers(a, b, b"welcome back")
            await assert_delivers(b, a, b"thanks")
            assert a.add_peer("b", configs["b"].listen) is False, "live again"
            assert a.retire_peer("b") is True, "and can leave again"

    run(main)


def test_a_link_kept_through_retire_and_add_is_still_accounted_for(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's own link to a survives b's removal (b may not know of it) and a's adding it
    back: a counts the frames that arrive on it, and sees it close."""
    configs = group_configs(pki, ["a", "b"])

    async def main() -> None:
        async with running(configs["a"]) as (a,):
            async with running(configs["b"]) as (b,):
                await wait_until(connected(b, "a"), "b connects to a")
                await wait_until(lambda: a.peer_states()["b"].inbound_connected, "a takes it")
                a.retire_peer("b")
                a.add_peer("b", configs["b"].listen)
                await wait_until(connected(a, "b"), "a dials b again")
                await assert_delivers(b, a, b"on the link that stayed")
                received = a.peer_states()["b"].frames_received
            await wait_until(
                lambda: a.peer_states()["b"].outbound is not LinkStatus.CONNECTED,
                "a notices b stopped",
            )
            problems = []
            if received != 1:
                problems.append(f"a counted {received} frames from b, not 1")
            with contextlib.suppress(AssertionError):
                await wait_until(
                    lambda: not a.peer_states()["b"].inbound_connected, "b's link ends", 2.0
                )
            if a.peer_states()["b"].inbound_connected:
                problems.append("a still reports b's link to it connected after b stopped")
            assert not problems, problems

    run(main)


def test_sends_to_a_down_peer_return_promptly_and_stay_bounded(
    pki: dict[str, MemberTlsFiles],
) -> None:
    configs = group_configs(pki, ["a", "b"], max_queue_frames=100, max_frame_bytes=1024)
    configs["a"] = replace(configs["a"], max_queue_bytes=50 * 1024)

    async def main() -> None:
        # b never starts.
        async with running(configs["a"]) as (a,):
            started = time.monotonic()
            accepted = sum(a.send("b", b"x" * 10) for _ in range(10_000))
            elapsed = time.monotonic() - started
            assert accepted == 100
            assert elapsed < 1.0, elapsed
            state = a.peer_states()["b"]
            assert (state.queued_frames, state.frames_dropped) == (100, 9_900)
            # The byte bound applies too: 1 KiB frames fill 50 KiB before 100 frames.
            a2_config = replace(configs["a"], listen=f"127.0.0.1:{free_ports(1)[0]}")
            async with running(a2_config) as (a2,):
                assert sum(a2.send("b", b"y" * 1024) for _ in range(1000)) == 50
                assert a2.peer_states()["b"].queued_bytes == 50 * 1024
            await wait_until(
                lambda: a.peer_states()["b"].outbound is LinkStatus.BACKOFF, "a backs off"
            )
            assert a.peer_states()["b"].last_error is not None
            with pytest.raises(ValueError):
                a.send("nobody", b"x")

    run(main)


def test_slow_receiver_pushes_back_to_bounded_sender_queue(
    pki: dict[str, MemberTlsFiles],
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
        async with running(*configs.values()) as (a, b):
            await wait_until(connected(a, "b"), "a connected to b")
            # b does not call receive(): its buffer fills, it stops reading, the kernel
            # buffers fill, and finally a's queue is full and send() starts dropping.
            accepted = await fill_until_refused(a, "b", frame_size)
            # b read at most what its inbound bound admits (plus the one frame waiting
            # for room), however much a pushed into the network.
            assert b.peer_states()["a"].frames_received <= 64 * 1024 // frame_size + 1
            assert a.peer_states()["b"].queued_bytes <= 256 * 1024
            # Once b catches up, every accepted frame arrives, in order.
            frames = await receive_frames(b, accepted)
            assert [int.from_bytes(f.payload[:8], "big") for f in frames] == list(range(accepted))
            assert a.peer_states()["b"].frames_dropped == 1

    run(main)


def test_close_leaves_no_pending_tasks(pki: dict[str, MemberTlsFiles]) -> None:
    configs = group_configs(pki)

    async def main() -> None:
        transports = [TcpTransport(c, jitter=no_jitter) for c in configs.values()]
        for t in transports:
            await t.start()
        for t in transports:
            await wait_until(connected(t, *t.peers), "all connected")
        # Leave traffic in flight and a caller blocked in receive() at close time.
        for t in transports:
            for peer in t.peers:
                for _ in range(50):
                    t.send(peer, os.urandom(64 * 1024))
        blocked_receive = asyncio.create_task(transports[0].receive())
        await asyncio.sleep(0)
        for t in transports:
            await t.close()
            await t.close()  # idempotent
        with pytest.raises(TransportClosed):
            await transports[0].receive()
        # Receivers blocked before close are woken up, possibly after taking a frame.
        with contextlib.suppress(TransportClosed):
            async with asyncio.timeout(1):
                await blocked_receive
        assert all(
            s.outbound is LinkStatus.CLOSED for t in transports for s in t.peer_states().values()
        )
        assert not transports[0].send("b", b"after close")
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        assert not pending, pending

    run(main)


def test_insecure_mode_works_and_warns_loudly(caplog: pytest.LogCaptureFixture) -> None:
    configs = group_configs(None, ["a", "b"])
    port = int(configs["a"].listen.rsplit(":", 1)[1])

    async def main() -> None:
        async with running(*configs.values()) as (a, b):
            await assert_delivers(a, b, b"plaintext")
            await assert_delivers(b, a, b"plaintext back")
            # Without TLS the hello is all there is; a non-member is still refused.
            assert await intrude(port, None, [hello("mallory"), encode_frame(b"x")]) == b""
            assert await intrude(port, None, [os.urandom(64)]) == b""
            await wait_until(lambda: a.rejected_connections == 2, "a rejects both")
            assert a.peer_states()["b"].frames_received == 1
            # Nothing vouches for a claim: a stranger saying it was added at runtime, at
            # an index past ours, is refused, and a is not made to dial its address.
            PeerLinks(a)
            claim = encode_frame(
                b'{"kdsync":"hello","version":1,"group":"%s","member":"mallory",'
                b'"membershipChanged":true,"address":"127.0.0.1:9","configIndex":99}'
                % GROUP.encode()
            )
            assert await intrude(port, None, [claim]) == b""
            await wait_until(lambda: a.rejected_connections == 3, "a rejects the claim")
            assert set(a.peers) == {"b"}

    run(main)
    assert any("INSECURE" in r.getMessage() for r in caplog.records)
    assert any("UNAUTHENTICATED" in r.getMessage() for r in caplog.records)


def test_pki_is_idempotent(tmp_path: Path) -> None:
    first = make_group_pki(GROUP, ["a", "b"], tmp_path)
    cert_a = first["a"].cert.read_bytes()
    second = make_group_pki(GROUP, ["a", "b", "c"], tmp_path)
    assert second["a"].cert.read_bytes() == cert_a
    assert second["c"].cert.exists()
    assert oct(second["c"].key.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(ValueError):
        make_group_pki(GROUP, ["a", "a"], tmp_path)


def test_a_peer_that_reaches_us_is_dialled_back_at_once_not_after_the_backoff(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """a dials b while b is down and backs off for a long time; b starting (and dialling
    a) makes a dial b at once: a restarted member, or one just added to the group, gets
    the others' frames without waiting out their backoff."""
    configs = group_configs(pki, ["a", "b"], backoff_initial_s=60.0, backoff_max_s=60.0)

    async def main() -> None:
        async with running(configs["a"]) as (a,):
            await wait_until(
                lambda: a.peer_states()["b"].outbound is LinkStatus.BACKOFF,
                "a backs off from the absent b",
            )
            assert a.send("b", b"queued while b was down")
            async with running(configs["b"]) as (b,):
                frames = await receive_frames(b, 1)  # within the deadline, not 30-60 s
                assert frames == [("a", b"queued while b was down")]
                assert a.peer_states()["b"].connect_attempts == 2

    run(main)


@contextlib.contextmanager
def _unanswered(port: int, *ips: str) -> Iterator[None]:
    """A listener at each of ``ips`` whose accept queue is full, so that the kernel drops
    the SYNs sent there: an address that never completes a TCP handshake, as a restarted
    pod's old IP (Linux, with 127.0.0.x bindable)."""
    with contextlib.ExitStack() as stack:
        for ip in ips:
            hole = stack.enter_context(socket.socket())
            backlog = stack.enter_context(socket.socket())
            hole.bind((ip, port))
            hole.listen(0)
            backlog.connect((ip, port))  # fills the accept queue
        yield


class _Names:
    """The transport's resolver port over a table the test edits, as DNS moves a
    restarted pod's name; ``asked[name]`` is set once a dial has resolved ``name``."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked = {name: asyncio.Event() for name in table}

    async def resolve(self, host: str, port: int) -> Sequence[AddressInfo]:
        self.asked[host].set()
        return [(socket.AF_INET, socket.SOCK_STREAM, 0, "", (self.table[host], port))]


def test_a_dial_waiting_for_an_old_address_gives_way_when_the_peer_reaches_us(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's name still resolves to an address that never completes a TCP handshake (a
    restarted pod's old IP; here a listener whose backlog is full, so the kernel drops
    a's SYNs), and a's dial waits on it. b, up again at its new address, dials a: a
    abandons the pending handshake and dials afresh, resolving b's name to where it is
    now. Without that a waits out its connect timeout (60 s here; on a real node this
    was about 7 of the 11 s before a restarted member heard its leader)."""
    configs = group_configs(pki, ["a", "b"], connect_timeout_s=60.0)
    port = int(configs["b"].listen.rsplit(":", 1)[1])
    a_config = replace(configs["a"], peers={**configs["a"].peers, "b": f"b.peers.test:{port}"})

    async def main() -> None:
        names = _Names({"b.peers.test": "127.0.0.2"})  # the old address, until b is up again
        with _unanswered(port, "127.0.0.2"):
            a = TcpTransport(a_config, jitter=no_jitter, resolve=names.resolve)
            await a.start()
            try:
                await asyncio.wait_for(names.asked["b.peers.test"].wait(), DEADLINE_S)
                assert a.send("b", b"queued while the dial waited")
                names.table["b.peers.test"] = "127.0.0.1"
                async with running(configs["b"]) as (b,):
                    frames = await receive_frames(b, 1)  # within 15 s, not 60 s
                    assert frames == [("a", b"queued while the dial waited")]
                    assert a.peer_states()["b"].connect_attempts == 2
            finally:
                await a.close()

    run(main)


def test_members_dialling_each_other_across_a_slow_link_connect_at_the_first_attempt(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """Across 100 ms each way, a and b start together and dial each other: each one's
    connection reaches the other while the other's own dial is still in its TLS
    handshake. Neither gives up its dial for that (only a dial still waiting for its TCP
    handshake gives way), so both link at the first attempt: an earlier change that
    abandoned whole dials made such pairs cancel each other's dials over and over."""
    configs = group_configs(pki, ["a", "b"])
    ports = {name: int(config.listen.rsplit(":", 1)[1]) for name, config in configs.items()}

    async def main() -> None:
        async with (
            slow_link(ports["b"], 0.1) as to_b,
            slow_link(ports["a"], 0.1) as to_a,
        ):
            a_config = replace(configs["a"], peers={**configs["a"].peers, "b": f"127.0.0.1:{to_b}"})
            b_config = replace(configs["b"], peers={**configs["b"].peers, "a": f"127.0.0.1:{to_a}"})
            async with running(a_config, b_config) as (a, b):
                await wait_until(connected(a, "b"), "a links b")
                await wait_until(connected(b, "a"), "b links a")
                assert a.peer_states()["b"].connect_attempts == 1
                assert b.peer_states()["a"].connect_attempts == 1

    run(main)


def test_a_dial_to_a_changed_address_still_gives_way_when_the_peer_reaches_us(
    pki: dict[str, MemberTlsFiles],
) -> None:
    """b's address changes (the log names another than the startup file) while a's dial
    to the old one waits for its TCP handshake: the new dial loop's handshake waits too,
    and must still give way when b reaches a, not wait out the old loop's cleanup
    clearing its mark (the connect timeout is 60 s here)."""
    configs = group_configs(pki, ["a", "b"], connect_timeout_s=60.0)
    port = int(configs["b"].listen.rsplit(":", 1)[1])
    a_config = replace(configs["a"], peers={**configs["a"].peers, "b": f"b-old.peers.test:{port}"})

    async def main() -> None:
        names = _Names({"b-old.peers.test": "127.0.0.2", "b-new.peers.test": "127.0.0.3"})
        with _unanswered(port, "127.0.0.2", "127.0.0.3"):
            a = TcpTransport(a_config, jitter=no_jitter, resolve=names.resolve)
            await a.start()
            try:
                await asyncio.wait_for(names.asked["b-old.peers.test"].wait(), DEADLINE_S)
                assert a.add_peer("b", f"b-new.peers.test:{port}")
                await asyncio.wait_for(names.asked["b-new.peers.test"].wait(), DEADLINE_S)
                assert a.send("b", b"queued while both dials waited")
                names.table["b-new.peers.test"] = "127.0.0.1"
                async with running(configs["b"]) as (b,):
                    frames = await receive_frames(b, 1)  # within 15 s, not 60 s
                    assert frames == [("a", b"queued while both dials waited")]
            finally:
                await a.close()

    run(main)
