"""A kdsync group of sidecar processes on this machine (local mode, tests and the demo).

Writes one config per member (mutual TLS from a group CA made on the spot), starts each
sidecar as ``python -m kdsync.cli run --config ...`` tied to this process (it dies with
us), and offers what fault-injection tests need: SIGKILL, SIGTERM, restart, status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from kdsync.localkafka.config import allocate_ports
from kdsync.localkafka.process import spawn_tied_to_parent
from kdsync.pki import make_group_pki
from kdsync.transport.identity import MemberTlsFiles

# A shorter tick than a sidecar's default (50 ms): local groups serve tests and benchmarks.
DEFAULT_ORDERING: Mapping[str, Any] = {"tickMs": 20}


@dataclass
class LocalMember:
    name: str
    witness: bool
    config_path: Path
    log_path: Path
    http: str
    peer: str = ""  # where this member's peer listener binds
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalSidecarGroup:
    def __init__(
        self,
        group: str,
        clusters: Mapping[str, str],
        run_dir: Path,
        *,
        witnesses: Sequence[str] = (),
        topics: Mapping[str, Any] | None = None,
        ordering: Mapping[str, Any] | None = None,
        member_order: Sequence[str] | None = None,
        peer_routes: Mapping[str, Mapping[str, str]] | None = None,
        kafka_properties: Mapping[str, Mapping[str, str]] | None = None,
        group_offset_sync: Mapping[str, Any] | None = None,
        transport: Mapping[str, Any] | None = None,
    ) -> None:
        """``clusters``: data member name -> bootstrap servers of its Kafka cluster;
        ``kafka_properties``: data member -> its ``kafka.properties`` (e.g. SASL_SSL);
        ``group_offset_sync``: every member's ``groupOffsetSync`` section; ``transport``
        every member's ``transport`` section (e.g. ``{"type": "rdma"}``).

        ``peer_routes`` (member -> other member -> address) makes each member dial the others
        at those addresses (proxies, in the fault campaigns) while it listens on its own
        port; without it every member dials the others' listeners directly."""
        self.group = group
        self.run_dir = run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        names = list(member_order) if member_order else [*clusters, *witnesses]
        ports = allocate_ports(2 * len(names))
        tls = make_group_pki(group, names, run_dir / "pki")
        members_yaml = [
            {"name": name, "peer": f"127.0.0.1:{ports[2 * i]}", "witness": True}
            if name in witnesses
            else {
                "name": name,
                "peer": f"127.0.0.1:{ports[2 * i]}",
                "kafka": {
                    "bootstrapServers": clusters[name],
                    **(
                        {"properties": dict(kafka_properties[name])}
                        if kafka_properties and name in kafka_properties
                        else {}
                    ),
                },
            }
            for i, name in enumerate(names)
        ]
        self.members: dict[str, LocalMember] = {}
        self._members_yaml = members_yaml
        self._settings: dict[str, Any] = {
            "topics": dict(topics or {"names": ["orders"]}),
            "allowMembershipChanges": True,  # kdsync members, from this host only
            "ordering": dict(ordering or DEFAULT_ORDERING),
        }
        if group_offset_sync:
            self._settings["groupOffsetSync"] = dict(group_offset_sync)
        if transport:
            self._settings["transport"] = dict(transport)
        for i, name in enumerate(names):
            routes = (peer_routes or {}).get(name, {})
            self._add_member(
                name, name in witnesses, tls[name], ports[2 * i], ports[2 * i + 1], routes
            )

    def _add_member(
        self,
        name: str,
        witness: bool,
        files: MemberTlsFiles,
        peer_port: int,
        http_port: int,
        routes: Mapping[str, str],
    ) -> LocalMember:
        http = f"127.0.0.1:{http_port}"
        peer = f"127.0.0.1:{peer_port}"
        config: dict[str, Any] = {
            "group": self.group,
            "member": name,
            "members": [
                {**entry, "peer": routes[str(entry["name"])]} if entry["name"] in routes else entry
                for entry in self._members_yaml
            ],
            "tls": {"ca": str(files.ca_cert), "cert": str(files.cert), "key": str(files.key)},
            "http": http,
            **self._settings,
        }
        if routes:
            config["listen"] = peer
        path = self.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        member = LocalMember(name, witness, path, self.run_dir / f"{name}.log", http, peer)
        self.members[name] = member
        return member

    def add_witness(self, name: str) -> LocalMember:
        """Write the config of a new witness, to join the running group with
        ``kdsync members add NAME --witness`` once started: its file names the members
        of the startup files and itself (with a certificate from the group's CA)."""
        return self._new_member(name, {"witness": True})

    def add_data_member(self, name: str, bootstrap_servers: str) -> LocalMember:
        """Write the config of a new data member on the cluster at ``bootstrap_servers``,
        to join with ``kdsync members add NAME --member-config FILE --peer ...`` (which
        seeds its cluster; start it only then): its file names every member of the startup
        files, with their Kafka (the backfill copies from one of them), and itself."""
        return self._new_member(name, {"kafka": {"bootstrapServers": bootstrap_servers}})

    def _new_member(self, name: str, entry: Mapping[str, Any]) -> LocalMember:
        if name in self.members:
            raise ValueError(f"{name} is a member of the group already")
        peer_port, http_port = allocate_ports(2)
        self._members_yaml = [
            *self._members_yaml,
            {"name": name, "peer": f"127.0.0.1:{peer_port}", **entry},
        ]
        names = [str(e["name"]) for e in self._members_yaml]
        files = make_group_pki(self.group, names, self.run_dir / "pki")[name]
        witness = bool(entry.get("witness"))
        return self._add_member(name, witness, files, peer_port, http_port, {})

    # -- processes ---------------------------------------------------------------------

    def start(self, names: Sequence[str] | None = None) -> None:
        for name in names or list(self.members):
            self.start_member(name)

    def start_member(self, name: str) -> None:
        member = self.members[name]
        if member.running:
            return
        if member.log_file is not None:
            member.log_file.close()
        member.log_file = member.log_path.open("ab")
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        member.process = spawn_tied_to_parent(
            [sys.executable, "-m", "kdsync.cli", "run", "--config", str(member.config_path)],
            log_file=member.log_file,
            cwd=self.run_dir,
            env=env,
        )

    def kill(self, name: str) -> None:
        """SIGKILL: the sidecar gets no chance to finish anything."""
        member = self.members[name]
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(signal.SIGKILL)
            member.process.wait(timeout=30)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process freezes mid-step, sockets open, as a paused VM does."""
        member = self.members[name]
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        """SIGCONT after ``pause``."""
        member = self.members[name]
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(signal.SIGCONT)

    def stop(self, name: str, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait: the graceful path. Returns the exit code."""
        member = self.members[name]
        if member.process is None:
            return None
        if member.process.poll() is None:
            member.process.send_signal(signal.SIGTERM)
            try:
                member.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(timeout=30)
        return member.process.returncode

    def close(self) -> None:
        for name in self.members:
            self.resume(name)  # a paused process would ignore SIGTERM until the timeout
            self.stop(name, timeout=20)
            log_file = self.members[name].log_file
            if log_file is not None:
                log_file.close()

    def __enter__(self) -> LocalSidecarGroup:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- observation -------------------------------------------------------------------

    def status(self, name: str, timeout: float = 2.0) -> dict[str, Any] | None:
        member = self.members[name]
        try:
            with urllib.request.urlopen(f"http://{member.http}/status", timeout=timeout) as r:
                data: dict[str, Any] = json.loads(r.read())
                return data
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_until(
        self, what: str, condition: Any, timeout: float, names: Sequence[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Poll each member's /status until ``condition(status)`` holds for all of them."""
        deadline = time.monotonic() + timeout
        chosen = list(names or self.members)
        last: dict[str, dict[str, Any]] = {}
        while True:
            done = True
            for name in chosen:
                if not self.members[name].running:
                    raise RuntimeError(f"sidecar {name} exited; see {self.members[name].log_path}")
                status = self.status(name)
                if status is None or not condition(status):
                    done = False
                if status is not None:
                    last[name] = status
            if done:
                return last
            if time.monotonic() > deadline:
                summary = {n: _brief(last.get(n)) for n in chosen}
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}: {summary}")
            time.sleep(0.2)  # polling interval of a condition with a deadline

    def wait_ready(self, timeout: float = 90.0, names: Sequence[str] | None = None) -> None:
        self.wait_until("ready", lambda s: s.get("ready") is True, timeout, names)

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.members[name].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _brief(status: Mapping[str, Any] | None) -> str:
    if status is None:
        return "no answer"
    keys = ("phase", "role", "ready", "notReadyReasons", "appliedIndex", "eventsOut", "halted")
    return json.dumps({k: status.get(k) for k in keys})
