"""Pure parts of the replication benchmark: event tags, percentiles, MirrorMaker's config,
the perf tools' output, py-spy profiles, the table's ratios, the medians over repeated
rounds and the command line."""

from __future__ import annotations

import cProfile
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kdsync.benchmark import payload, runner
from kdsync.benchmark.__main__ import parse_args, settings_from
from kdsync.benchmark.call_counts import _label, summarise_calls
from kdsync.benchmark.ceiling import _CONSUMER_ROW, _PRODUCER_SUMMARY, CeilingResult, ToolRun
from kdsync.benchmark.medians import medians_at, result_document, system_medians
from kdsync.benchmark.phases import PhaseResult
from kdsync.benchmark.probe import LatencySummary, percentile
from kdsync.benchmark.profile_analysis import parse_raw, summarise, thread_cpu_kinds
from kdsync.benchmark.report import ratio_rows, render, system_rows
from kdsync.benchmark.runner import (
    KDSYNC,
    MM2,
    MM2_EOS,
    BenchResult,
    BenchSettings,
    CeilingRound,
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
    assert quick.repeat == 1
    assert settings_from(parse_args(["--quick", "--repeat", "3"])).repeat == 3
    for wrong in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            parse_args(["--repeat", wrong])


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


# --- Repeated rounds (--repeat N): medians, spread, rounds left out, old and new JSON ---

DELIVERIES = 6000  # per throughput phase of _round


def _round(
    number: int,
    rate: float,
    cpu: float,
    p50: float,
    p99: float,
    label: str = KDSYNC,
    missing: int = 0,
    missing_at_50: int = 0,
) -> SystemRun:
    """One round of a 3-member system at 100 B: throughput, then 25% and 50% load.

    ``missing``: deliveries its throughput phase missed; ``missing_at_50``: its 50% phase.
    """
    run = SystemRun(label, 3, round=number)
    throughput = PhaseResult(
        "throughput", 100, 1000, 0.0, None, complete=not missing,
        elapsed_s=DELIVERIES / rate, deliveries=DELIVERIES - missing,
        expected_deliveries=DELIVERIES, missing=missing, deliveries_per_s=rate,
        mb_per_s=rate * 100 / 1e6, cpu_s={"p": cpu}, broker_cpu_s={"broker c1": 2 * cpu},
    )  # fmt: skip
    run.phases.append(throughput)
    for fraction in (0.25, 0.5):
        gone = missing_at_50 if fraction == 0.5 else 0
        latency = PhaseResult(
            "latency", 100, 10, 1.0, fraction, complete=not gone, deliveries=60 - gone,
            expected_deliveries=60, missing=gone,
        )  # fmt: skip
        # The latency at 25% load is a tenth of that at 50%: each its own median.
        scale = 0.1 if fraction == 0.25 else 1.0
        latency.latency = LatencySummary(
            60 - gone, p50, {"p50": p50 * scale, "p99": p99 * scale, "p99.9": 2 * p99 * scale}, p99
        )
        run.phases.append(latency)
    run.memory = {"p": {"rss_bytes": 1, "peak_rss_bytes": int(rate) * 1024 * 1024}}
    return run


# Five rounds. The median of each figure comes from a different round than the first, the
# last, the middle one (by position) and the mean: 300 deliveries/s is round 4, CPU round 2,
# p50 round 5, p99 round 1.
RATES = (900.0, 100.0, 400.0, 300.0, 200.0)  # median 300, mean 380
CPUS = (9.0, 3.0, 1.0, 2.0, 8.0)  # median 3 (round 2), mean 4.6
P50S = (4.0, 5.0, 1.0, 2.0, 3.0)  # median 3 (round 5)
P99S = (30.0, 60.0, 10.0, 20.0, 40.0)  # median 30 (round 1), mean 32


def _rounds(
    label: str = KDSYNC, missing_in: Sequence[int] = (), missing_at_50_in: Sequence[int] = ()
) -> list[SystemRun]:
    """Five rounds of RATES, CPUS, P50S and P99S; some missing deliveries (by round)."""
    runs = []
    for n, (rate, cpu, p50, p99) in enumerate(zip(RATES, CPUS, P50S, P99S, strict=True), 1):
        missing = 1000 if n in missing_in else 0
        missing_at_50 = 5 if n in missing_at_50_in else 0
        runs.append(_round(n, rate, cpu, p50, p99, label, missing, missing_at_50))
    return runs


def _result(systems: Sequence[SystemRun], repeat: int = 5) -> BenchResult:
    settings = BenchSettings(sizes=(100,), load_fractions=(0.25, 0.5), repeat=repeat)
    return BenchResult(settings, systems=list(systems))


def test_each_figure_is_the_median_over_the_rounds_with_the_spread_of_deliveries() -> None:
    m = system_medians(_rounds(), 100, (0.25, 0.5))
    assert (m.rounds, m.counted) == (5, 5)
    assert m.deliveries_per_s == 300.0
    assert (m.deliveries_per_s_min, m.deliveries_per_s_max) == (100.0, 900.0)
    assert m.mb_per_s == pytest.approx(0.03)
    assert m.elapsed_s == pytest.approx(DELIVERIES / 300)
    assert m.cpu_s_per_million == pytest.approx(3.0 / (DELIVERIES / 1e6))  # 500
    assert m.broker_cpu_s_per_million == pytest.approx(1000.0)
    # CPU s / elapsed s: 1.35, 0.05, 0.067, 0.1, 0.267 in the five rounds.
    assert m.cores_used == pytest.approx(0.1)
    # Each percentile its own median, from a different round each.
    at_50 = m.at_load(0.5)
    assert at_50 is not None and at_50.counted == 5
    assert at_50.percentiles_ms == {"p50": 3.0, "p99": 30.0, "p99.9": 60.0}
    at_25 = m.at_load(0.25)
    assert at_25 is not None and at_25.percentiles_ms["p99"] == pytest.approx(3.0)
    assert m.peak_rss_bytes == 300 * 1024 * 1024 and m.peak_rss_sum_bytes == m.peak_rss_bytes

    table = render(_result(_rounds()))
    assert "== 100-byte events (medians of 5 rounds) ==" in table
    rows = system_rows(_result(_rounds()), 100)
    assert rows[0][2:4] == ["deliveries/s", "deliveries/s (min\N{EN DASH}max of 5)"]
    assert rows[1][2:5] == ["300", "100\N{EN DASH}900", "0.0"]
    assert rows[1][6] == "500.0"
    assert rows[1][9:12] == ["0 / 3 / 6", "3 / 30 / 60", "300, 300"]
    assert rows[1][12] == "exactly once"


def test_a_round_that_misses_deliveries_is_left_out_and_the_table_says_so() -> None:
    # Round 3's throughput phase missed deliveries: its rate must not count, neither in the
    # median nor in the spread. Round 1's phase at 50% load did (its p99, 30, must not count).
    runs = _rounds(missing_in=(3,), missing_at_50_in=(1,))
    runs[2].phases[0].deliveries_per_s = 5000.0
    m = system_medians(runs, 100, (0.25, 0.5))
    assert (m.rounds, m.counted) == (5, 4)
    assert m.deliveries_per_s == 250.0  # of 900, 100, 300, 200: an even count
    assert (m.deliveries_per_s_min, m.deliveries_per_s_max) == (100.0, 900.0)
    at_50 = m.at_load(0.5)
    assert at_50 is not None and at_50.counted == 4
    assert at_50.percentiles_ms["p99"] == 30.0  # of 60, 10, 20, 40
    assert at_50.percentiles_ms["p50"] == 2.5  # of 5, 1, 2, 3
    at_25 = m.at_load(0.25)
    assert at_25 is not None and at_25.counted == 5

    row = system_rows(_result(runs), 100)[1]
    assert row[2:4] == ["250", "100\N{EN DASH}900 (4 of 5 counted)"]
    assert row[9] == "0 / 3 / 6"
    assert row[10] == "2 / 30 / 60 (4 of 5 counted)"
    assert row[12] == (
        "round 1: INCOMPLETE: latency phase, 5 of 60 missing at the deadline; "
        "round 3: INCOMPLETE: throughput phase, 1,000 of 6,000 missing at the deadline"
    )


def test_a_system_that_fails_in_one_round_keeps_its_other_rounds_and_the_others() -> None:
    eos = _rounds(MM2_EOS)
    failed = SystemRun(MM2_EOS, 3, round=2, error="RuntimeError: MirrorMaker did not start")
    eos[1] = failed
    result = _result([*_rounds(), *eos])
    kdsync, mm2_eos = medians_at(result, 100)
    assert (kdsync.counted, kdsync.deliveries_per_s) == (5, 300.0)
    assert (mm2_eos.counted, mm2_eos.deliveries_per_s) == (4, 350.0)  # 900, 400, 300, 200
    row = system_rows(result, 100)[2]
    assert row[0] == MM2_EOS and row[3] == "200\N{EN DASH}900 (4 of 5 counted)"
    assert row[12] == "round 2: FAILED: RuntimeError: MirrorMaker did not start"


def test_the_ratios_are_of_the_medians() -> None:
    # MM2-EOS's rounds, each figure's median from yet another round than kdsync's: the
    # ratios of the medians differ from those of the means, first or last rounds.
    eos_figures = zip(
        (150.0, 50.0, 100.0, 400.0, 75.0),  # deliveries/s: median 100 (round 3)
        (4.0, 6.0, 12.0, 1.0, 2.0),  # CPU s: median 4 (round 1), 666.7 per M
        (1.0, 2.0, 3.0, 4.0, 5.0),
        (60.0, 20.0, 120.0, 10.0, 50.0),  # p99: median 50 (round 5)
        strict=True,
    )
    eos = [_round(n, *figures, label=MM2_EOS) for n, figures in enumerate(eos_figures, 1)]
    result = _result([*_rounds(), *eos])
    result.ceilings = [
        _ceiling(n, per_s) for n, per_s in enumerate((3000.0, 600.0, 1200.0, 9000.0, 100.0), 1)
    ]
    rows = ratio_rows(result, 100)
    # throughput 300 / 100; ceiling 300 / 1200; per CPU: MM2-EOS's 666.7 CPU s per M over
    # kdsync's 500; p99 at 50% load 30 / 50.
    assert rows[1] == ["3", "3.00x", "-", "0.25x", "1.33x", "-", "0.60x", "-"]


def _ceiling(number: int, per_s: float) -> CeilingRound:
    runs = [ToolRun("c1", int(per_s), per_s, 1.0, number * 1024 * 1024)]
    consume = [ToolRun("c1", int(per_s), per_s * 2, 1.0, 1)]
    return CeilingRound(100, 1, runs, consume, number)


def test_a_repeated_run_keeps_every_round_and_its_medians_and_renders_again() -> None:
    result = _result([*_rounds(missing_in=(3,)), *_rounds(MM2_EOS)])
    result.ceilings = [_ceiling(n, r) for n, r in enumerate((3000.0, 600.0, 1200.0), 1)]
    document = json.loads(json.dumps(result_document(result)))
    assert document["settings"]["repeat"] == 5
    assert [(s["label"], s["round"]) for s in document["systems"]] == [
        (label, n) for label in (KDSYNC, MM2_EOS) for n in range(1, 6)
    ]
    assert [s["phases"][0]["deliveries_per_s"] for s in document["systems"][:5]] == list(RATES)
    assert [c["round"] for c in document["ceilings"]] == [1, 2, 3]
    medians = document["medians"]
    assert medians["rounds"] == 5
    kdsync = medians["systems"][0]
    assert (kdsync["label"], kdsync["event_bytes"], kdsync["counted"]) == (KDSYNC, 100, 4)
    assert kdsync["deliveries_per_s"] == 250.0 and kdsync["deliveries_per_s_max"] == 900.0
    assert kdsync["latency"][1] == {
        "load_fraction": 0.5,
        "counted": 5,
        "percentiles_ms": {"p50": 3.0, "p99": 30.0, "p99.9": 60.0},
    }
    ceiling = medians["ceilings"][0]
    assert (ceiling["ceiling_per_s"], ceiling["counted"]) == (1200.0, 3)
    assert (ceiling["ceiling_per_s_min"], ceiling["ceiling_per_s_max"]) == (600.0, 3000.0)
    assert ceiling["tool_peak_rss_bytes"] == 2 * 1024 * 1024
    # --render reads the rounds back and computes the same medians.
    again = result_from_json(document)
    assert [s.round for s in again.systems] == [s.round for s in result.systems]
    assert render(again) == render(result)
    assert render(again, markdown=True) == render(result, markdown=True)
    ceiling_row = system_rows(again, 100)[3]
    assert ceiling_row[:4] == ["ceiling", "1", "1,200", "600\N{EN DASH}3,000 (3 of 5 counted)"]


def _old_phase(kind: str, rate: float | None, fraction: float | None, p99: float) -> dict[str, Any]:
    latency = {"p50": p99 / 3, "p99": p99, "p99.9": p99 * 1.5}
    return {
        "kind": kind, "event_bytes": 100, "events_per_origin": 1000, "rate_per_origin": 0.0,
        "load_fraction": fraction, "complete": True, "error": None, "elapsed_s": 2.0,
        "deliveries": 6000, "expected_deliveries": 6000, "duplicates": 0, "missing": 0,
        "local_copies": 3000, "deliveries_per_s": rate, "mb_per_s": rate and rate * 1e-4,
        "latency": {"count": 6000, "mean_ms": p99, "percentiles_ms": latency, "max_ms": p99},
        "origin_ack": {"count": 0, "mean_ms": 0.0, "percentiles_ms": {}, "max_ms": 0.0},
        "cpu_s": {"sidecar c1": 1.5}, "cpu_wait_s": {}, "broker_cpu_s": {"broker c1": 3.0},
        "harness_cpu_s": {}, "system_cpu_s": 1.5, "cpu_s_per_million_deliveries": 250.0,
        "broker_cpu_s_per_million_deliveries": 500.0, "cores_used": 0.75,
    }  # fmt: skip


def _old_system(label: str, rate: float, p99: float) -> dict[str, Any]:
    return {
        "label": label, "members": 3, "settings": {},
        "phases": [
            _old_phase("warmup", 100.0, None, 1.0),
            _old_phase("throughput", rate, None, 2000.0),
            _old_phase("latency", 50.0, 0.25, p99 / 2),
            _old_phase("latency", 100.0, 0.5, p99),
        ],
        "memory": {"sidecar c1": {"rss_bytes": 1, "peak_rss_bytes": 200 * 1024 * 1024}},
        "error": None, "seconds": 30.0,
    }  # fmt: skip


# What hack/bench-replication wrote before --repeat: no rounds, no repeat, no medians.
OLD_RUN: dict[str, Any] = {
    "command": "hack/bench-replication --sizes 100",
    "startedAt": "2026-11-26T05:00:00Z",
    "seconds": 60.0,
    "machine": {},
    "settings": {
        "kdsync_members": [3],
        "mm2_members": [3],
        "ceiling_members": 3,
        "sizes": [100],
        "events_per_origin": 1000,
        "warmup_events": 100,
        "load_fractions": [0.25, 0.5],
        "latency_seconds": 5.0,
        "partitions": 3,
        "ceiling_mb": 1.0,
        "mm2_tasks": 1,
        "systems": ["kdsync", "MM2-EOS", "ceiling"],
        "start_timeout": 300.0,
        "phase_deadline": 300.0,
    },
    "systems": [_old_system(KDSYNC, 3000.0, 120.0), _old_system(MM2_EOS, 1500.0, 240.0)],
    "ceilings": [
        {
            "event_bytes": 100,
            "clusters": 3,
            "produce": [
                {
                    "cluster": "c1",
                    "records": 1000,
                    "records_per_s": 40000.0,
                    "cpu_seconds": 1.0,
                    "peak_rss_bytes": 300 * 1024 * 1024,
                }
            ],
            "consume": [
                {
                    "cluster": "c1",
                    "records": 1000,
                    "records_per_s": 90000.0,
                    "cpu_seconds": 1.0,
                    "peak_rss_bytes": 100 * 1024 * 1024,
                }
            ],
            "produce_per_s": 40000.0,
            "consume_per_s": 90000.0,
            "ceiling_per_s": 40000.0,
        }
    ],
    "ceilingError": None,
    "brokerMemory": {},
}


def test_a_run_saved_before_repeat_renders_as_it_did() -> None:
    old = result_from_json(json.loads(json.dumps(OLD_RUN)))
    assert old.settings.repeat == 1 and [s.round for s in old.systems] == [1, 1]
    assert [c.round for c in old.ceilings] == [1]
    table = render(old)
    assert "== 100-byte events ==" in table and "medians" not in table and "max of" not in table
    rows = system_rows(old, 100)
    assert rows[0][:4] == ["system", "N", "deliveries/s", "MB/s"]
    assert rows[1] == [
        KDSYNC, "3", "3,000", "0.3", "2.0", "250.0", "0.75", "500.0",
        "20 / 60 / 90", "40 / 120 / 180", "200, 200", "exactly once",
    ]  # fmt: skip
    assert rows[3][:4] == ["ceiling", "3", "40,000", "4.0"]
    assert rows[3][-2:] == ["300 (one perf tool)", "produce 40,000/s, consume 90,000/s"]
    # 3000/1500; 3000/40000; per CPU equal; p99 at 50% 120/240.
    assert ratio_rows(old, 100)[1] == ["3", "2.00x", "-", "0.07x", "1.00x", "-", "0.50x", "-"]
    # Written again, the old run gains its round numbers and medians, and renders the same.
    document = json.loads(json.dumps(result_document(old)))
    assert document["medians"]["systems"][0]["deliveries_per_s"] == 3000.0
    assert render(result_from_json(document)) == table


class _FakeSystem:
    def __init__(self, label: str, members: int) -> None:
        self.label, self.members = label, members


def test_rounds_interleave_the_systems_and_one_failure_loses_nothing_else(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    measured: list[tuple[str, int, Path]] = []

    def measure(
        system: _FakeSystem, settings: BenchSettings, brokers: object, work_dir: Path,
        progress: object,
    ) -> SystemRun:  # fmt: skip
        measured.append((system.label, system.members, work_dir))
        failing = system.label == MM2_EOS and len(measured) == 3
        return SystemRun(system.label, system.members, error="boom" if failing else None)

    def ceiling(
        clusters: Mapping[str, str], kafka: object, size: int, *rest: object
    ) -> CeilingResult:
        return CeilingResult(size, len(clusters), [], [])

    monkeypatch.setattr(runner, "measure_system", measure)
    monkeypatch.setattr(
        runner, "_new_system", lambda label, chosen, *_: _FakeSystem(label, len(chosen))
    )
    monkeypatch.setattr(runner, "list_topics", lambda bootstrap: set())
    monkeypatch.setattr(runner, "_cleanup_topics", lambda clusters, before: None)
    monkeypatch.setattr(runner, "run_ceiling", ceiling)
    settings = BenchSettings(
        kdsync_members=(2, 3), mm2_members=(3,), ceiling_members=2, sizes=(100,),
        systems=(KDSYNC, MM2_EOS, "ceiling"), repeat=2,
    )  # fmt: skip
    said: list[str] = []
    clusters = {f"c{i}": f"127.0.0.1:{i}" for i in range(1, 4)}
    result = runner.run_benchmark(settings, clusters, {}, None, tmp_path, said.append)  # type: ignore[arg-type]

    order = [(label, members) for label, members, _ in measured]
    assert order == [(KDSYNC, 2), (KDSYNC, 3), (MM2_EOS, 3)] * 2
    assert [d.name for _, _, d in measured[:3]] == [
        "kdsync-2-round1",
        "kdsync-3-round1",
        "mm2-eos-3-round1",
    ]
    assert [(s.label, s.members, s.round, s.error) for s in result.systems] == [
        (KDSYNC, 2, 1, None), (KDSYNC, 3, 1, None), (MM2_EOS, 3, 1, "boom"),
        (KDSYNC, 2, 2, None), (KDSYNC, 3, 2, None), (MM2_EOS, 3, 2, None),
    ]  # fmt: skip
    assert [c.round for c in result.ceilings] == [1, 2]
    assert said[0] == "round 1 of 2" and "round 2 of 2" in said
    assert sum(line.startswith("round 1 of 2 done in ") for line in said) == 1


def test_a_failure_in_a_late_round_keeps_the_rounds_saved_before_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[int] = []

    def new_system(label: str, chosen: Mapping[str, str], *_: object) -> _FakeSystem:
        started.append(len(started) + 1)
        if len(started) == 3:  # round 2's first system: fails outside measure_system
            raise RuntimeError("the work folder's disk is full")
        return _FakeSystem(label, len(chosen))

    monkeypatch.setattr(
        runner, "measure_system", lambda system, *_: SystemRun(system.label, system.members)
    )
    monkeypatch.setattr(runner, "_new_system", new_system)
    monkeypatch.setattr(runner, "list_topics", lambda bootstrap: set())
    monkeypatch.setattr(runner, "_cleanup_topics", lambda clusters, before: None)
    settings = BenchSettings(
        kdsync_members=(2, 3), mm2_members=(3,), sizes=(100,), systems=(KDSYNC,), repeat=3
    )
    saved: list[dict[str, Any]] = []

    def save(so_far: BenchResult) -> None:  # as the command line does, through JSON
        saved.append(json.loads(json.dumps(result_document(so_far))))

    clusters = {f"c{i}": f"127.0.0.1:{i}" for i in range(1, 4)}
    with pytest.raises(RuntimeError, match="disk is full"):
        runner.run_benchmark(
            settings, clusters, {}, None, tmp_path, lambda line: None,  # type: ignore[arg-type]
            after_round=save,
        )  # fmt: skip

    assert len(saved) == 1  # round 1 was saved before round 2 started
    assert [(s["members"], s["round"]) for s in saved[0]["systems"]] == [(2, 1), (3, 1)]
    assert result_from_json(saved[0]).rounds_of(KDSYNC, 3)[0].round == 1


def test_kdsync_variants_run_beside_kdsync_in_each_round_with_their_own_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--systems", "kdsync", "--members", "3", "--repeat", "2"]
    args += [
        "--kdsync-variant",
        "sourceLingerMs=20",
        "--kdsync-variant",
        "sourceLingerMs=5,tickMs=10",
    ]
    settings = settings_from(parse_args(args))
    assert settings.kdsync_variants == (
        (("sourceLingerMs", 20),),
        (("sourceLingerMs", 5), ("tickMs", 10)),
    )
    # Checked as the sidecar checks its config, naming the key and the docs.
    for wrong, says in (
        ("linger=20", "linger"),
        ("sourceLingerMs=2000", "1000"),
        ("x", "KEY=NUMBER"),
    ):
        with pytest.raises(SystemExit):
            parse_args(["--kdsync-variant", wrong])
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a variant of a system not measured would vanish
        parse_args(["--systems", "MM2", "--kdsync-variant", "sourceLingerMs=20"])
    assert "add kdsync to --systems" in capsys.readouterr().err

    built: list[tuple[str, Any]] = []
    folders: list[str] = []

    def measure(system: Any, *_: object) -> SystemRun:
        built.append((system.label, system.ordering))
        folders.append(system.run_dir.name)
        return SystemRun(system.label, system.members)

    monkeypatch.setattr(runner, "measure_system", measure)
    monkeypatch.setattr(runner, "list_topics", lambda bootstrap: set())
    monkeypatch.setattr(runner, "_cleanup_topics", lambda clusters, before: None)
    clusters = {f"c{i}": f"127.0.0.1:{i}" for i in range(1, 4)}
    result = runner.run_benchmark(settings, clusters, {}, None, tmp_path, lambda _: None)  # type: ignore[arg-type]

    assert (
        built
        == [
            (KDSYNC, None),  # the local group's defaults
            ("kdsync sourceLingerMs=20", {"tickMs": 20, "sourceLingerMs": 20}),
            ("kdsync sourceLingerMs=5,tickMs=10", {"tickMs": 10, "sourceLingerMs": 5}),
        ]
        * 2
    )
    assert folders[:3] == [
        "kdsync-3-round1",
        "kdsync-sourcelingerms20-3-round1",
        "kdsync-sourcelingerms5-tickms10-3-round1",
    ]
    again = result_from_json(json.loads(json.dumps(result_document(result))))
    assert again.settings.kdsync_variants == settings.kdsync_variants
