"""The sidecar's admin listener over real mutual TLS on 127.0.0.1, with the operator's
client (``kdsync.admin_client``), and the plain port's loopback rule next to it.

No Kafka: the apps run against a stand-in for the Sidecar (what the handlers use of it),
and POST /membership reaches real OrderingNodes through the unit tests' message pump.
Every test runs its own event loop; the blocking client runs in a thread so the server
can answer it. No sleeps: every wait is a socket operation with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization

from kdsync.admin_client import AdminClient, AdminIdentityMismatch, AdminUnreachable
from kdsync.config import SidecarConfig, parse_config
from kdsync.driver import MemberDriver
from kdsync.pki import GroupCa, make_group_pki
from kdsync.runtime.admin_api import start_admin
from kdsync.runtime.admin_site import AdminRefusal, GatedTlsSite, HandshakeLimits
from kdsync.runtime.http_api import build_app
from kdsync.runtime.metrics import SidecarMetrics
from kdsync.runtime.process import ListenerError, start_listeners
from kdsync.runtime.sidecar import Sidecar
from kdsync.transport.identity import MemberTlsFiles, operator_uri
from tests.support.leak_checks import no_resource_warnings
from tests.support.node_driver import NodeDriver
from tests.unit.ordering_pump import ELECTION_DEADLINE, THREE, Pump

GROUP = "orders"
TIMEOUT_S = 10.0
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Pems:
    ca: bytes
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Pki:
    files: dict[str, MemberTlsFiles]  # members a and b
    operator: Pems
    foreign_operator: Pems  # same group name, another CA

    def member(self, name: str) -> Pems:
        files = self.files[name]
        return Pems(files.ca_cert.read_bytes(), files.cert.read_bytes(), files.key.read_bytes())

    def client(self, pems: Pems | None = None, ca: bytes | None = None) -> AdminClient:
        pems = pems or self.operator
        return AdminClient(ca or pems.ca, pems.cert, pems.key, GROUP)


def _operator_pems(ca: GroupCa) -> Pems:
    cert, key = ca.issue_operator()
    return Pems(
        ca.cert.public_bytes(serialization.Encoding.PEM),
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    files = make_group_pki(GROUP, ["a", "b"], folder)
    ca = GroupCa.load(GROUP, folder / "ca.pem", folder / "ca-key.pem")
    return Pki(files, _operator_pems(ca), _operator_pems(GroupCa.create(GROUP)))


@pytest.fixture(autouse=True)
def no_leaked_sockets() -> Iterator[None]:
    """No test may leave a socket or transport open (a refused handshake included)."""
    with no_resource_warnings():
        yield


@dataclass
class StandIn:
    """What the shared handlers use of a Sidecar."""

    allow: bool = True
    phase: str = "recovering"
    driver: MemberDriver | None = None
    status_reads: int = 0
    metrics: SidecarMetrics = field(default_factory=SidecarMetrics)

    def refused(self, reason: AdminRefusal) -> float:
        """``kdsync_admin_connections_refused_total{reason}`` as /metrics would serve it."""
        value = self.metrics.registry.get_sample_value(
            "kdsync_admin_connections_refused_total", {"reason": reason.value}
        )
        assert value is not None, f"no {reason} sample"
        return value

    @property
    def config(self) -> Any:
        return SimpleNamespace(group=GROUP, allow_membership_changes=self.allow)

    def status_document(self) -> dict[str, Any]:
        self.status_reads += 1
        return {"member": "a", "phase": self.phase}

    async def source_backlog(self) -> dict[str, int]:
        return {"orders[0]": 0}


@contextlib.asynccontextmanager
async def admin_listener(sidecar: StandIn, files: MemberTlsFiles) -> AsyncIterator[str]:
    """The admin app on a free loopback port; yields its host:port."""
    runner = await start_admin(cast(Sidecar, sidecar), "127.0.0.1:0", files)
    try:
        port = runner.addresses[0][1]
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _elected_leader() -> tuple[MemberDriver, str]:
    """The leader of an elected three-member group (real OrderingNodes), and a follower."""
    pump = Pump(THREE)
    pump.run_until(lambda: pump.leader() is not None, ELECTION_DEADLINE, "election")
    leader = pump.leader()
    assert leader is not None
    node = pump.node(leader)
    pump.run_until(lambda: node.commit_index >= node.log.last_index, 50, "the no-op")
    follower = next(m for m in THREE.members if m != leader)
    return cast(MemberDriver, NodeDriver(node)), follower


def _run(main: Callable[[], Any]) -> None:
    asyncio.run(main())


# -- the operator ---------------------------------------------------------------------


def test_the_operator_reads_and_changes_membership_through_the_shared_handlers(
    pki: Pki,
) -> None:
    sidecar = StandIn()

    async def main() -> None:
        async with admin_listener(sidecar, pki.files["a"]) as address:
            with pki.client() as client:
                code, answer = await asyncio.to_thread(
                    client.get_json, address, "/status", "a", TIMEOUT_S
                )
                assert (code, answer) == (200, {"member": "a", "phase": "recovering"})
                code, answer = await asyncio.to_thread(
                    client.get_json, address, "/source-backlog", "a", TIMEOUT_S
                )
                assert code == 503 and answer["reason"] == "this member is recovering"

                remove = {"remove": "m3"}
                code, answer = await asyncio.to_thread(
                    client.post_json, address, "/membership", "a", remove, TIMEOUT_S
                )
                assert code == 503 and answer["outcome"] == "ask-again", answer

                # The same handler's body checks as on the plain port.
                code, answer = await asyncio.to_thread(
                    client.post_json, address, "/membership", "a", {"drop": "x"}, TIMEOUT_S
                )
                assert code == 400 and '{"remove"' in answer["reason"], answer

                driver, follower = _elected_leader()
                sidecar.phase, sidecar.driver = "running", driver
                code, answer = await asyncio.to_thread(
                    client.get_json, address, "/source-backlog", "a", TIMEOUT_S
                )
                assert (code, answer) == (200, {"backlog": {"orders[0]": 0}})
                remove = {"remove": follower}
                code, answer = await asyncio.to_thread(
                    client.post_json, address, "/membership", "a", remove, TIMEOUT_S
                )
                assert code == 200 and answer["outcome"] == "appended", answer
                assert answer["index"] == driver.node.log.last_index
                assert follower not in answer["configuration"]["voters"]

    _run(main)


def test_the_admin_listener_is_the_opt_in_for_the_operator_not_allow_membership_changes(
    pki: Pki,
) -> None:
    """The operator renders no allowMembershipChanges (which would open the plain port's
    loopback path too, reachable through a mesh proxy): its certificate on the admin
    listener is what lets a change in."""

    async def main() -> None:
        async with admin_listener(StandIn(allow=False), pki.files["a"]) as address:
            with pki.client() as client:
                code, answer = await asyncio.to_thread(
                    client.post_json, address, "/membership", "a", {"remove": "b"}, TIMEOUT_S
                )
        assert code == 503 and answer["outcome"] == "ask-again", answer

    _run(main)


# -- other clients --------------------------------------------------------------------


def test_a_member_certificate_may_read_but_not_change_membership(pki: Pki) -> None:
    sidecar = StandIn()

    async def main() -> None:
        async with admin_listener(sidecar, pki.files["a"]) as address:
            with pki.client(pki.member("b")) as client:
                code, _ = await asyncio.to_thread(
                    client.get_json, address, "/status", "a", TIMEOUT_S
                )
                assert code == 200
                code, answer = await asyncio.to_thread(
                    client.post_json, address, "/membership", "a", {"remove": "b"}, TIMEOUT_S
                )
        assert code == 403 and answer["outcome"] == "refused", answer
        assert operator_uri(GROUP) in answer["reason"], answer
        assert "kdsync://orders/b" in answer["reason"], answer
        assert sidecar.refused(AdminRefusal.NOT_THE_OPERATOR) == 1
        assert sidecar.refused(AdminRefusal.TLS_HANDSHAKE) == 0

    _run(main)


def _raw_get(address: str, context: ssl.SSLContext) -> tuple[str, bytes | OSError]:
    """GET /status over TLS with ``context``: how far it got ("handshake" or "request")
    and the answer's bytes or the error that stopped it."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as plain:
        try:
            tls = context.wrap_socket(plain)  # the handshake
        except OSError as exc:
            return "handshake", exc
        with tls:
            try:
                tls.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return "request", tls.recv(4096) or OSError("closed without an answer")
            except OSError as exc:
                return "request", exc


def _no_certificate_context(pki: Pki, maximum: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.maximum_version = maximum
    context.load_verify_locations(cadata=pki.operator.ca.decode())
    return context


@contextlib.asynccontextmanager
async def gated_listener(
    sidecar: StandIn, files: MemberTlsFiles, limits: HandshakeLimits
) -> AsyncIterator[tuple[str, GatedTlsSite]]:
    """The admin app with ``limits``; yields its host:port and its site."""
    runner = await start_admin(cast(Sidecar, sidecar), "127.0.0.1:0", files, limits)
    try:
        (site,) = runner.sites
        assert isinstance(site, GatedTlsSite)
        yield f"127.0.0.1:{runner.addresses[0][1]}", site
    finally:
        await runner.cleanup()


def _closed_by_server(address: str, within: float) -> bool:
    """Connect and send nothing: whether the server closes the connection ``within``
    seconds (it is still open after that)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=within) as plain:
        try:
            return plain.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


async def _wait_until(done: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while not done():
                await asyncio.sleep(0.01)  # polling the condition; the deadline is above
    except TimeoutError:
        raise AssertionError(f"not within {TIMEOUT_S} s: {what}") from None


async def _operator_reads_status(pki: Pki, address: str) -> int:
    with pki.client() as client:
        code, _ = await asyncio.to_thread(client.get_json, address, "/status", "a", TIMEOUT_S)
        return code


def test_a_client_that_never_finishes_its_handshake_is_dropped(pki: Pki) -> None:
    # asyncio's default is 60 s: a client opening connections and sending nothing held
    # each socket for a minute.
    limits = HandshakeLimits(handshake_timeout_s=0.5)
    sidecar = StandIn()

    async def main() -> None:
        async with gated_listener(sidecar, pki.files["a"], limits) as (address, site):
            assert await asyncio.to_thread(_closed_by_server, address, TIMEOUT_S)
            await _wait_until(lambda: site.pending == 0, "the handshake is no longer counted")
            assert await _operator_reads_status(pki, address) == 200
        assert sidecar.refused(AdminRefusal.HANDSHAKE_TIMEOUT) == 1
        assert sidecar.refused(AdminRefusal.TOO_MANY_PENDING) == 0

    _run(main)


def test_connections_over_the_handshake_cap_are_closed_at_once(pki: Pki) -> None:
    limits = HandshakeLimits(max_pending=2, handshake_timeout_s=3 * TIMEOUT_S)
    sidecar = StandIn()

    async def main() -> None:
        async with gated_listener(sidecar, pki.files["a"], limits) as (address, site):
            host, port = address.rsplit(":", 1)
            idle = [socket.create_connection((host, int(port)), TIMEOUT_S) for _ in range(2)]
            try:
                await _wait_until(lambda: site.pending == 2, "both idle connections counted")
                # A third is closed long before the handshake timeout.
                assert await asyncio.to_thread(_closed_by_server, address, TIMEOUT_S)
                assert sidecar.refused(AdminRefusal.TOO_MANY_PENDING) == 1
                for held in idle:
                    held.setblocking(False)
                    with pytest.raises(BlockingIOError):
                        held.recv(1)  # still open, waiting for a ClientHello
            finally:
                for held in idle:
                    held.close()
            await _wait_until(lambda: site.pending == 0, "closed connections leave the count")
            assert await _operator_reads_status(pki, address) == 200
        # The two held connections hung up in their handshake.
        assert sidecar.refused(AdminRefusal.CLOSED_IN_HANDSHAKE) == 2
        assert sidecar.refused(AdminRefusal.HANDSHAKE_TIMEOUT) == 0

    _run(main)


def test_stopping_closes_connections_still_in_their_handshake(pki: Pki) -> None:
    limits = HandshakeLimits(handshake_timeout_s=3 * TIMEOUT_S)

    async def main() -> None:
        runner = await start_admin(cast(Sidecar, StandIn()), "127.0.0.1:0", pki.files["a"], limits)
        (site,) = runner.sites
        assert isinstance(site, GatedTlsSite)
        port = runner.addresses[0][1]
        idle = [socket.create_connection(("127.0.0.1", port), TIMEOUT_S) for _ in range(2)]
        try:
            await _wait_until(lambda: site.pending == 2, "both idle connections counted")
            await runner.cleanup()
            assert site.pending == 0
            for held in idle:  # closed by the server, long before the handshake timeout
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.to_thread(held.recv, 1) == b""
        finally:
            for held in idle:
                held.close()

    _run(main)


def test_a_client_without_a_certificate_fails_the_handshake(pki: Pki) -> None:
    sidecar = StandIn()

    async def main() -> None:
        async with admin_listener(sidecar, pki.files["a"]) as address:
            # TLS 1.2: the server ends the handshake itself (asyncio closes without an
            # alert, so the client reads EOF there).
            stage, outcome = await asyncio.to_thread(
                _raw_get, address, _no_certificate_context(pki, ssl.TLSVersion.TLSv1_2)
            )
            assert stage == "handshake" and isinstance(outcome, ssl.SSLError), outcome
            # TLS 1.3: the client's side of the handshake completes before the server
            # checks; the server then drops the connection and nothing is answered.
            stage, outcome = await asyncio.to_thread(
                _raw_get, address, _no_certificate_context(pki, ssl.TLSVersion.TLSv1_3)
            )
            assert isinstance(outcome, OSError), (stage, outcome)
            await _wait_until(
                lambda: sidecar.refused(AdminRefusal.TLS_HANDSHAKE) == 2,
                "both handshakes counted as refused",
            )
        assert sidecar.status_reads == 0

    _run(main)


def test_certificates_of_another_ca_fail_either_way(pki: Pki) -> None:
    sidecar = StandIn()

    async def main() -> None:
        async with admin_listener(sidecar, pki.files["a"]) as address:
            # The operator's name, but another CA signed it: the server refuses it.
            with (
                pki.client(pki.foreign_operator, ca=pki.operator.ca) as client,
                pytest.raises(AdminUnreachable, match=address) as refused,
            ):
                await asyncio.to_thread(client.get_json, address, "/status", "a", TIMEOUT_S)
            assert isinstance(refused.value.__cause__, OSError)
            # A client trusting only the other CA refuses the server's chain.
            with (
                pki.client(pki.foreign_operator) as client,
                pytest.raises(AdminUnreachable, match="certificate verify failed") as distrust,
            ):
                await asyncio.to_thread(client.get_json, address, "/status", "a", TIMEOUT_S)
            assert isinstance(distrust.value.__cause__, ssl.SSLCertVerificationError)
        assert sidecar.status_reads == 0

    _run(main)


# -- the client's own checks -------------------------------------------------------------


def test_the_client_refuses_a_server_that_is_another_member(pki: Pki) -> None:
    sidecar = StandIn()

    async def main() -> None:
        async with admin_listener(sidecar, pki.files["b"]) as address:
            with pki.client() as client:
                # Both kinds of request: a read would show (status_reads) had it arrived.
                with pytest.raises(AdminIdentityMismatch, match="kdsync://orders/b, not kdsync"):
                    await asyncio.to_thread(client.get_json, address, "/status", "a", TIMEOUT_S)
                with pytest.raises(AdminIdentityMismatch, match="kdsync://orders/b, not kdsync"):
                    await asyncio.to_thread(
                        client.post_json, address, "/membership", "a", {"remove": "b"}, TIMEOUT_S
                    )
                # The right name is taken (the refusal above is not a broken client).
                code, _ = await asyncio.to_thread(
                    client.get_json, address, "/status", "b", TIMEOUT_S
                )
                assert code == 200
        assert sidecar.status_reads == 1, "nothing was sent to the wrong member"

    _run(main)


def test_an_address_nothing_listens_on_is_unreachable(pki: Pki) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        with (
            pki.client() as client,
            pytest.raises(AdminUnreachable, match=f"of a at {address}") as error,
        ):
            client.get_json(address, "/status", "a", TIMEOUT_S)
    assert isinstance(error.value, OSError)
    assert isinstance(error.value.__cause__, ConnectionRefusedError)


def test_a_closed_client_and_bad_pems_are_refused(pki: Pki) -> None:
    client = pki.client()
    client.close()
    with pytest.raises(ValueError, match="closed"):
        client.get_json("127.0.0.1:1", "/status", "a", TIMEOUT_S)
    with pki.client() as client, pytest.raises(ValueError, match="must start with /"):
        client.get_json("127.0.0.1:1", "status", "a", TIMEOUT_S)
    with pytest.raises(ValueError, match="not a matching PEM pair"):
        AdminClient(pki.operator.ca, pki.operator.cert, pki.member("a").key, GROUP)
    with pytest.raises(ValueError, match="group CA"):
        AdminClient(b"nonsense", pki.operator.cert, pki.operator.key, GROUP)


# -- the plain port, next to it ----------------------------------------------------------


def test_the_plain_port_still_takes_membership_changes_from_loopback_only() -> None:
    async def post(app: web.Application) -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.post(
                "/membership", data=json.dumps({"remove": "b"}), headers=JSON
            )
            return response.status, await response.json()

    async def main() -> None:
        # From 127.0.0.1: past the caller check (503: the stand-in is recovering).
        code, answer = await post(build_app(cast(Sidecar, StandIn())))
        assert code == 503 and answer["outcome"] == "ask-again", answer

        # The same request as if from another host: the real stack, with the request's
        # remote address replaced as a proxy's X-Forwarded-For handling would.
        @web.middleware
        async def from_elsewhere(
            request: web.Request, handler: Callable[[web.Request], Any]
        ) -> web.StreamResponse:
            return cast(web.StreamResponse, await handler(request.clone(remote="10.1.2.3")))

        app = build_app(cast(Sidecar, StandIn()))
        app.middlewares.append(from_elsewhere)
        code, answer = await post(app)
        assert code == 403 and "from this host only, not 10.1.2.3" in answer["reason"], answer

    _run(main)


# -- the process starts both ---------------------------------------------------------


def _config(pki: Pki, http_port: int, admin_port: int) -> SidecarConfig:
    files = pki.files["a"]
    return parse_config(
        {
            "group": GROUP,
            "member": "a",
            "members": [
                {"name": "a", "peer": "127.0.0.1:7400", "kafka": {"bootstrapServers": "k:1"}},
                {"name": "b", "peer": "127.0.0.1:7401", "kafka": {"bootstrapServers": "k:2"}},
            ],
            "topics": {"names": ["orders"]},
            "tls": {"ca": str(files.ca_cert), "cert": str(files.cert), "key": str(files.key)},
            "http": f"127.0.0.1:{http_port}",
            "admin": {"listen": f"127.0.0.1:{admin_port}"},
            "allowMembershipChanges": True,
        }
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _plain_status(port: int) -> int | None:
    """GET /status on the plain port: its HTTP status, or None if nothing listens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", "/status", headers={"Connection": "close"})
        response = connection.getresponse()
        response.read()
        return response.status
    except ConnectionRefusedError:
        return None
    finally:
        connection.close()


def test_the_process_serves_the_admin_listener_next_to_http(pki: Pki) -> None:
    http_port, admin_port = _free_port(), _free_port()
    config = _config(pki, http_port, admin_port)
    sidecar = cast(Sidecar, StandIn())

    async def main() -> None:
        runners = await start_listeners(sidecar, config)
        try:
            with pki.client() as client:
                code, _ = await asyncio.to_thread(
                    client.get_json, f"127.0.0.1:{admin_port}", "/status", "a", TIMEOUT_S
                )
            assert code == 200
            assert await asyncio.to_thread(_plain_status, http_port) == 200
        finally:
            for runner in runners:
                await runner.cleanup()

    _run(main)


def test_a_busy_admin_address_stops_the_start_and_frees_http(pki: Pki) -> None:
    http_port = _free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = _config(pki, http_port, busy.getsockname()[1])

        async def main() -> None:
            with pytest.raises(ListenerError, match=r"admin listener .* `admin.listen`"):
                await start_listeners(cast(Sidecar, StandIn()), config)

        _run(main)
    assert _plain_status(http_port) is None, "the plain port was stopped again"
