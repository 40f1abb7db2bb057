"""The CI-sized fault campaign: every fault kind once, under traffic, then the full check by
the independent checker and by the Spark audit.

Real brokers (three of its own, so killing one disturbs no other test), real sidecars with
mutual TLS, toxiproxy (built by hack/fetch-toxiproxy) on every peer link and in front of
every broker. A few minutes; hack/chaos runs longer ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kdsync.chaos.campaign import MEMBERS, Campaign, CampaignSettings
from kdsync.chaos.schedule import ALL_KINDS, ScheduleSettings
from kdsync.chaos.toxiproxy import ToxiproxyError, find_binary
from kdsync.localkafka import KafkaDistribution

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SEED = 16


@pytest.fixture(scope="module")
def toxiproxy_built() -> None:
    try:
        find_binary()
    except ToxiproxyError as error:
        pytest.fail(str(error), pytrace=False)


def test_every_fault_kind_under_traffic_leaves_the_group_correct(
    kafka_distribution: KafkaDistribution, toxiproxy_built: None, tmp_path: Path
) -> None:
    schedule = ScheduleSettings(
        members=MEMBERS, faults=len(ALL_KINDS), min_hold_s=2.0, max_hold_s=5.0
    )
    campaign = Campaign(
        CampaignSettings(
            seed=SEED,
            faults=schedule.faults,
            run_dir=tmp_path,
            schedule=schedule,
            rate_per_origin=10.0,
        )
    )
    report = campaign.run(progress=print)
    print(report.summary())
    assert report.violations == [], "\n".join(report.violations)
    assert set(report.faults_by_kind) == {kind.value for kind in ALL_KINDS}
    assert all(outcome.recovery_s is not None for outcome in report.outcomes)
    assert report.events_written > 0
    assert report.events_checked == report.events_written
    assert report.audit == "passed", report.audit
