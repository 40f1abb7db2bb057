"""The replication benchmark at its smallest, on the session's Kafka fleet, so it never rots.

No timing assertions: only that every system ran, each delivered every event to every
other cluster (exactly once where the system promises it), and the result is complete
and renders; and that ``--repeat`` measures every round and reports their medians (kdsync
alone, one size: two rounds of about 10 s).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from kdsync.benchmark.__main__ import QUICK
from kdsync.benchmark.medians import medians_at, result_document
from kdsync.benchmark.report import render
from kdsync.benchmark.runner import (
    KDSYNC,
    MM2,
    MM2_EOS,
    BenchSettings,
    result_from_json,
    run_benchmark,
)
from kdsync.benchmark.systems import MirrorMakerNotProvisioned, find_mirrormaker
from kdsync.localkafka import KafkaDistribution, LocalKafkaFleet

pytestmark = pytest.mark.kafka

SIZES = (100, 1024)


def test_every_system_delivers_everything_and_the_result_is_complete(
    kafka_fleet: LocalKafkaFleet, kafka_distribution: KafkaDistribution, tmp_path: Path
) -> None:
    try:
        find_mirrormaker()
    except MirrorMakerNotProvisioned as error:
        pytest.fail(str(error), pytrace=False)
    settings = BenchSettings(**{**QUICK, "sizes": SIZES})
    clusters = kafka_fleet.bootstrap_servers()
    result = run_benchmark(
        settings, clusters, kafka_fleet.pids(), kafka_distribution, tmp_path, print
    )

    assert [(s.label, s.members) for s in result.systems] == [
        (KDSYNC, 2),
        (MM2_EOS, 2),
        (MM2, 2),
    ]
    events = settings.events_per_origin
    for run in result.systems:
        assert run.error is None, f"{run.label}: {run.error}"
        assert run.memory and all(m["peak_rss_bytes"] > 0 for m in run.memory.values())
        for size in SIZES:
            throughput = run.phase("throughput", size)
            assert throughput is not None and throughput.complete, (run.label, size)
            # 2 origins x 1 other cluster each x events.
            assert throughput.deliveries == throughput.expected_deliveries == 2 * events
            assert throughput.missing == 0
            if run.label in (KDSYNC, MM2_EOS):
                assert throughput.duplicates == 0, run.label
            # kdsync also writes each member's own events into its own T-global.
            expected_local = 2 * events if run.label == KDSYNC else 0
            assert throughput.local_copies == expected_local, run.label
            assert throughput.deliveries_per_s and throughput.cpu_s
            assert set(throughput.broker_cpu_s) == {"broker kafka-1", "broker kafka-2"}
            for fraction in settings.load_fractions:
                latency = run.phase("latency", size, fraction)
                assert latency is not None and latency.complete, (run.label, size, fraction)
                assert latency.latency.count == latency.deliveries > 0
                assert set(latency.latency.percentiles_ms) == {"p50", "p99", "p99.9"}

    assert [c.event_bytes for c in result.ceilings] == list(SIZES), result.ceiling_error
    for ceiling in result.ceilings:
        assert ceiling.produce_per_s > 0 and ceiling.consume_per_s > 0
        assert all(run.records > 0 and run.cpu_seconds > 0 for run in ceiling.produce)

    document = json.loads(json.dumps(result_document(result)))
    assert {s["label"] for s in document["systems"]} == {KDSYNC, MM2_EOS, MM2}
    table = render(result)
    assert "exactly once" in table and "FAILED" not in table and "MISSING" not in table


def test_repeated_rounds_are_each_measured_and_reported_as_medians(
    kafka_fleet: LocalKafkaFleet, kafka_distribution: KafkaDistribution, tmp_path: Path
) -> None:
    settings = BenchSettings(**{**QUICK, "sizes": (100,), "systems": (KDSYNC,), "repeat": 2})
    clusters = kafka_fleet.bootstrap_servers()
    said: list[str] = []
    result = run_benchmark(
        settings, clusters, kafka_fleet.pids(), kafka_distribution, tmp_path, said.append
    )

    assert [(s.label, s.members, s.round) for s in result.systems] == [
        (KDSYNC, 2, 1),
        (KDSYNC, 2, 2),
    ]
    rates = []
    for run in result.systems:
        assert run.error is None, f"round {run.round}: {run.error}"
        throughput = run.phase("throughput", 100)
        assert throughput is not None and throughput.complete and throughput.deliveries_per_s
        rates.append(throughput.deliveries_per_s)
    assert "round 2 of 2" in said
    (medians,) = medians_at(result, 100)
    assert (medians.rounds, medians.counted) == (2, 2)
    assert medians.deliveries_per_s == statistics.median(rates)
    assert all(m.counted == 2 for m in medians.latency)

    document = json.loads(json.dumps(result_document(result)))
    assert [s["round"] for s in document["systems"]] == [1, 2]
    table = render(result)
    assert "(medians of 2 rounds)" in table and "exactly once" in table
    assert render(result_from_json(document)) == table
