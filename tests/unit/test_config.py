"""The sidecar config: valid files load, and every mistake is named with a fix."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kdsync.config import (
    ConfigError,
    SidecarConfig,
    TopicsConfig,
    format_path,
    load_config,
    parse_config,
)
from kdsync.ordering import GroupSpec, Timing
from kdsync.transport.identity import MemberTlsFiles

Data = dict[str, Any]


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tls"
    folder.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (folder / name).write_text("-----BEGIN PLACEHOLDER-----\n")
    return folder


def three_members(tls_dir: Path) -> Data:
    return {
        "group": "orders",
        "member": "us-east",
        "members": [
            {
                "name": "us-east",
                "peer": "10.0.0.1:7400",
                "kafka": {
                    "bootstrapServers": "localhost:9092",
                    "properties": {"security.protocol": "SSL", "socket.keepalive.enable": True},
                },
            },
            {
                "name": "eu-west",
                "peer": "[2001:db8::2]:7400",
                "kafka": {"bootstrapServers": "kafka-0:9092, kafka-1:9092"},
            },
            {
                "name": "ap-south",
                "peer": "kdsync-ap.example.com:7401",
                "kafka": {"bootstrapServers": "ap:9092"},
            },
        ],
        "topics": {"names": ["orders"], "include": [r"payments\..*"], "exclude": [".*-test"]},
        "tls": {
            "ca": str(tls_dir / "ca.pem"),
            "cert": str(tls_dir / "cert.pem"),
            "key": str(tls_dir / "key.pem"),
        },
        "http": "127.0.0.1:8080",
    }


def two_plus_witness() -> Data:
    return {
        "group": "orders",
        "member": "witness-1",
        "members": [
            {"name": "us-east", "peer": "127.0.0.1:7400", "kafka": {"bootstrapServers": "a:1"}},
            {"name": "us-west", "peer": "127.0.0.1:7401", "kafka": {"bootstrapServers": "b:1"}},
            {"name": "witness-1", "peer": "127.0.0.1:7402", "witness": True},
        ],
        "topics": {"names": ["orders"]},
        "insecure": True,
        "listen": "127.0.0.1:7402",
        "ordering": {"tickMs": 10, "electionTicks": 30, "heartbeatTicks": 2, "maxOutbox": 7},
    }


def write(tmp_path: Path, data: Data | str) -> Path:
    path = tmp_path / "kdsync.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def load_error(tmp_path: Path, data: Data | str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data))
    return info.value


# -- valid configs ---------------------------------------------------------------------


def test_three_member_config_loads(tmp_path: Path, tls_dir: Path) -> None:
    config = load_config(write(tmp_path, three_members(tls_dir)))

    assert config.group == "orders"
    assert config.own_member.name == "us-east"
    assert not config.is_witness
    assert [m.name for m in config.data_members] == ["us-east", "eu-west", "ap-south"]
    assert config.group_spec() == GroupSpec(members=("us-east", "eu-west", "ap-south"))
    assert config.timing() == Timing(
        heartbeat_ticks=1, election_ticks=20, resend_ticks=100, max_outbox=1024
    )
    assert config.ordering.tick_ms == 50
    assert config.ordering.max_batch_events == 500
    assert config.ordering.max_batch_bytes == 1024 * 1024
    assert config.topics.global_suffix == "-global"
    assert config.topics.global_partitions == 1
    assert config.topics.global_topic("orders") == "orders-global"

    kafka = config.own_member.kafka
    assert kafka is not None
    assert kafka.client_properties() == {
        "bootstrap.servers": "localhost:9092",
        "security.protocol": "SSL",
        "socket.keepalive.enable": "true",
    }
    second = config.members[1].kafka
    assert second is not None
    assert second.bootstrap_servers == "kafka-0:9092,kafka-1:9092"

    transport = config.transport_config()
    assert transport.group == "orders"
    assert transport.member == "us-east"
    assert transport.listen == "0.0.0.0:7400"  # default: own peer port
    assert dict(transport.peers) == {
        "us-east": "10.0.0.1:7400",
        "eu-west": "[2001:db8::2]:7400",
        "ap-south": "kdsync-ap.example.com:7401",
    }
    assert transport.tls == MemberTlsFiles(
        ca_cert=tls_dir / "ca.pem", cert=tls_dir / "cert.pem", key=tls_dir / "key.pem"
    )
    assert not transport.insecure
    assert config.rdma_settings() is None  # TCP unless the config says rdma


def test_rdma_transport_settings_load(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    data["transport"] = {"type": "rdma", "rdma": {"device": "mlx5_0", "fallbackToTcp": True}}
    config = load_config(write(tmp_path, data))
    settings = config.rdma_settings()
    assert settings is not None
    assert (settings.device, settings.port, settings.gid_index) == ("mlx5_0", 1, None)
    assert settings.fallback_to_tcp
    # Two peers, 16 receive and 8 send buffers of 64 KiB each per link.
    assert settings.pinned_bytes(2) == 2 * 24 * 64 * 1024


def test_two_members_and_a_witness_load(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, two_plus_witness()))

    assert config.is_witness
    assert config.own_member.kafka is None
    assert [m.name for m in config.data_members] == ["us-east", "us-west"]
    assert [m.name for m in config.witnesses] == ["witness-1"]
    assert config.group_spec() == GroupSpec(
        members=("us-east", "us-west", "witness-1"), witnesses=frozenset({"witness-1"})
    )
    timing = config.timing()
    assert (timing.heartbeat_ticks, timing.election_ticks, timing.max_outbox) == (2, 30, 7)
    assert config.ordering.tick_ms == 10
    transport = config.transport_config()
    assert transport.insecure
    assert transport.tls is None
    assert transport.listen == "127.0.0.1:7402"
    assert transport.other_members() == ["us-east", "us-west"]


def test_models_accept_python_field_names_and_are_frozen() -> None:
    data = two_plus_witness()
    data["ordering"] = {"tick_ms": 5, "election_ticks": 12}
    config = SidecarConfig.model_validate(data)
    assert config.ordering.tick_ms == 5
    with pytest.raises(ValidationError):
        setattr(config, "group", "other")  # noqa: B010 - bypass static checks on purpose


def test_topic_selection() -> None:
    topics = TopicsConfig(names=("orders",), include=(r"pay\..*",), exclude=(r".*\.test",))
    assert topics.selects("orders")
    assert topics.selects("pay.eu")
    assert not topics.selects("pay.eu.test")  # excluded
    assert not topics.selects("payments")  # include patterns match whole names
    assert not topics.selects("pay.eu-global")  # a replicated topic is never a source
    assert not topics.selects("other")


def test_patterns_never_select_kdsync_topics() -> None:
    """Not even a catch-all pattern picks kdsync's own topics or any T-global."""
    topics = TopicsConfig(include=(".*",))
    assert topics.selects("orders")
    for name in (
        "kdsync-g.heartbeats",  # any group's heartbeats (the sidecar adds its own)
        "kdsync-g.log.internal",
        "kdsync-g.ledger.internal",
        "orders-global",
        "kdsync-g.heartbeats-global",
        "__consumer_offsets",  # Kafka's own
        "__transaction_state",
    ):
        assert not topics.selects(name), name


def test_listing_one_of_kafkas_own_topics_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"__consumer_offsets.*Kafka's own topics"):
        TopicsConfig(names=("orders", "__consumer_offsets"))


def test_tls_files_can_be_checked_later(tmp_path: Path) -> None:
    data = three_members(tmp_path / "nowhere")
    config = parse_config(data, check_files=False)
    assert config.tls is not None
    with pytest.raises(ConfigError, match=r"tls\.ca"):
        parse_config(data)


# -- every kind of mistake names its field and a fix -----------------------------------


def _set(path: str, value: Any) -> Callable[[Data], None]:
    """A mutation that sets (or, with value ``...``, deletes) a dotted path."""

    def mutate(data: Data) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is ...:
            del node[int(last) if last.isdigit() else last]
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


MISTAKES: dict[str, tuple[Callable[[Data], None], str, str]] = {
    # name: (mutation, path in the message, part of the fix)
    "duplicate member name": (
        _set("members.1.name", "us-east"),
        "members[1].name",
        "unique name",
    ),
    "duplicate peer address": (
        _set("members.2.peer", "10.0.0.1:7400"),
        "members[2].peer",
        "its own host:port",
    ),
    "a single member": (
        lambda d: d.update(members=d["members"][:1]),
        "members",
        "list every member",
    ),
    "as many witnesses as data members": (
        lambda d: d.update(
            members=[
                d["members"][0],
                {"name": "w", "peer": "10.0.0.9:7400", "witness": True},
            ]
        ),
        "members",
        "add a data member or remove a witness",
    ),
    "member not in members": (_set("member", "us-central"), "member", "set `member`"),
    "no topic selector": (
        _set("topics", {"exclude": ["x"]}),
        "topics",
        "`names:`",
    ),
    "bad regex": (
        _set("topics.include", ["ok", "(unclosed"]),
        "topics.include[1]",
        "regular expression",
    ),
    "source topic ends with suffix": (
        _set("topics.names", ["orders-global"]),
        "topics.names[0]",
        "list the source topic",
    ),
    "global topic name too long": (
        _set("topics.names", ["t" * 245]),
        "topics.names[0]",
        "shorten",
    ),
    "illegal topic name": (
        _set("topics.names", ["orders", "bad topic"]),
        "topics.names[1]",
        "legal Kafka topic name",
    ),
    "zero global partitions": (
        _set("topics.globalPartitions", 0),
        "topics.globalPartitions",
        ">= 1",
    ),
    "bad global suffix": (_set("topics.globalSuffix", "/g"), "topics.globalSuffix", "-global"),
    "no tls and not insecure": (_set("tls", ...), "tls", "insecure: true"),
    "tls and insecure": (_set("insecure", True), "insecure", "remove"),
    "tls file missing": (
        _set("tls.cert", "/does/not/exist/cert.pem"),
        "tls.cert",
        "PEM file",
    ),
    "tls path is a directory": (_set("tls.key", "/"), "tls.key", "PEM file"),
    "peer not host:port": (_set("members.0.peer", "10.0.0.1"), "members[0].peer", "host:port"),
    "ipv6 peer without brackets": (
        _set("members.1.peer", "2001:db8::2:7400"),
        "members[1].peer",
        "[::1]:7400",
    ),
    "peer port out of range": (
        _set("members.1.peer", "h:70000"),
        "members[1].peer",
        "host:port",
    ),
    "bad listen address": (_set("listen", "nowhere"), "listen", "host:port"),
    "number instead of string": (_set("http", 8080), "http", "quote the value"),
    "election not above two heartbeats": (
        _set("ordering", {"heartbeatTicks": 5, "electionTicks": 10}),
        "ordering.electionTicks",
        "at least 11",
    ),
    "non-positive tick": (_set("ordering", {"tickMs": 0}), "ordering.tickMs", ">= 1"),
    # A batch crosses the peer port as one frame (64 MiB at most): larger would fail there.
    "batch larger than a frame allows": (
        _set("ordering", {"maxBatchBytes": 100 * 1024 * 1024}),
        "ordering.maxBatchBytes",
        "<= 16777216",
    ),
    "witness with kafka": (
        _set("members.2.witness", True),
        "members[2].kafka",
        "remove the kafka section",
    ),
    "data member without kafka": (
        _set("members.1.kafka", ...),
        "members[1].kafka",
        "witness: true",
    ),
    "missing bootstrap servers": (
        _set("members.1.kafka", {"properties": {}}),
        "members[1].kafka.bootstrapServers",
        "add `bootstrapServers:`",
    ),
    "empty bootstrap servers": (
        _set("members.1.kafka.bootstrapServers", "a:1,,b:2"),
        "members[1].kafka.bootstrapServers",
        "host:port",
    ),
    "kdsync-owned property": (
        _set("members.0.kafka.properties", {"enable.auto.commit": "true"}),
        'members[0].kafka.properties["enable.auto.commit"]',
        "remove it from properties",
    ),
    "bad group name": (_set("group", "Orders_EU"), "group", "lower-case"),
    "bad member name": (_set("members.2.name", "-ap"), "members[2].name", "rename"),
    "missing group": (_set("group", ...), "group", "add `group:`"),
    "typo at top level": (_set("insecur", True), "insecur", "did you mean `insecure`?"),
    "typo in ordering": (
        _set("ordering", {"tickMS": 20}),
        "ordering.tickMS",
        "did you mean `tickMs`?",
    ),
    "typo in a member": (
        _set("members.0.wittness", True),
        "members[0].wittness",
        "did you mean `witness`?",
    ),
    "string instead of list": (_set("topics.names", "orders"), "topics.names", "a list"),
    "unknown transport": (_set("transport", {"type": "infiniband"}), "transport.type", "tcp"),
    "typo in rdma settings": (
        _set("transport", {"type": "rdma", "rdma": {"gidIdx": 1}}),
        "transport.rdma.gidIdx",
        "did you mean `gidIndex`?",
    ),
    "rdma buffer too small": (
        _set("transport", {"type": "rdma", "rdma": {"bufferBytes": 100}}),
        "transport.rdma.bufferBytes",
        "4096",
    ),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_mistake_names_field_and_fix(tmp_path: Path, tls_dir: Path, name: str) -> None:
    mutate, path, fix = MISTAKES[name]
    data = copy.deepcopy(three_members(tls_dir))
    mutate(data)
    error = load_error(tmp_path, data)
    text = str(error)
    paths = [problem.path for problem in error.problems]
    assert path in paths, text
    problem = error.problems[paths.index(path)]
    assert fix in problem.fix or fix in problem.problem, text
    assert f"{path}: " in text
    assert "fix: " in text
    assert "pydantic" not in text
    assert "Traceback" not in text


def test_owned_property_message_says_why(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    data["members"][0]["kafka"]["properties"] = {"transactional.id": "mine", "group.id": "g"}
    text = str(load_error(tmp_path, data))
    assert 'properties["transactional.id"]' in text
    assert "fences" in text  # why kdsync owns it
    assert 'properties["group.id"]' in text


def test_bad_regex_names_pattern_and_regex_error(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    data["topics"]["exclude"] = ["a[b"]
    text = str(load_error(tmp_path, data))
    assert "topics.exclude[0]" in text
    assert "'a[b'" in text
    assert "unterminated character set" in text


def test_unreadable_tls_file(tmp_path: Path, tls_dir: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read any file")
    (tls_dir / "key.pem").chmod(0)
    text = str(load_error(tmp_path, three_members(tls_dir)))
    assert "tls.key" in text
    assert "not readable" in text


def test_every_field_problem_is_reported_at_once(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    data["group"] = "BAD"
    data["members"][0]["peer"] = "nope"
    data["topics"]["globalPartitions"] = -1
    data["ordering"] = {"maxOutbox": 0}
    error = load_error(tmp_path, data)
    assert [p.path for p in error.problems] == [
        "group",
        "members[0].peer",
        "topics.globalPartitions",
        "ordering.maxOutbox",
    ]
    assert str(error).startswith(f"{tmp_path / 'kdsync.yaml'}: 4 problems\n")


def test_group_rules_are_reported_alongside_field_problems(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    data["members"][0]["peer"] = "nope"  # a field problem
    data["members"][2]["name"] = "eu-west"  # a duplicate
    data["member"] = "us-central"
    del data["tls"]
    error = load_error(tmp_path, data)
    assert [p.path for p in error.problems] == [
        "members[0].peer",
        "members[2].name",
        "member",
        "tls",
    ]


# -- the admin listener ----------------------------------------------------------------


def test_an_admin_listener_loads_with_tls(tmp_path: Path, tls_dir: Path) -> None:
    data = three_members(tls_dir)
    assert load_config(write(tmp_path, data)).admin is None, "off by default"
    data["admin"] = {"listen": "0.0.0.0:8443"}
    config = load_config(write(tmp_path, data))
    assert config.admin is not None and config.admin.listen == "0.0.0.0:8443"
    data["admin"] = {"listen": "[::]:8443"}
    assert load_config(write(tmp_path, data)).admin is not None


@pytest.mark.parametrize(
    ("admin", "path", "phrase"),
    [
        ({"listen": "nonsense"}, "admin.listen", "not host:port"),
        ({"listen": "0.0.0.0:0"}, "admin.listen", "port 0"),
        ({"listen": "::1:8443"}, "admin.listen", "brackets"),
        ({}, "admin.listen", ""),
        ({"listen": "0.0.0.0:8443", "port": 8443}, "admin.port", ""),
    ],
)
def test_a_bad_admin_section_is_named(
    tmp_path: Path, tls_dir: Path, admin: Data, path: str, phrase: str
) -> None:
    data = three_members(tls_dir)
    data["admin"] = admin
    error = load_error(tmp_path, data)
    assert [p.path for p in error.problems] == [path], str(error)
    assert phrase in error.problems[0].problem, str(error)


def test_an_admin_listener_without_tls_is_refused(tmp_path: Path) -> None:
    data = two_plus_witness()  # insecure peer links
    data["admin"] = {"listen": "127.0.0.1:8443"}
    error = load_error(tmp_path, data)
    assert [p.path for p in error.problems] == ["admin"], str(error)
    problem = error.problems[0]
    assert "needs the tls section" in problem.problem and "insecure" in problem.problem
    assert "add `tls:" in problem.fix and "remove the admin section" in problem.fix
    # Also reported next to field problems (the rules then run on the raw data).
    data["ordering"] = {"tickMs": 0}
    paths = [p.path for p in load_error(tmp_path, data).problems]
    assert "admin" in paths and "ordering.tickMs" in paths


# -- file-level problems ---------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(tmp_path / "absent.yaml")
    assert "--config" in str(info.value)


def test_yaml_syntax_error_reports_line(tmp_path: Path) -> None:
    text = "group: orders\nmember: a\nmembers:\n  - name: a\n   peer: [unclosed\n"
    error = load_error(tmp_path, text)
    assert len(error.problems) == 1
    assert error.problems[0].path.startswith("line 5, column")
    assert "not valid YAML" in str(error)


def test_duplicate_yaml_key_is_rejected(tmp_path: Path) -> None:
    text = "group: orders\nmember: a\ngroup: other\n"
    error = load_error(tmp_path, text)
    assert error.problems[0].path.startswith("line 3,")
    assert "duplicate key 'group'" in str(error)


@pytest.mark.parametrize(
    ("text", "phrase"),
    [("- a\n- b\n", "got a list"), ("just text\n", "got the string"), ("", "empty")],
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, phrase: str) -> None:
    error = load_error(tmp_path, text)
    assert error.problems[0].path == "(top level)"
    assert phrase in str(error)


def test_yaml_boolean_keys_are_reported(tmp_path: Path) -> None:
    error = load_error(tmp_path, "group: orders\nmembers:\n  - name: a\n    on: 1\n")
    assert error.problems[0].path == "members[0].True"
    assert "quote the key" in str(error)


def test_format_path() -> None:
    assert format_path(("members", 1, "kafka", "bootstrapServers")) == (
        "members[1].kafka.bootstrapServers"
    )
    assert format_path(("properties", "sasl.mechanism")) == 'properties["sasl.mechanism"]'
    assert format_path(()) == "(top level)"


def test_members_share_an_agreement_that_leaves_addresses_out(
    tmp_path: Path, tls_dir: Path
) -> None:
    """What the peer handshake compares: the member list and the topic settings, the same
    whichever member's file it comes from, whatever address each member dials."""
    data = three_members(tls_dir)
    ours = load_config(write(tmp_path, data)).transport_config().agreement
    assert ours["members"] == [["us-east", False], ["eu-west", False], ["ap-south", False]]
    assert ours["topics"]["globalSuffix"] == "-global"
    assert ours["topics"]["globalPartitions"] == 1

    other = copy.deepcopy(data)
    other["member"] = "eu-west"
    other["members"][2]["peer"] = "127.0.0.1:9999"  # e.g. through a proxy
    assert load_config(write(tmp_path, other)).transport_config().agreement == ours

    other["topics"]["globalPartitions"] = 3
    assert load_config(write(tmp_path, other)).transport_config().agreement != ours
