"""Pure parts of the replication benchmark: event tags, percentiles, MirrorMaker's config,
the perf tools' output, py-spy profiles, the table's ratios and the command line."""

from __future__ import annotations

import cProfile
import json
import re
from pathlib import Path

import pytest

from kdsync.benchmark import payload
from kdsync.benchmark.__main__ import parse_args, settings_from
from kdsync.benchmark.call_counts import _label, summarise_calls
from kdsync.benchmark.ceiling import _CONSUMER_ROW, _PRODUCER_SUMMARY
from kdsync.benchmark.phases import PhaseResult
from kdsync.benchmark.probe import LatencySummary, percentile
from kdsync.benchmark.profile_analysis import parse_raw, summarise, thread_cpu_kinds
from kdsync.benchmark.report import ratio_rows, render
from kdsync.benchmark.runner import (
    KDSYNC,
    MM2,
    MM2_EOS,
    BenchResult,
    BenchSettings,
    SystemRun,
    result_from_json,
)
from kdsync.benchmark.systems import mirrormaker_properties
from kdsync.localkafka import KAFKA_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_mirrormaker_is_pinned_to_the_brokers_kafka_version() -> None:
    pom = (REPO_ROOT / "hack" / "mirrormaker" / "pom.xml").read_text()
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert match is not None and match.group(1) == KAFKA_VERSION


def test_events_carry_phase_origin_and_sequence_at_their_exact_size() -> None:
    pad = payload.padding(100)
    value = payload.encode(7, 3, 123_456_789, pad)
    assert len(value) == 100
    assert payload.decode(value) == payload.EventTag(7, 3, 123_456_789)
    for foreign in (None, b"", b"heartbeat", b"XX" + value[2:]):
        assert payload.decode(foreign) is None
    with pytest.raises(ValueError, match="12-byte prefix"):
        payload.check_event_size(8)


def test_percentiles_are_nearest_rank() -> None:
    samples = [float(x) for x in range(1, 1001)]
    assert percentile(samples, 50) == 500
    assert percentile(samples, 99) == 990
    assert percentile(samples, 99.9) == 999
    assert percentile([5.0], 99.9) == 5.0
    summary = LatencySummary.of([3.0, 1.0, 2.0])
    assert summary.count == 3 and summary.max_ms == 3.0 and summary.percentiles_ms["p50"] == 2.0


def test_mirrormaker_replicates_every_cluster_to_every_other_one() -> None:
    aliases = {"a": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.1:3"}
    eos = mirrormaker_properties(aliases, "orders", exactly_once=True, tasks_max=2)
    flows = re.findall(r"^(\w+)->(\w+)\.enabled = true$", eos, re.MULTILINE)
    assert sorted(flows) == [(s, t) for s in "abc" for t in "abc" if s != t]
    assert sorted(re.findall(r"^(\w+)\.exactly\.once\.source\.support = enabled$", eos, re.M)) == [
        "a",
        "b",
        "c",
    ]
    assert "topics = orders\n" in eos and "tasks.max = 2\n" in eos
    plain = mirrormaker_properties(aliases, "orders", exactly_once=False, tasks_max=1)
    assert "exactly.once" not in plain


def test_perf_tool_summaries_are_read() -> None:
    producer = (
        "300000 records sent, 31459.731544 records/sec (3.00 MB/sec), 605.60 ms avg latency, "
        "2235.00 ms max latency, 721 ms 50th, 938 ms 95th, 990 ms 99th, 1032 ms 99.9th.\n"
    )
    found = _PRODUCER_SUMMARY.findall("77894 records sent, 15384.9 records/sec\n" + producer)
    assert [(f[0], f[1]) for f in found] == [("300000", "31459.731544")]
    consumer = (
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec\n"
        "[2026-11-23T14:00:20,003] INFO initializing (KafkaMetricsCollector)\n"
        "2026-11-23 14:00:21:962, 2026-11-23 14:00:24:347, 0.9537, 0.3999, 10000, 4192.8721, "
        "1942, 443, 2.1528, 22573.3634\n"
    )
    rows = _CONSUMER_ROW.findall(consumer)
    assert len(rows) == 1 and rows[0].split(", ")[9] == "22573.3634"


RAW = """\
thread (11): MainThread;run (asyncio/base_events.py:600);_drive_loop (kdsync/runtime/sidecar.py:330);offer (kdsync/ordering/node.py:100) 30
thread (11): MainThread;run (asyncio/base_events.py:600);_drive_loop (kdsync/runtime/sidecar.py:330);encode_message (kdsync/wire_format.py:40);PyBytes_FromStringAndSize (libpython3.11.so.1.0) 10
thread (12): asyncio_0;_worker (concurrent/futures/thread.py:81);write (kdsync/kafka/global_writer.py:90);Producer_produce (confluent_kafka/cimpl.cpython-311-x86_64-linux-gnu.so);rd_kafka_producev (librdkafka.so.1) 60
"""  # noqa: E501


def test_profiles_are_attributed_to_kdsync_functions_threads_and_libraries() -> None:
    stacks = parse_raw(RAW)
    assert [s.thread for s in stacks] == ["MainThread", "MainThread", "asyncio_0"]
    summary = summarise(stacks, seconds=2.0, rate=100)
    assert summary["samples"] == 100
    assert summary["gil_busy_percent"] == 50.0

    def named(key: str) -> dict[str, float]:
        rows = summary[key]
        assert isinstance(rows, list)
        return {r["name"]: r["percent"] for r in rows}

    assert named("kdsync_function_with_callees") == {
        "kdsync/kafka/global_writer.py:write": 60.0,
        "kdsync/ordering/node.py:offer": 30.0,
        "kdsync/wire_format.py:encode_message": 10.0,
    }
    assert named("inclusive_python")["kdsync/runtime/sidecar.py:_drive_loop"] == 40.0
    assert named("leaf") == {
        "librdkafka (called under the GIL)": 60.0,
        "Python code": 30.0,
        "CPython runtime (objects, allocation, builtins)": 10.0,
    }
    assert named("threads") == {
        "asyncio.to_thread workers": 60.0,
        "MainThread (asyncio event loop)": 40.0,
    }


def test_thread_cpu_is_split_into_event_loop_librdkafka_and_other_threads() -> None:
    before = {(100, "python"): 1.0, (101, "rdk:broker1"): 2.0, (102, "python"): 0.5}
    after = {
        (100, "python"): 3.0,
        (101, "rdk:broker1"): 2.5,
        (102, "python"): 1.5,
        (103, "rdk:main"): 0.25,
    }
    assert thread_cpu_kinds(before, after, pid=100) == {
        "Python main thread (event loop)": 2.0,
        "librdkafka threads (rdk:*)": 0.75,
        "other Python threads (source reader, to_thread workers)": 1.0,
    }


def _run(label: str, rate: float, cpu: float, p99: float) -> SystemRun:
    run = SystemRun(label, 3)
    run.phases.append(
        PhaseResult("throughput", 100, 1000, 0.0, None, complete=True, elapsed_s=1.0,
                    deliveries=6000, expected_deliveries=6000, deliveries_per_s=rate,
                    cpu_s={"p": cpu})
    )  # fmt: skip
    latency = PhaseResult("latency", 100, 10, 1.0, 0.5, complete=True)
    latency.latency = LatencySummary(1, 1.0, {"p50": 1.0, "p99": p99, "p99.9": p99}, p99)
    run.phases.append(latency)
    return run


def test_the_table_puts_kdsync_against_each_peer_at_the_same_size() -> None:
    result = BenchResult(BenchSettings(sizes=(100,), load_fractions=(0.5,)))
    result.systems = [
        _run(KDSYNC, 200.0, 3.0, 50.0),
        _run(MM2_EOS, 100.0, 1.0, 100.0),
        _run(MM2, 400.0, 3.0, 25.0),
    ]
    rows = ratio_rows(result, 100)
    # throughput 200/100 and 200/400; per CPU (6000/3)/(6000/1) and equal; p99 50/100, 50/25.
    assert rows[1] == ["3", "2.00x", "0.50x", "-", "0.33x", "1.00x", "0.50x", "2.00x"]
    table = render(result)
    assert "exactly once" in table and "== 100-byte events ==" in table
    # A saved run renders the same table again (hack/bench-replication --render).
    saved = json.loads(json.dumps(result.to_json()))
    assert render(result_from_json(saved)) == table


def test_an_incomplete_phase_shows_no_rate_and_says_why() -> None:
    result = BenchResult(BenchSettings(sizes=(100,), load_fractions=(0.5,)))
    run = _run(KDSYNC, 200.0, 3.0, 50.0)
    run.phases[0].complete = False
    run.phases[0].missing = 5000
    result.systems = [run, _run(MM2_EOS, 100.0, 1.0, 100.0)]
    table = render(result)
    assert "INCOMPLETE: throughput phase, 5,000 of 6,000 missing" in table
    assert ratio_rows(result, 100)[1][1] == "-"


def test_quick_and_scale_options_shape_the_run() -> None:
    quick = settings_from(parse_args(["--quick"]))
    assert quick.kdsync_members == (2,) and quick.mm2_members == (2,) and quick.cluster_count() == 2
    scaled = settings_from(parse_args(["--events", "1000", "--scale", "3", "--systems", "kdsync"]))
    assert scaled.events_per_origin == 3000 and scaled.latency_seconds == 15.0
    assert scaled.systems == (KDSYNC,) and scaled.cluster_count() == 5
    with pytest.raises(SystemExit):
        parse_args(["--systems", "mm3"])


def _per_event_helper(value: int) -> int:
    return value + 1


def test_call_counts_are_divided_by_the_events_written(tmp_path: Path) -> None:
    profile = cProfile.Profile()
    profile.enable()
    for event in range(400):
        _per_event_helper(event)
    profile.disable()
    stats_file = tmp_path / "calls.pstats"
    profile.dump_stats(str(stats_file))
    summary = summarise_calls(stats_file, events=200)
    rows = {r["function"]: r for r in summary["by_own_time"]}
    helper = next(r for name, r in rows.items() if name.endswith(":_per_event_helper"))
    assert helper["calls"] == 400 and helper["calls_per_event"] == 2.0
    node = ("/w/sidecar/kdsync/ordering/node.py", 9, "offer")
    assert _label(node) == "kdsync/ordering/node.py:offer"
    assert _label(("/v/lib/python3.11/asyncio/events.py", 1, "run")) == "asyncio/events.py:run"
