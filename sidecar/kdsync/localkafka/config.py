"""Pure helpers: broker properties for a one-node KRaft test cluster, and free ports."""

from __future__ import annotations

import contextlib
import random
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PropertyValue = str | int | float | bool

# Settings that make a single-node cluster start fast and accept transactions: every
# internal topic needs replication factor and min ISR 1, internal topics get few partitions
# (creating 50 of each is slow on small machines), and thread pools are small because
# several brokers share two cores.
FAST_SINGLE_NODE_DEFAULTS: Mapping[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    # After a kill -9 the restarted node cannot register until its previous session
    # expires (9 s by default); broker and controller share one JVM, so heartbeats do not
    # cross a network and a shorter session is safe.
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    # kdsync creates its topics explicitly; a typo in a topic name should fail, not
    # silently create a topic.
    "auto.create.topics.enable": "false",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "group.coordinator.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
}

# Properties the launcher derives from ports and folders; overriding them would leave a
# broker that does not match its own bootstrap address or formatted storage.
RESERVED_PROPERTIES: frozenset[str] = frozenset(
    {
        "process.roles",
        "node.id",
        "broker.id",
        "listeners",
        "advertised.listeners",
        "listener.security.protocol.map",
        "inter.broker.listener.name",
        "controller.listener.names",
        "controller.quorum.bootstrap.servers",
        "controller.quorum.voters",
        "log.dirs",
        "log.dir",
        "metadata.log.dir",
    }
)

NODE_ID = 1


# Security protocols an extra client listener may speak (Kafka's names).
LISTENER_PROTOCOLS: frozenset[str] = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
# Listener names the launcher uses itself.
_OWN_LISTENERS = frozenset({"PLAINTEXT", "CONTROLLER"})


@dataclass(frozen=True)
class BrokerPorts:
    """The two listeners of a combined broker+controller node, plus the ports of extra
    client listeners as ``(listener name, port)`` pairs (e.g. ``(("SSL", 21003),)``)."""

    broker: int
    controller: int
    extra: tuple[tuple[str, int], ...] = ()

    def extra_port(self, listener: str) -> int:
        for name, port in self.extra:
            if name == listener:
                return port
        raise KeyError(f"no port for listener {listener!r}")


# The SASL mechanism of the launcher's SCRAM users (the strongest Kafka offers).
SCRAM_MECHANISM = "SCRAM-SHA-512"
# Characters that have no meaning in StorageTool's --add-scram syntax
# (``MECHANISM=[name=...,password=...]``), so no quoting is needed.
_SCRAM_TEXT = re.compile(r"[A-Za-z0-9._@+-]+")


@dataclass(frozen=True)
class ScramUser:
    """A SCRAM user the broker knows from the moment it is formatted (KRaft keeps SCRAM
    credentials in its metadata log, so formatting is the one place no broker has to be
    running to add them). The password never appears in the object's repr."""

    name: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        for what, text in (("name", self.name), ("password", self.password)):
            if not _SCRAM_TEXT.fullmatch(text):
                raise ValueError(
                    f"SCRAM user {what} must be non-empty and use only letters, digits and "
                    "'.', '_', '@', '+', '-' (StorageTool's --add-scram syntax)"
                )

    def storage_argument(self, mechanism: str = SCRAM_MECHANISM) -> str:
        """The value of ``kafka-storage format --add-scram``."""
        return f"{mechanism}=[name={self.name},password={self.password}]"


def check_extra_listeners(extra_listeners: Mapping[str, str]) -> None:
    """Raise ValueError unless every extra listener has a usable name and protocol."""
    for name, protocol in extra_listeners.items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name in _OWN_LISTENERS:
            raise ValueError(
                f"extra listener {name!r}: use an upper-case name other than "
                f"{' and '.join(sorted(_OWN_LISTENERS))}, e.g. SSL or CLIENT_TLS"
            )
        if protocol not in LISTENER_PROTOCOLS:
            raise ValueError(
                f"extra listener {name}: protocol {protocol!r} is not one of "
                f"{', '.join(sorted(LISTENER_PROTOCOLS))}"
            )


def property_text(value: PropertyValue) -> str:
    """Kafka's spelling of a property value (booleans are lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def broker_properties(
    *,
    host: str,
    ports: BrokerPorts,
    data_dir: Path,
    overrides: Mapping[str, PropertyValue] | None = None,
    extra_listeners: Mapping[str, str] | None = None,
    advertised: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """All properties of a one-node combined-mode cluster, overrides applied last.

    ``extra_listeners`` (listener name -> security protocol) adds client listeners on the
    ports ``ports.extra`` names, next to the PLAINTEXT one (which stays the inter-broker
    listener, the bootstrap address and what the readiness probe uses). Configure them
    with ``listener.name.<lower-case name>.*`` overrides, e.g.
    ``listener.name.ssl.ssl.client.auth=required``.
    """
    reserved = sorted(RESERVED_PROPERTIES.intersection(overrides or {}))
    if reserved:
        raise ValueError(
            f"these broker properties are set by the launcher and cannot be overridden: "
            f"{', '.join(reserved)}"
        )
    extra = dict(extra_listeners or {})
    check_extra_listeners(extra)
    broker_endpoint = f"{host}:{ports.broker}"
    controller_endpoint = f"{host}:{ports.controller}"
    listeners = [f"PLAINTEXT://{broker_endpoint}", f"CONTROLLER://{controller_endpoint}"]
    advertised_listeners = list(listeners)
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    unknown = sorted(set(advertised or {}) - set(extra))
    if unknown:
        raise ValueError(
            f"advertised addresses for listeners that are not extra listeners: {unknown}"
        )
    for name, protocol in extra.items():
        try:
            port = ports.extra_port(name)
        except KeyError:
            raise ValueError(f"extra listener {name} has no port in {ports}") from None
        listeners.append(f"{name}://{host}:{port}")
        advertised_listeners.append(f"{name}://{(advertised or {}).get(name, f'{host}:{port}')}")
        protocols.append(f"{name}:{protocol}")
    properties: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.bootstrap.servers": controller_endpoint,
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised_listeners),
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(protocols),
        "log.dirs": str(data_dir),
        **FAST_SINGLE_NODE_DEFAULTS,
    }
    for key, value in (overrides or {}).items():
        properties[key] = property_text(value)
    return properties


def _escape(text: str, *, is_key: bool) -> str:
    """java.util.Properties escaping, so any key or value round-trips."""
    out: list[str] = []
    for index, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif char in "=:#!" and is_key:
            out.append("\\" + char)
        elif char == " " and (is_key or index == 0):
            out.append("\\ ")
        elif ord(char) > 0x7E or ord(char) < 0x20:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


def render_properties(properties: Mapping[str, str], header: str | None = None) -> str:
    """The text of a ``.properties`` file, one ``key=value`` per line, keys in order given."""
    lines = [f"# {line}" for line in (header or "").splitlines()]
    lines += [
        f"{_escape(key, is_key=True)}={_escape(value, is_key=False)}"
        for key, value in properties.items()
    ]
    return "\n".join(lines) + "\n"


def parse_properties(text: str) -> dict[str, str]:
    """Inverse of :func:`render_properties` for the subset it writes (tests, debugging)."""
    result: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw or raw.startswith(("#", "!")):
            continue
        key_chars: list[str] = []
        index = 0
        while index < len(raw):
            char = raw[index]
            if char == "\\" and index + 1 < len(raw):
                key_chars.append(raw[index : index + 2])
                index += 2
                continue
            if char in "=:":
                break
            key_chars.append(char)
            index += 1
        key = _unescape("".join(key_chars))
        result[key] = _unescape(raw[index + 1 :])
    return result


def _unescape(text: str) -> str:
    out: list[str] = []
    index = 0
    simple = {"n": "\n", "r": "\r", "t": "\t"}
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            nxt = text[index + 1]
            if nxt == "u":
                out.append(chr(int(text[index + 2 : index + 6], 16)))
                index += 6
                continue
            out.append(simple.get(nxt, nxt))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _ephemeral_port_floor() -> int:
    """Lowest port the kernel hands out for outgoing connections (Linux), else 32768."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def allocate_ports(
    count: int,
    host: str = "127.0.0.1",
    *,
    low: int = 15000,
    rng: random.Random | None = None,
) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now.

    Ports come from below the kernel's ephemeral range, so an outgoing connection never
    takes a broker's port while that broker is down for a restart. Each candidate is
    checked by binding it; all stay bound until every port is chosen so the result has
    no duplicates. Another process may still take one before the broker binds it; the
    fleet retries a start that failed that way.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    high = _ephemeral_port_floor()
    if high - low < count * 4:
        low = 1024
    chooser = rng if rng is not None else random.Random()
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        attempts = 0
        while len(ports) < count:
            attempts += 1
            if attempts > count * 200:
                raise RuntimeError(f"could not find {count} free ports on {host}")
            candidate = chooser.randrange(low, high)
            if candidate in ports:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                # No SO_REUSEADDR: a port with lingering TIME_WAIT connections is skipped.
                probe.bind((host, candidate))
            except OSError:
                probe.close()
                continue
            held.append(probe)
            ports.append(candidate)
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    return ports
