"""Carry out a fault schedule against a real group under steady traffic, then check it.

The set-up (all on loopback, all started and stopped here):

- three one-node Kafka clusters (:class:`kdsync.localkafka.LocalKafkaFleet`), each with an
  extra ``SIDECAR`` listener that advertises a toxiproxy address: the member's sidecar
  bootstraps through that proxy and every connection it opens to its broker passes it;
- one toxiproxy per ordered pair of members: member A dials B through proxy ``A>B``, which
  carries only A's frames to B (the transport uses one connection per direction), so a
  one-way partition is a toxic on one proxy;
- a :class:`kdsync.local_group.LocalSidecarGroup` of three sidecars with mutual TLS;
- :class:`kdsync.verification.traffic.Traffic` producing into every origin ``T`` directly
  (not through a proxy), and the independent checker reading every ``T-global`` directly.

Each fault of the schedule is injected, held, healed; then the campaign waits until every
member is ready and every ``T-global`` holds every event acknowledged before the heal, and
records that time as the fault's recovery time. At the end the traffic stops and
:func:`kdsync.verification.group_check.verify_group` checks agreement, exactly-once, no
loss, origin order and fidelity over everything written, and the Spark audit
(``kdsync audit``, loaded only then) checks the same topics a second, independent way.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kdsync import naming
from kdsync.audit.in_process import AuditUnavailable, audit_to_report
from kdsync.chaos.schedule import LEADER, Fault, FaultKind, ScheduleSettings, generate_schedule
from kdsync.chaos.toxiproxy import ToxiproxyServer
from kdsync.local_group import LocalSidecarGroup
from kdsync.localkafka import LocalKafkaFleet
from kdsync.localkafka.config import allocate_ports
from kdsync.localkafka.fleet import ClusterSpec
from kdsync.verification.group_check import (
    GlobalWatch,
    VerificationFailed,
    WaitTimeout,
    verify_group,
)
from kdsync.verification.traffic import PARTITIONS, Traffic, TrafficError

logger = logging.getLogger(__name__)

SIDECAR_LISTENER = "SIDECAR"
MEMBERS = ("m1", "m2", "m3")


@dataclass(frozen=True)
class CampaignSettings:
    seed: int
    faults: int
    run_dir: Path
    schedule: ScheduleSettings | None = None  # default: every kind, MEMBERS
    rate_per_origin: float = 20.0  # events/s into each origin T
    recovery_timeout_s: float = 120.0  # a heal not recovered by then is a violation
    settle_s: float = 2.0  # quiet traffic between recovery and the next fault
    verify_timeout_s: float = 240.0
    audit: bool = True  # run the Spark audit after the independent checker

    def schedule_settings(self) -> ScheduleSettings:
        return self.schedule or ScheduleSettings(members=MEMBERS, faults=self.faults)


@dataclass
class FaultOutcome:
    fault: str
    kind: str
    targets: list[str]
    hold_s: float
    injected_at_s: float  # since the campaign's traffic started
    acked_at_heal: int
    recovery_s: float | None  # None: did not recover in time (a violation)
    # Largest resident memory of each sidecar sampled while the fault was held, MiB.
    peak_rss_mib: dict[str, float] = field(default_factory=dict)


@dataclass
class CampaignReport:
    seed: int
    schedule: list[str]
    events_written: int = 0
    events_checked: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    outcomes: list[FaultOutcome] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    harness_problems: list[str] = field(default_factory=list)
    # Sidecars that stopped themselves on purpose (e.g. their broker unreachable for longer
    # than a timeout) and were restarted, as Kubernetes would: availability, not safety.
    unplanned_exits: list[str] = field(default_factory=list)
    # The Spark audit's verdict: "passed", "violations", "could not run", or "not run".
    audit: str = "not run"
    audit_report: str | None = None  # its JSON report
    duration_s: float = 0.0

    @property
    def peak_rss_mib(self) -> dict[str, float]:
        """Per kind: the largest sidecar resident memory seen while such a fault was held."""
        peaks: dict[str, float] = {}
        for outcome in self.outcomes:
            for rss in outcome.peak_rss_mib.values():
                peaks[outcome.kind] = max(rss, peaks.get(outcome.kind, 0.0))
        return dict(sorted(peaks.items()))

    @property
    def recovery_figures(self) -> dict[str, dict[str, float]]:
        """Per kind: recoveries' max and mean in seconds."""
        by_kind: dict[str, list[float]] = {}
        for outcome in self.outcomes:
            if outcome.recovery_s is not None:
                by_kind.setdefault(outcome.kind, []).append(outcome.recovery_s)
        return {
            kind: {"max": round(max(v), 2), "mean": round(sum(v) / len(v), 2), "n": len(v)}
            for kind, v in sorted(by_kind.items())
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["recovery"] = self.recovery_figures
        data["peak_rss_mib"] = self.peak_rss_mib
        data["ok"] = not self.violations
        return data

    def summary(self) -> str:
        lines = [
            f"seed {self.seed}: {len(self.outcomes)} faults in {self.duration_s:.0f}s, "
            f"{self.events_written} events written, {self.events_checked} checked, "
            f"{len(self.violations)} violation(s)",
            "faults by kind: "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.faults_by_kind.items())),
            "recovery after heal (s): "
            + ", ".join(
                f"{k} max {v['max']} mean {v['mean']}" for k, v in self.recovery_figures.items()
            ),
        ]
        lines.append(
            "peak sidecar RSS while held (MiB): "
            + ", ".join(f"{k} {v}" for k, v in self.peak_rss_mib.items())
        )
        lines.append(
            f"Spark audit: {self.audit}"
            + (f" (report {self.audit_report})" if self.audit_report else "")
        )
        lines += [f"unplanned exit (restarted): {e}" for e in self.unplanned_exits]
        lines += [f"VIOLATION: {v}" for v in self.violations]
        return "\n".join(lines)


def _proxy(viewer: str, member: str) -> str:
    return f"peer-{viewer}-to-{member}"


def _broker_proxy(member: str) -> str:
    return f"broker-{member}"


class Campaign:
    """One campaign: ``run()`` sets everything up, carries out the schedule, checks, tears
    down, and returns the report."""

    def __init__(self, settings: CampaignSettings) -> None:
        self.settings = settings
        self.schedule_settings = settings.schedule_settings()
        self.members = self.schedule_settings.members
        self.schedule = generate_schedule(settings.seed, self.schedule_settings)
        self.report = CampaignReport(settings.seed, [f.describe() for f in self.schedule])
        self._fleet: LocalKafkaFleet | None = None
        self._proxies: ToxiproxyServer | None = None
        self._group: LocalSidecarGroup | None = None
        self._traffic: Traffic | None = None
        self._watch: GlobalWatch | None = None
        self._direct: dict[str, str] = {}
        self._started = 0.0
        self._cleanups: list[Callable[[], object]] = []

    # -- the whole run -------------------------------------------------------------------

    def run(self, progress: Callable[[str], None] = print) -> CampaignReport:
        began = time.monotonic()
        try:
            self._set_up(progress)
            self._carry_out(progress)
            self._final_check(progress)
            if self.settings.audit:
                self._spark_audit(progress)
        finally:
            self.report.duration_s = round(time.monotonic() - began, 1)
            self._tear_down()
        return self.report

    def _set_up(self, progress: Callable[[str], None]) -> None:
        run_dir = self.settings.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        members = self.members
        pairs = [(a, b) for a in members for b in members if a != b]
        ports = iter(allocate_ports(len(members) + len(pairs)))
        broker_front = {m: f"127.0.0.1:{next(ports)}" for m in members}
        routes = {a: {} for a in members}  # type: dict[str, dict[str, str]]
        for a, b in pairs:
            routes[a][b] = f"127.0.0.1:{next(ports)}"

        progress(f"starting {len(members)} Kafka clusters")
        self._fleet = LocalKafkaFleet(
            [
                ClusterSpec(
                    f"chaos-{m}",
                    extra_listeners={SIDECAR_LISTENER: "PLAINTEXT"},
                    advertised={SIDECAR_LISTENER: broker_front[m]},
                )
                for m in members
            ],
            run_root=run_dir / "kafka",
        )
        self._cleanups.append(self._fleet.close)
        # Generous: on a loaded machine three JVMs can take minutes to become ready.
        self._fleet.start(timeout=300)
        self._direct = {m: self._fleet[f"chaos-{m}"].bootstrap_servers for m in members}

        self._proxies = ToxiproxyServer(run_dir / "toxiproxy.log")
        self._cleanups.append(self._proxies.close)
        self._proxies.start()
        for m in members:
            upstream = self._fleet[f"chaos-{m}"].listener_address(SIDECAR_LISTENER)
            self._proxies.create_proxy(_broker_proxy(m), broker_front[m], upstream)

        topic = f"chaos-{uuid.uuid4().hex[:8]}"
        for servers in self._direct.values():
            _create_topic(servers, topic, PARTITIONS)
        self.topic = topic
        self.global_topic = naming.global_topic(topic)

        group_name = f"chaos-{self.settings.seed % 100000}-{uuid.uuid4().hex[:6]}"
        self._group = LocalSidecarGroup(
            group_name,
            broker_front,
            run_dir / "group",
            topics={"names": [topic], "globalPartitions": 1},
            ordering={"tickMs": 20},
            peer_routes=routes,
        )
        self._cleanups.append(self._group.close)
        for a, b in pairs:
            self._proxies.create_proxy(_proxy(a, b), routes[a][b], self._group.members[b].peer)

        progress(f"starting sidecars {', '.join(members)} (group {group_name})")
        self._group.start()
        self._group.wait_ready(timeout=120)
        self._watch = GlobalWatch(self._direct, self.global_topic)
        self._cleanups.append(self._watch.close)
        self._traffic = Traffic(self._direct, topic, rate_per_origin=self.settings.rate_per_origin)
        self._started = time.monotonic()
        self._traffic.start()
        traffic = self._traffic
        self._cleanups.append(lambda: traffic.stop(30))

    def _tear_down(self) -> None:
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:
                logger.exception("tearing down the campaign")
        self._cleanups.clear()

    # -- faults --------------------------------------------------------------------------

    def _carry_out(self, progress: Callable[[str], None]) -> None:
        assert self._group is not None and self._traffic is not None
        kinds: Counter[str] = Counter()
        for fault in self.schedule:
            targets = self._resolve(fault)
            progress(f"inject {fault.describe()} -> {','.join(targets)}")
            injected_at = time.monotonic() - self._started
            self._inject(fault, targets)
            kinds[fault.kind.value] += 1
            hold_until = time.monotonic() + fault.hold_s
            peak_rss: dict[str, float] = {}
            while time.monotonic() < hold_until:
                self._check_processes(
                    f"during {fault.describe()}",
                    targets if fault.kind is FaultKind.KILL_SIDECAR else (),
                )
                for name, rss in self._rss_mib().items():
                    peak_rss[name] = max(rss, peak_rss.get(name, 0.0))
                time.sleep(0.5)  # the fault's hold time: the schedule's, not a synchronisation
            self._heal(fault, targets)
            acked = self._traffic.total
            healed = time.monotonic()
            recovered = self._wait_recovered(acked, f"after {fault.describe()}")
            recovery = round(time.monotonic() - healed, 2) if recovered else None
            if recovery is None:
                self.report.violations.append(
                    f"{fault.describe()}: not recovered {self.settings.recovery_timeout_s:.0f}s "
                    f"after the heal (every member ready with the {acked} events acknowledged "
                    f"before it); {self._brief()}"
                )
            self.report.outcomes.append(
                FaultOutcome(
                    fault.describe(),
                    fault.kind.value,
                    list(targets),
                    fault.hold_s,
                    round(injected_at, 1),
                    acked,
                    recovery,
                    peak_rss,
                )
            )
            progress(
                f"  healed; recovered in {recovery}s" if recovery is not None else "  NOT recovered"
            )
            settle_until = time.monotonic() + self.settings.settle_s
            while time.monotonic() < settle_until:
                time.sleep(0.2)  # steady traffic between faults, as scheduled
        self.report.faults_by_kind = dict(kinds)

    def _resolve(self, fault: Fault) -> tuple[str, ...]:
        if fault.targets != (LEADER,):
            return fault.targets
        assert self._group is not None
        votes: Counter[str] = Counter()
        for name in self.members:
            status = self._group.status(name) or {}
            leader = status.get("leader")
            if isinstance(leader, str) and leader in self.members:
                votes[leader] += 1
        if not votes:
            return (self.members[fault.index % len(self.members)],)
        return (votes.most_common(1)[0][0],)

    def _inject(self, fault: Fault, targets: tuple[str, ...]) -> None:
        assert self._group is not None and self._proxies is not None and self._fleet is not None
        proxies, kind = self._proxies, fault.kind

        def others(member: str) -> list[str]:
            return [o for o in self.members if o != member]

        if kind is FaultKind.KILL_SIDECAR:
            self._group.kill(targets[0])
        elif kind is FaultKind.PAUSE_SIDECAR:
            self._group.pause(targets[0])
        elif kind is FaultKind.KILL_BROKER:
            self._fleet[f"chaos-{targets[0]}"].kill()
        elif kind in (FaultKind.ISOLATE_MEMBER, FaultKind.ISOLATE_LEADER):
            member = targets[0]
            for other in others(member):
                proxies.set_enabled(_proxy(member, other), False)
                proxies.set_enabled(_proxy(other, member), False)
        elif kind is FaultKind.SPLIT_ALL:
            for a in self.members:
                for b in others(a):
                    proxies.set_enabled(_proxy(a, b), False)
        elif kind is FaultKind.ONE_WAY:
            sender, receiver = targets
            # Frames from sender to receiver travel only on the connection sender dials.
            proxies.add_toxic(
                _proxy(sender, receiver), "one-way", "timeout", "upstream", {"timeout": 0}
            )
        elif kind is FaultKind.PEER_LATENCY:
            for a in self.members:
                for b in others(a):
                    proxies.add_toxic(
                        _proxy(a, b),
                        "latency",
                        "latency",
                        "upstream",
                        {"latency": fault.param("latency_ms"), "jitter": fault.param("jitter_ms")},
                    )
        elif kind is FaultKind.PEER_BANDWIDTH:
            for other in others(targets[0]):
                proxies.add_toxic(
                    _proxy(targets[0], other),
                    "bandwidth",
                    "bandwidth",
                    "upstream",
                    {"rate": fault.param("rate_kbps")},
                )
        elif kind is FaultKind.SLOW_BROKER:
            name = _broker_proxy(targets[0])
            for stream in ("upstream", "downstream"):
                proxies.add_toxic(
                    name,
                    f"latency-{stream}",
                    "latency",
                    stream,
                    {"latency": fault.param("latency_ms")},
                )
                proxies.add_toxic(
                    name,
                    f"bandwidth-{stream}",
                    "bandwidth",
                    stream,
                    {"rate": fault.param("rate_kbps")},
                )
        elif kind is FaultKind.STALLED_BROKER:
            name = _broker_proxy(targets[0])
            for stream in ("upstream", "downstream"):
                proxies.add_toxic(name, f"stall-{stream}", "timeout", stream, {"timeout": 0})
        elif kind is FaultKind.BROKER_CUT:
            proxies.set_enabled(_broker_proxy(targets[0]), False)
        else:  # pragma: no cover - every kind is handled above
            raise AssertionError(f"unhandled fault kind {kind}")

    def _heal(self, fault: Fault, targets: tuple[str, ...]) -> None:
        assert self._group is not None and self._proxies is not None and self._fleet is not None
        self._proxies.reset()
        if fault.kind is FaultKind.KILL_SIDECAR:
            self._group.start_member(targets[0])
        elif fault.kind is FaultKind.PAUSE_SIDECAR:
            self._group.resume(targets[0])
        elif fault.kind is FaultKind.KILL_BROKER:
            broker = self._fleet[f"chaos-{targets[0]}"]
            broker.start()
            broker.wait_ready(timeout=120)

    def _check_processes(self, when: str, spared: tuple[str, ...] = ()) -> None:
        """Restart a sidecar that exited on its own (not one the schedule killed), as a
        process supervisor would. A deliberate stop (its last error line says "sidecar
        stopping: <reason>", e.g. its broker unreachable past a timeout) is reported as an
        unplanned exit; anything else (a crash) is a violation."""
        assert self._group is not None
        for name, member in self._group.members.items():
            if member.running or name in spared:
                continue
            code = member.process.returncode if member.process else None
            reason = stop_reason(member.log_path)
            if reason is not None:
                self.report.unplanned_exits.append(f"{when}: {name} (code {code}): {reason}")
            else:
                self.report.violations.append(
                    f"{when}: sidecar {name} crashed (code {code}); see {member.log_path}"
                )
            self._group.start_member(name)

    def _rss_mib(self) -> dict[str, float]:
        assert self._group is not None
        out: dict[str, float] = {}
        for name, member in self._group.members.items():
            if member.process is None or not member.running:
                continue
            try:
                status = Path(f"/proc/{member.process.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = round(int(line.split()[1]) / 1024, 1)
        return out

    def _wait_recovered(self, acked: int, when: str) -> bool:
        assert self._group is not None and self._watch is not None
        deadline = time.monotonic() + self.settings.recovery_timeout_s
        while time.monotonic() < deadline:
            self._check_processes(when)
            ready = all((self._group.status(m) or {}).get("ready") is True for m in self.members)
            if ready and all(self._watch.count(m) >= acked for m in self.members):
                return True
            time.sleep(0.2)  # polling interval of a condition with a deadline
        return False

    def _brief(self) -> str:
        assert self._group is not None and self._watch is not None
        out: dict[str, Any] = {}
        for name in self.members:
            status = self._group.status(name) or {}
            out[name] = {
                "ready": status.get("ready"),
                "reasons": status.get("notReadyReasons"),
                "role": status.get("role"),
                "global": len(self._watch.followers[name].records),
            }
        return json.dumps(out)

    # -- the end -------------------------------------------------------------------------

    def _final_check(self, progress: Callable[[str], None]) -> None:
        assert self._traffic is not None and self._group is not None
        progress("stopping traffic; checking every T-global against every T")
        try:
            produced = self._traffic.stop()
        except TrafficError as error:
            # The harness's producer gave up on a record (not kdsync's doing); check the rest.
            self.report.harness_problems.append(str(error))
            produced = dict(self._traffic.acked)
        self.report.events_written = sum(produced.values())
        try:
            result = verify_group(
                self._direct,
                self.topic,
                self.global_topic,
                produced,
                timeout=self.settings.verify_timeout_s,
                watch=self._watch,
                describe_status=self._brief,
            )
            self.report.events_checked = result.events
        except (VerificationFailed, WaitTimeout) as failure:
            self.report.violations.append(f"final check: {failure}")

    def _spark_audit(self, progress: Callable[[str], None]) -> None:
        """``kdsync audit`` over every member's T-global and T, as a user would run it after
        a failover drill: a second check, by Spark, independent of the one above."""
        assert self._group is not None
        progress("Spark audit (kdsync audit) over every T-global and T")
        report = self.settings.run_dir / "audit-report.json"
        config = self._group.members[self.members[0]].config_path
        try:
            code = audit_to_report(config, report)
        except AuditUnavailable as error:
            self.report.audit = "could not run"
            self.report.violations.append(f"Spark audit: not available ({error})")
            return
        self.report.audit_report = str(report)
        if code == 0:
            self.report.audit = "passed"
        elif code == 1:
            self.report.audit = "violations"
            self.report.violations.append(f"Spark audit: violations found; see {report}")
        else:
            self.report.audit = "could not run"
            self.report.violations.append(
                f"Spark audit: could not run (exit {code}; its stderr line says why)"
            )


def stop_reason(log_path: Path) -> str | None:
    """The reason of the sidecar's deliberate stop at the end of its log (the file is
    appended to across restarts: only the last run, back to its "running" line, counts),
    or None when that run ended otherwise or logged a traceback after its stop line."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if "Traceback" in line:
            return None
        marker = "sidecar stopping: "
        if marker in line:
            return line.split(marker, 1)[1].strip()
        if "kdsync.runtime.sidecar: member " in line and " running " in line:
            return None  # the start of the last run: it logged no stop
    return None


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    for future in futures.values():
        future.result(timeout=60)


def write_report(report: CampaignReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
