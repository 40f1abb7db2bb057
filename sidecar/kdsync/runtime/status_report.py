"""``kdsync status``: fetch /status from sidecars and print a readable summary."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from kdsync.group_configuration import describe_configuration, newest_configuration


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    target = url.rstrip("/")
    if not target.startswith(("http://", "https://")):
        target = f"http://{target}"
    if not target.endswith("/status"):
        target += "/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            data: dict[str, Any] = json.loads(response.read())
            return data
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"url": url, "unreachable": str(getattr(exc, "reason", exc))}


def _ms(value: object) -> str:
    return "-" if value is None else f"{float(value):.0f} ms"  # type: ignore[arg-type]


def render(statuses: Sequence[Mapping[str, Any]]) -> str:
    lines: list[str] = []
    groups = {s.get("group") for s in statuses if "group" in s}
    if groups:
        lines.append(f"group {', '.join(sorted(str(g) for g in groups))}")
    newest = newest_configuration(statuses)
    if newest is not None:
        lines.append(f"members {describe_configuration(newest)}")
    header = f"{'member':<14}{'role':<11}{'term':>6}  {'ready':<6}{'applied':>9}{'lag':>7}"
    header += f"{'events in':>11}{'events out':>12}  {'latency p50/p99':<18} notes"
    lines.append(header)
    for s in statuses:
        if "unreachable" in s:
            lines.append(f"{s['url']:<14}unreachable: {s['unreachable']}")
            continue
        lag_map = s.get("memberLag") or {}
        lag = lag_map.get(s["member"], 0)
        latency = s.get("latencyMs") or {}
        notes: list[str] = []
        if s.get("witness"):
            notes.append("witness")
        if s.get("halted"):
            notes.append(f"HALTED: {s['halted']}")
        for source in s.get("stoppedSources") or {}:
            notes.append(f"SOURCE STOPPED: {source} (see lastSourceError)")
        if s.get("fatal"):
            notes.append(f"FAILED: {s['fatal']}")
        sync = s.get("groupOffsetSync")
        if sync:
            note = f"group sync: {sync.get('inStep', 0)}/{sync.get('groups', 0)} in step"
            if sync.get("waiting"):
                note += f", waiting: {', '.join(sorted(sync['waiting']))}"
            if sync.get("errors"):
                note += f" (errors: {sync.get('lastError')})"
            notes.append(note)
        fallback = (s.get("transport") or {}).get("fallbackReason")
        if fallback:
            notes.append(f"RDMA FELL BACK TO TCP: {fallback}")
        topic_config = s.get("globalTopicConfig") or {}
        if topic_config.get("drift"):
            notes.append(f"T-GLOBAL CONFIG DRIFT: {', '.join(topic_config['drift'])}")
        if not s.get("ready"):
            notes.extend(s.get("notReadyReasons") or [])
        lines.append(
            f"{s['member']:<14}{s.get('role', '-'):<11}{s.get('term', 0):>6}  "
            f"{'yes' if s.get('ready') else 'no':<6}{s.get('appliedIndex', 0):>9}{lag:>7}"
            f"{s.get('eventsIn', 0):>11}{s.get('eventsOut', 0):>12}  "
            f"{_ms(latency.get('p50')) + ' / ' + _ms(latency.get('p99')):<18} "
            f"{'; '.join(notes)}"
        )
    seqs: dict[str, dict[str, int]] = {}
    for s in statuses:
        for topic, seq in (s.get("deliveredSeq") or {}).items():
            seqs.setdefault(topic, {})[s["member"]] = seq
    for topic, by_member in sorted(seqs.items()):
        parts = ", ".join(f"{m} {q}" for m, q in sorted(by_member.items()))
        lines.append(f"delivered seq of {topic}: {parts}")
    return "\n".join(lines)
